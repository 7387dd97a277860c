"""One response's audio path: optional resampling, then the wire encoder; all of it off the event loop."""

from __future__ import annotations

from typing import Any

import anyio.to_thread
import numpy as np
from omni_stream.realtime.stretch import time_stretch

from omni_stream import codecs

BIT_DEPTH = 16  # the PCM the encoders are fed


def audio_headers(sample_rate: int) -> dict[str, str]:
    """``X-Sample-Rate``, ``X-Channels``, ``X-Bit-Depth`` for every audio response."""
    return {"X-Sample-Rate": str(sample_rate), "X-Channels": "1", "X-Bit-Depth": str(BIT_DEPTH)}


class AudioOut:
    """Resample (when ``dst_rate`` differs) and encode float32 mono chunks into ``fmt`` bytes."""

    def __init__(self, fmt: str, src_rate: int, dst_rate: int | None = None, *, streaming: bool = True) -> None:
        self.format = fmt
        self.sample_rate = dst_rate or src_rate
        self._resampler: Any = codecs.Resampler(src_rate, self.sample_rate) if self.sample_rate != src_rate else None
        self._encoder: Any = codecs.open_encoder(fmt, self.sample_rate, 1, streaming=streaming)

    @classmethod
    async def open(cls, fmt: str, src_rate: int, dst_rate: int | None = None, *, streaming: bool = True) -> AudioOut:
        """Build off the loop (some encoders load codec libraries)."""
        return await anyio.to_thread.run_sync(lambda: cls(fmt, src_rate, dst_rate, streaming=streaming))

    @property
    def mime_type(self) -> str:
        return codecs.mime_type(self.format)

    def encode_sync(self, samples: np.ndarray) -> bytes:
        if self._resampler is not None:
            samples = self._resampler.process(samples)
        return self._encoder.encode(samples) if samples.size else b""

    def finish_sync(self) -> bytes:
        out = b""
        if self._resampler is not None:
            tail = self._resampler.flush()
            if tail.size:
                out += self._encoder.encode(tail)
        return out + self._encoder.flush()

    async def encode(self, samples: np.ndarray) -> bytes:
        return await anyio.to_thread.run_sync(self.encode_sync, samples)

    async def finish(self) -> bytes:
        return await anyio.to_thread.run_sync(self.finish_sync)


def encode_whole(
    fmt: str, samples: np.ndarray, src_rate: int, dst_rate: int | None = None, speed: float = 1.0
) -> tuple[bytes, int]:
    """A complete file (blocking: run it in a thread); returns the bytes and the output sample rate."""
    if speed != 1.0:
        samples = time_stretch(samples, speed, src_rate)
    out = AudioOut(fmt, src_rate, dst_rate, streaming=False)
    return out.encode_sync(samples) + out.finish_sync(), out.sample_rate
