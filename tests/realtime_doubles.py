"""Deterministic stand-ins for the speech-input models of the realtime tests, implementing the engine's protocols.

- :class:`EnergyVad` (a ``VoiceActivityDetector``): a 20 ms window is speech when its RMS passes
  ``threshold / 10``; speech starts after ``MIN_SPEECH_MS`` of speech windows (reported at the first one) and
  stops after ``silence_duration_ms`` of silence (reported at the end of the last speech window).
- :class:`ToneAsrFamily` (a ``TranscriptionFamily``, ``model_type: test_tone_asr``): hears each voiced segment
  of the audio and names its dominant frequency in hundreds of hertz (a 300 Hz tone is "three"), so a test
  "says" words as tones and the synthetic LM echoes the transcript back.

Both look at their input and nothing else; the real ones (silero VAD, Whisper) plug into the same seams:
``Settings.vad_factory`` and the engine's transcription model.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import numpy as np

from omni_stream.chunks import Audio, TextDelta
from omni_stream.context import RequestContext
from omni_stream.family import LoadContext, ModelKind
from omni_stream.family_registry import register_family
from omni_stream.transcription.spec import TranscriptionInfo, TranscriptionRequest
from omni_stream.turns.vad import VadEvent, VadEventKind, VadParams

WINDOW_MS = 20
MIN_SPEECH_MS = 60
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")


class EnergyVad:
    """A ``VoiceActivityDetector`` on signal energy over fixed 20 ms windows (see the module docstring)."""

    instances: ClassVar[weakref.WeakSet[EnergyVad]] = weakref.WeakSet()

    def __init__(self, params: VadParams, sample_rate: int = 16000) -> None:
        self.params = params
        self._rate = sample_rate
        self._window = sample_rate * WINDOW_MS // 1000
        self.fed = 0  # samples fed since the last reset
        self.reset()
        EnergyVad.instances.add(self)

    @property
    def sample_rate(self) -> int:
        return self._rate

    def reset(self) -> None:
        self._pending = np.zeros(0, np.float32)
        self._pos = 0
        self._speaking = False
        self._run = 0
        self._run_start = 0
        self._silence = 0
        self._last_end = 0
        self.fed = 0

    def held(self) -> int:
        """Samples and turn state held (0 after a reset)."""
        return self._pending.size + int(self._speaking) + self._run

    def feed(self, samples: np.ndarray) -> list[VadEvent]:
        self.fed += samples.size
        x = np.concatenate((self._pending, samples.astype(np.float32, copy=False)))
        n = x.size // self._window
        events = []
        level = self.params.threshold / 10
        need = MIN_SPEECH_MS // WINDOW_MS
        for i in range(n):
            window = x[i * self._window : (i + 1) * self._window]
            speech = float(np.sqrt(np.mean(window.astype(np.float64) ** 2))) > level
            start = self._pos
            self._pos += self._window
            if not self._speaking:
                if not speech:
                    self._run = 0
                    continue
                if self._run == 0:
                    self._run_start = start
                self._run += 1
                self._last_end = start + self._window
                if self._run >= need:
                    self._speaking, self._silence = True, 0
                    events.append(VadEvent(VadEventKind.SPEECH_STARTED, self._run_start))
            elif speech:
                self._silence = 0
                self._last_end = start + self._window
            else:
                self._silence += self._window
                if self._silence * 1000 >= self.params.silence_duration_ms * self._rate:
                    events.append(VadEvent(VadEventKind.SPEECH_STOPPED, self._last_end))
                    self._speaking, self._run = False, 0
        self._pending = x[n * self._window :].copy()
        return events


def energy_vad(params: VadParams) -> EnergyVad:
    """``Settings.vad_factory`` for the tests."""
    return EnergyVad(params)


# --- ASR ------------------------------------------------------------------------------------------------------

ASR_TYPE = "test_tone_asr"


def hear(audio: np.ndarray, rate: int) -> list[str]:
    """The words of ``audio``: one per voiced segment (>= 60 ms, gaps >= 60 ms), named by its pitch."""
    window = rate * WINDOW_MS // 1000
    n = audio.size // window
    if not n:
        return []
    frames = audio[: n * window].astype(np.float64).reshape(n, window)
    voiced = np.sqrt((frames**2).mean(axis=1)) > 0.02
    words, start, gap = [], None, 0
    for i, v in enumerate([*voiced, False, False, False]):
        if v:
            start = i if start is None else start
            gap = 0
        elif start is not None:
            gap += 1
            if gap >= 3 or i >= n:
                end = i - gap + 1
                if end - start >= 3:
                    segment = audio[start * window : end * window]
                    spectrum = np.abs(np.fft.rfft(segment * np.hanning(segment.size)))
                    freq = float(np.argmax(spectrum)) * rate / segment.size
                    k = round(freq / 100)
                    words.append(WORDS[k] if 0 <= k < len(WORDS) else "hum")
                start, gap = None, 0
    return words


class ToneAsrFamily:
    """The test transcription family (see the module docstring); ``heard`` logs each request's transcript."""

    def __init__(self) -> None:
        self.info = TranscriptionInfo("tone-asr", ASR_TYPE, ModelKind.TRANSCRIPTION, sample_rate=16000)
        self.heard: list[str] = []

    def check_language(self, language: str | None) -> None:
        """Any language (it hears words by their tones)."""

    def transcription_stage(self, request: TranscriptionRequest, ctx: RequestContext) -> Any:
        async def transcription(ctx: RequestContext, upstream: AsyncIterator[Audio]) -> AsyncIterator[TextDelta]:
            if isinstance(request.audio, np.ndarray):
                audio = request.audio
            else:
                audio = np.concatenate([a.samples async for a in upstream] or [np.zeros(0, np.float32)])
            words = await anyio.to_thread.run_sync(hear, audio, request.sample_rate)
            usage = ctx.tokens(ModelKind.TRANSCRIPTION)
            usage.input_tokens = audio.size * 50 // request.sample_rate  # one audio token per 20 ms
            usage.output_tokens = len(words)
            self.heard.append(" ".join(words))
            for i, word in enumerate(words):
                yield TextDelta((" " if i else "") + word, i, final=i == len(words) - 1)
            if not words:
                yield TextDelta("", 0, final=True)

        return transcription

    async def aclose(self) -> None:
        """Nothing to free."""


def load_tone_asr(load: LoadContext) -> ToneAsrFamily:
    return ToneAsrFamily()


register_family(ASR_TYPE, load_tone_asr)


def write_tone_asr(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": ASR_TYPE}))
    return path


# --- "speech" for the tests -----------------------------------------------------------------------------------


def spoken_words(words: list[str], rate: int = 24000, lead_ms: int = 300, tail_ms: int = 900) -> np.ndarray:
    """Int16 audio that :func:`hear` transcribes as ``words``: 400 ms tones with 200 ms gaps, framed by silence."""
    parts = [np.zeros(rate * lead_ms // 1000)]
    t = np.arange(rate * 400 // 1000) / rate
    for i, word in enumerate(words):
        if i:
            parts.append(np.zeros(rate * 200 // 1000))
        parts.append(0.3 * np.sin(2 * np.pi * 100 * WORDS.index(word) * t))
    parts.append(np.zeros(rate * tail_ms // 1000))
    return np.rint(np.concatenate(parts) * 32767).astype(np.int16)
