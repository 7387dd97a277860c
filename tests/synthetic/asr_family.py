"""Synthetic ASR (``model_type: synthetic_asr``): a deterministic "transcriber" of tones, for tests only.

It hears what the synthetic TTS speaks: each voiced segment of the utterance (samples at least ``level`` loud,
segments split by ``gap_ms`` of quiet) becomes the words ``"<pitch> hz <duration> ms"``, the pitch the segment's
spectral peak rounded to 10 Hz, the duration from its first to its last loud sample rounded to 10 ms; no voiced
audio reads ``"silence"``. So synthetic voice ``alice`` (220 Hz) saying 10 characters (5 frames of 80 ms) comes
back as ``"220 hz 400 ms"``. It runs on the shared batch scheduler like a real ASR model: the step that admits a
request analyses its audio (its "encoder"), then every step emits one word of every running request, the last
one ``final``. ``fail_hz`` makes a segment of that pitch fail its request in the model step (a transcription
failure on purpose). With ``record=True`` the model logs ``("step", prefill_ids, decode_ids)`` and
``("release", seq_id)``; ``step_cost_ms`` emulates device time.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from omni_stream.batch_model import Batch, SeqOutput
from omni_stream.chunks import Audio, TextDelta
from omni_stream.context import RequestContext
from omni_stream.errors import ConfigError, InvalidRequestError
from omni_stream.family import LoadContext, ModelKind
from omni_stream.metrics import EngineMetrics
from omni_stream.pipeline import Stage
from omni_stream.runtime.step_record import StepRecord
from omni_stream.scheduler import Scheduler
from omni_stream.transcription.spec import Task, TranscriptionInfo, TranscriptionRequest
from omni_stream.transcription.stage import batched_transcription_stage, check_samples
from omni_stream.worker import DeviceWorker
from synthetic.config import check_keys, write_config

MODEL_TYPE = "synthetic_asr"


class SyntheticASRFault(RuntimeError):
    """Raised on purpose for a segment at the configured ``fail_hz``."""


@dataclass(slots=True, frozen=True)
class SyntheticASRConfig:
    """``sample_rate`` Hz it listens at; ``level`` (linear) and ``gap_ms`` define voiced segments; costs in ms."""

    model_type: str = MODEL_TYPE
    model_name: str = "synthetic-asr"
    sample_rate: int = 16000
    max_seconds: float = 30.0
    level: float = 0.02
    gap_ms: float = 50.0
    step_cost_ms: float = 0.0
    fail_hz: float | None = None

    def __post_init__(self) -> None:
        if self.model_type != MODEL_TYPE:
            raise ConfigError(f"model_type must be {MODEL_TYPE!r}, got {self.model_type!r}")
        if self.sample_rate <= 0 or self.max_seconds <= 0 or self.level <= 0:
            raise ConfigError("sample_rate, max_seconds and level must be positive")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SyntheticASRConfig:
        check_keys(cls, data, MODEL_TYPE)
        return cls(**data)


def write_asr_checkpoint(path: str | Path, **options: Any) -> Path:
    """Write a synthetic ASR checkpoint (``config.json``) into ``path``; ``options`` override config fields."""
    return write_config(path, asdict(SyntheticASRConfig.from_dict(options)))


@dataclass(slots=True, frozen=True)
class Segment:
    """A voiced stretch: ``hz`` (spectral peak, rounded to 10 Hz) and ``ms`` (duration, rounded to 10 ms)."""

    hz: int
    ms: int


def segments(samples: np.ndarray, sample_rate: int, level: float = 0.02, gap_ms: float = 50.0) -> list[Segment]:
    """The voiced segments of ``samples`` (see module docstring)."""
    loud = np.flatnonzero(np.abs(samples) >= level)
    if loud.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(loud) > gap_ms * sample_rate / 1000)
    found = []
    for first, last in zip(np.r_[loud[0], loud[breaks + 1]], np.r_[loud[breaks], loud[-1]], strict=True):
        piece = samples[first : last + 1].astype(np.float64)
        spectrum = np.abs(np.fft.rfft(piece * np.hanning(piece.size))) if piece.size > 1 else np.zeros(1)
        peak = float(np.argmax(spectrum)) * sample_rate / max(piece.size, 1)
        found.append(Segment(int(round(peak / 10) * 10), int(round((last + 1 - first) / sample_rate * 100) * 10)))
    return found


def transcript_words(found: list[Segment]) -> tuple[str, ...]:
    """The words of a transcript, each after its separating space: ``("220", " hz", " 400", " ms")``."""
    words = [w for seg in found for w in (str(seg.hz), "hz", str(seg.ms), "ms")] or ["silence"]
    return (words[0], *(" " + w for w in words[1:]))


@dataclass(slots=True, frozen=True)
class ASRInput:
    """One utterance at the model's rate and the token budget."""

    samples: np.ndarray
    max_tokens: int | None = None


