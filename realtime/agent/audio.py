"""Realtime wire audio both ways: client bytes -> PCM16 at 24 kHz, model samples -> client bytes.

A session keeps its input audio as int16 at :data:`RATE` (24 kHz, what ``audio/pcm`` carries), whatever the
wire format; G.711 (8 kHz) is resampled on the way in and out with a streaming resampler, so chunk joins never
click. These are CPU work that grows with the chunk: the session runs large ones off the event loop.
"""

from __future__ import annotations

import numpy as np

from omni_stream.codecs.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from omni_stream.codecs.pcm import to_int16
from omni_stream.codecs.resample import Resampler
from omni_stream.realtime.agent.events import AudioFormat, RealtimeError

RATE = 24000  # the session's internal rate, and audio/pcm's


class InputDecoder:
    """Wire bytes of one format -> int16 samples at 24 kHz (stateful across appends for G.711)."""

    def __init__(self, fmt: AudioFormat) -> None:
        self.format = fmt
        self._resampler = Resampler(fmt.rate, RATE) if fmt.rate != RATE else None

    def samples_for(self, n_bytes: int) -> int:
        """About how many 24 kHz samples ``n_bytes`` of wire audio make (for limits, before decoding)."""
        return n_bytes // self.format.bytes_per_sample * RATE // self.format.rate

    def check(self, data: bytes, param: str = "audio") -> None:
        if self.format is AudioFormat.PCM and len(data) % 2:
            message = "audio/pcm audio must hold whole 16-bit samples (an even byte count)"
            raise RealtimeError("invalid_value", message, param)

    def decode(self, data: bytes) -> np.ndarray:
        """int16 samples at 24 kHz (G.711: the resampler's look-ahead is held back until later appends)."""
        self.check(data)
        if self.format is AudioFormat.PCM:
            return np.frombuffer(data, dtype="<i2").astype(np.int16)
        codes = np.frombuffer(data, dtype=np.uint8)
        pcm8k = ulaw_decode(codes) if self.format is AudioFormat.PCMU else alaw_decode(codes)
        assert self._resampler is not None
        return to_int16(self._resampler.process(pcm8k))

    @property
    def held(self) -> int:
        """24 kHz samples :meth:`flush` would give (G.711: the resampler's look-ahead; PCM: none)."""
        return 0 if self._resampler is None else self._resampler.held

    def flush(self) -> np.ndarray:
        """The held-back tail (G.711); the decoder is finished afterwards."""
        if self._resampler is None:
            return np.zeros(0, np.int16)
        return to_int16(self._resampler.flush())


def decode_whole(data: bytes, fmt: AudioFormat) -> np.ndarray:
    """A whole clip (an item's audio) -> int16 at 24 kHz, the resampler's tail included."""
    decoder = InputDecoder(fmt)
    return np.concatenate((decoder.decode(data), decoder.flush()))


class OutputEncoder:
    """Float32 model audio at ``src_rate`` -> wire bytes of ``fmt`` (stateful resampling across chunks)."""

    def __init__(self, fmt: AudioFormat, src_rate: int) -> None:
        self.format = fmt
        self._resampler = Resampler(src_rate, fmt.rate) if src_rate != fmt.rate else None

    def encode(self, samples: np.ndarray, last: bool = False) -> bytes:
        """Wire bytes of the chunk; ``last`` flushes the resampler's held-back tail."""
        x = samples.astype(np.float32, copy=False)
        if self._resampler is not None:
            x = self._resampler.process(x)
            if last:
                x = np.concatenate((x, self._resampler.flush()))
        pcm = to_int16(x)
        if self.format is AudioFormat.PCM:
            return pcm.astype("<i2").tobytes()
        return (ulaw_encode(pcm) if self.format is AudioFormat.PCMU else alaw_encode(pcm)).tobytes()

    def needs_resampling(self) -> bool:
        return self._resampler is not None
