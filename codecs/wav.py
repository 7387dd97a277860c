"""Raw PCM16 and WAV. Both hold nothing back: every ``encode`` returns its samples at once.

A streamed WAV starts with a 44-byte header whose RIFF and data sizes are ``0xFFFFFFFF`` (length unknown);
``streaming=False`` writes the real sizes.
"""

from __future__ import annotations

import struct

import numpy as np

from .base import Encoder
from .pcm import to_int16

WAV_HEADER_BYTES = 44
UNKNOWN_SIZE = 0xFFFFFFFF


def wav_header(sample_rate: int, channels: int, data_bytes: int | None = None) -> bytes:
    """44-byte PCM16 WAV header; ``data_bytes=None`` writes the streaming sizes ``0xFFFFFFFF``."""
    block = 2 * channels
    if data_bytes is None:
        riff = data = UNKNOWN_SIZE
    else:
        if data_bytes > UNKNOWN_SIZE - 36:
            raise ValueError(f"WAV data of {data_bytes} bytes does not fit a 32-bit RIFF size")
        riff, data = 36 + data_bytes, data_bytes
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        riff,
        b"WAVE",
        b"fmt ",
        16,
        1,  # WAVE_FORMAT_PCM
        channels,
        sample_rate,
        sample_rate * block,
        block,
        16,
        b"data",
        data,
    )


def pcm16_bytes(x: np.ndarray) -> bytes:
    """Interleaved little-endian int16 bytes of ``(n, channels)`` samples."""
    return to_int16(x).astype("<i2", copy=False).tobytes()


class PcmEncoder(Encoder):
    """Headerless PCM16 LE, interleaved."""

    format = "pcm"

    def _encode(self, x: np.ndarray) -> bytes:
        return pcm16_bytes(x)


class WavEncoder(Encoder):
    """PCM16 WAV; streamed with unknown sizes, or whole with exact sizes."""

    format = "wav"

    def __init__(self, sample_rate: int, channels: int = 1, *, streaming: bool = True) -> None:
        super().__init__(sample_rate, channels, streaming=streaming)
        self._header_sent = False

    def _encode(self, x: np.ndarray) -> bytes:
        return self._header() + pcm16_bytes(x)

    def _finish(self) -> bytes:
        return self._header()  # a stream of no samples is still a valid (empty) file

    def _header(self) -> bytes:
        if self._header_sent or not self.streaming:
            return b""
        self._header_sent = True
        return wav_header(self.sample_rate, self.channels)

    def _whole(self, data: bytes) -> bytes:
        return wav_header(self.sample_rate, self.channels, len(data)) + data