@dataclass(slots=True)
class _Row:
    words: tuple[str, ...]
    reason: str  # finish_reason of the last word: "stop", or "length" when max_tokens cut the transcript
    emitted: int = 0


class SyntheticASR(StepRecord):
    """A BatchModel: admission analyses the audio, then each step emits the next word of every row."""

    def __init__(self, config: SyntheticASRConfig, max_batch_size: int = 32, *, record: bool = False) -> None:
        self.config = config
        self._max_batch_size = max_batch_size
        super().__init__(record=record)
        self.step_cost_s = config.step_cost_ms / 1000.0

    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size

    def step(self, batch: Batch) -> list[SeqOutput]:
        self.record_step(batch)
        cfg = self.config
        outputs = []
        for seq in batch.prefill:
            payload: ASRInput = seq.payload
            found = segments(payload.samples, cfg.sample_rate, cfg.level, cfg.gap_ms)
            self.live.add(seq.seq_id)
            if cfg.fail_hz is not None and any(abs(s.hz - cfg.fail_hz) <= 5 for s in found):
                outputs.append(
                    SeqOutput(seq.seq_id, error=SyntheticASRFault(f"synthetic ASR fails at {cfg.fail_hz} Hz"))
                )
                seq.model_state = None
            else:
                words = transcript_words(found)
                cut = payload.max_tokens is not None and payload.max_tokens < len(words)
                seq.model_state = _Row(words[: payload.max_tokens] if cut else words, "length" if cut else "stop")
        if self.step_cost_s > 0:
            time.sleep(self.step_cost_s)
        for seq in (*batch.prefill, *batch.decode):
            if seq.model_state is None:
                continue
            row: _Row = seq.model_state
            k, row.emitted = row.emitted, row.emitted + 1
            final = row.emitted >= len(row.words)
            delta = TextDelta(row.words[k], k, final=final, finish_reason=row.reason if final else None)
            outputs.append(SeqOutput(seq.seq_id, delta, final))
        return outputs


class SyntheticASRFamily:
    """A loaded synthetic ASR checkpoint; ``model`` and ``scheduler`` are public for tests."""

    def __init__(
        self,
        config: SyntheticASRConfig,
        worker: DeviceWorker,
        *,
        max_batch_size: int = 32,
        max_buffered_tokens: int = 32,
        metrics: EngineMetrics | None = None,
        record: bool = False,
    ) -> None:
        self.config = config
        self.model = SyntheticASR(config, max_batch_size, record=record)
        self.scheduler = Scheduler(
            self.model,
            worker,
            high_watermark=max_buffered_tokens,
            metrics=metrics.scheduler("transcription") if metrics is not None else None,
            name="transcription",
        )
        self.info = TranscriptionInfo(
            config.model_name,
            config.model_type,
            ModelKind.TRANSCRIPTION,
            sample_rate=config.sample_rate,
            max_seconds=config.max_seconds,
        )

    def check_language(self, language: str | None) -> None:
        """Any language (the tones have none)."""

    def transcription_stage(self, request: TranscriptionRequest, ctx: RequestContext) -> Stage[Audio, TextDelta]:
        """Any ``language`` is accepted (the tones have none); ``prompt`` is ignored; translation is refused."""
        if request.task is Task.TRANSLATE:
            raise InvalidRequestError(f"{self.info.model_name} does not translate", "model")
        check_samples(request, self.config.max_seconds)

        async def prepare(ctx: RequestContext, samples: np.ndarray) -> ASRInput:
            ctx.tokens(ModelKind.TRANSCRIPTION).input_tokens = math.ceil(samples.size / self.config.sample_rate * 50)
            return ASRInput(samples, request.max_tokens)

        return batched_transcription_stage(
            self.scheduler, request, prepare, sample_rate=self.config.sample_rate, max_seconds=self.config.max_seconds
        )

    async def aclose(self) -> None:
        """Nothing to free beyond the scheduler, which the engine's worker shuts down."""


def load_family(load: LoadContext) -> SyntheticASRFamily:
    """Family loader for ``model_type: synthetic_asr`` (runs off the event loop)."""
    return SyntheticASRFamily(
        SyntheticASRConfig.from_dict(load.config),
        load.worker,
        max_batch_size=load.options.max_batch_size,
        max_buffered_tokens=load.options.max_buffered_frames,
        metrics=load.metrics,
    )
