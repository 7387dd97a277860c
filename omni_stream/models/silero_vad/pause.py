"""``SileroPauseDetector``: our Silero network behind fastrtc's ``PauseDetectionModel`` protocol.

fastrtc's ``ReplyOnPause(fn, model=...)`` calls ``model.vad((sample_rate, audio), options)`` on each window of
buffered input (0.6 s by default) and reads back ``(speech_seconds, chunks)``; ``warmup()`` runs once at start.
Its own default model downloads an old Silero from a hub; passing this one keeps everything offline. Each
call judges its window from a fresh network state (as fastrtc's own model does), so one instance serves every
connection and thread. Speech segments come from the wheel's own ``get_speech_timestamps_from_probs`` with
``options``' fields (fastrtc's ``SileroVadOptions`` has them; ``window_size_samples`` is ignored: Silero v5 and
later take 512-sample chunks). This module does not import fastrtc.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType
from typing import Protocol, TypedDict

import numpy as np
import torch

from omni_stream.codecs.resample import resample
from omni_stream.models.silero_vad.net import CHUNK, SAMPLE_RATE, SileroNet, SileroState, load_silero_net
from omni_stream.validation.audio import mono_float


class AudioChunk(TypedDict):
    """A speech segment in 16 kHz samples (fastrtc's ``AudioChunk``)."""

    start: int
    end: int


class PauseOptionsLike(Protocol):
    """The fields of fastrtc's ``SileroVadOptions`` this detector reads."""

    threshold: float
    min_speech_duration_ms: int
    max_speech_duration_s: float
    min_silence_duration_ms: int
    speech_pad_ms: int


@dataclass(slots=True, frozen=True)
class PauseOptions:
    """fastrtc's ``SileroVadOptions`` defaults (its ``ReplyOnPause`` passes None unless told otherwise)."""

    threshold: float = 0.5
    min_speech_duration_ms: int = 250
    max_speech_duration_s: float = math.inf
    min_silence_duration_ms: int = 2000
    speech_pad_ms: int = 400


def _silero_utils() -> ModuleType:
    threads = torch.get_num_threads()
    try:
        from silero_vad import utils_vad
    finally:
        torch.set_num_threads(threads)  # importing silero_vad sets one thread for the whole process
    return utils_vad


class SileroPauseDetector:
    """fastrtc ``PauseDetectionModel``: ``vad((sample_rate, audio), options)`` -> ``(speech_seconds, chunks)``."""

    def __init__(self, net: SileroNet | None = None) -> None:
        self._net = net or load_silero_net()
        self._segments = _silero_utils().get_speech_timestamps_from_probs

    def vad(self, audio: tuple[int, np.ndarray], options: PauseOptionsLike | None) -> tuple[float, list[AudioChunk]]:
        """Seconds of speech in ``audio`` (int16 or float32, ``(n,)``, ``(1, n)`` or ``(n, channels)``) and its
        segments in 16 kHz samples."""
        rate, samples = audio
        x = np.asarray(samples)
        if x.ndim == 2 and x.shape[0] == 1:  # fastrtc's frames are (1, n)
            x = x[0]
        x = mono_float(x)
        if rate != SAMPLE_RATE:
            x = resample(x, int(rate), SAMPLE_RATE)
        if x.size == 0:
            return 0.0, []
        n = -(-x.size // CHUNK)
        padded = np.zeros(n * CHUNK, np.float32)  # the last partial chunk is zero-padded, as silero does
        padded[: x.size] = x
        probs, _ = self._net.probabilities(torch.from_numpy(padded).reshape(n, CHUNK), SileroState.initial())
        opts = options if options is not None else PauseOptions()
        found = self._segments(
            probs.tolist(),
            sampling_rate=SAMPLE_RATE,
            threshold=opts.threshold,
            min_speech_duration_ms=opts.min_speech_duration_ms,
            max_speech_duration_s=opts.max_speech_duration_s,
            min_silence_duration_ms=opts.min_silence_duration_ms,
            speech_pad_ms=opts.speech_pad_ms,
            audio_length_samples=int(x.size),
        )
        chunks = [AudioChunk(start=int(s["start"]), end=int(s["end"])) for s in found]
        return sum(c["end"] - c["start"] for c in chunks) / SAMPLE_RATE, chunks

    def warmup(self) -> None:
        """One call on a second of silence (loads nothing more: the network is loaded already)."""
        self.vad((SAMPLE_RATE, np.zeros(SAMPLE_RATE, np.float32)), None)
