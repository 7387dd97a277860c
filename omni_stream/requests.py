"""Request types, sampling parameters and the per-request context (deadline, cancellation, timings)."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from omni_stream.errors import InvalidRequestError
from omni_stream.speech_limits import check_instructions, check_max_new_tokens, check_text

_ids = itertools.count(1)


def next_request_id(prefix: str = "req") -> str:
    """Process-unique, deterministic-order request id."""
    return f"{prefix}-{next(_ids)}"


class TaskType(StrEnum):
    CUSTOM_VOICE = "CustomVoice"
    VOICE_DESIGN = "VoiceDesign"
    BASE = "Base"


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """Sampling for one AR head. ``do_sample=False`` is greedy. ``top_k=0`` and ``top_p=1.0`` disable those filters."""

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise InvalidRequestError(f"temperature must be > 0, got {self.temperature}", "temperature")
        if self.top_k < 0:
            raise InvalidRequestError(f"top_k must be >= 0, got {self.top_k}", "top_k")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if self.repetition_penalty <= 0:
            raise InvalidRequestError(
                f"repetition_penalty must be > 0, got {self.repetition_penalty}", "repetition_penalty"
            )


GREEDY = SamplingParams(do_sample=False, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0)


@dataclass(slots=True, frozen=True)
class VoicePrompt:
    """A reusable cloning prompt extracted once per voice (Base models).

    ``x_vector`` is the speaker embedding (float32 ``[hidden]``); ``ref_codes`` the reference audio's codec
    codes (int64 ``[n_frames, n_codebooks]``) or None for x-vector-only cloning; ``ref_text`` its transcript.
    """

    x_vector: np.ndarray
    ref_codes: np.ndarray | None = None
    ref_text: str | None = None


@dataclass(slots=True, frozen=True)
class SpeechRequest:
    """One text-to-speech request, as the Python API, HTTP and WebSocket layers all build it.

    Units: ``max_new_tokens`` in codec frames (80 ms each for 12 Hz models; None: the frame budget of the
    text, :func:`omni_stream.speech_limits.frame_budget`); ``ref_audio`` float32 mono at ``ref_sample_rate`` Hz;
    ``initial_codec_chunk_frames`` frames in the first audio chunk (None = model default). ``voice`` None: the
    model's default voice. ``non_streaming_mode`` (None: the model's default) picks the prompt layout where
    the family has two (Qwen3-TTS: all text in the prefill, or one text token per step); families with one
    refuse it. Bounds: :mod:`omni_stream.speech_limits`.
    """

    text: str
    voice: str | None = None
    task_type: TaskType | None = None  # None: the checkpoint's own task
    language: str = "Auto"
    instructions: str | None = None
    # Cloning (Base): either raw reference audio, or a prompt extracted earlier (uploaded voices).
    ref_audio: np.ndarray | None = None
    ref_sample_rate: int = 24000
    ref_text: str | None = None
    x_vector_only_mode: bool = False
    voice_prompt: VoicePrompt | None = None
    # Generation. Sampling None: the checkpoint's own defaults (generation_config.json).
    max_new_tokens: int | None = None
    sampling: SamplingParams | None = None
    subtalker_sampling: SamplingParams | None = None
    seed: int | None = None
    non_streaming_mode: bool | None = None
    # Streaming
    initial_codec_chunk_frames: int | None = None
    # Benchmarks only: never stop on EOS, always generate max_new_tokens frames.
    ignore_eos: bool = False
    request_id: str = field(default_factory=next_request_id)

    def __post_init__(self) -> None:
        check_text(self.text)
        check_instructions(self.instructions)
        check_max_new_tokens(self.max_new_tokens)
        if self.initial_codec_chunk_frames is not None and self.initial_codec_chunk_frames < 1:
            raise InvalidRequestError(
                f"initial_codec_chunk_frames must be >= 1, got {self.initial_codec_chunk_frames}",
                "initial_codec_chunk_frames",
            )


@dataclass(slots=True)
class Timings:
    """Per-request timing record, monotonic seconds (``time.perf_counter``)."""

    created: float = field(default_factory=time.perf_counter)
    admitted: float | None = None
    first_chunk: float | None = None
    finished: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    chunk_durations: list[float] = field(default_factory=list)  # seconds of audio per chunk
    steps: int = 0

    def record_chunk(self, audio_seconds: float, now: float | None = None) -> None:
        now = time.perf_counter() if now is None else now
        if self.first_chunk is None:
            self.first_chunk = now
        self.chunk_times.append(now)
        self.chunk_durations.append(audio_seconds)

    @property
    def ttfa(self) -> float | None:
        """Seconds from creation to the first chunk."""
        return None if self.first_chunk is None else self.first_chunk - self.created

    @property
    def audio_seconds(self) -> float:
        return float(sum(self.chunk_durations))


class RequestState(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    PAUSED = "paused"
    FINISHED = "finished"
    ABORTED = "aborted"
