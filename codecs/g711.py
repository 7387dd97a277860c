"""G.711 mu-law and a-law (8 kHz telephony) on numpy lookup tables.

The tables follow the ITU-T G.711 segment coding as in the classic Sun reference code (and CPython's audioop):
mu-law codes the top 14 bits of a 16-bit sample, a-law the top 13. Input at other rates is resampled to 8 kHz,
which adds the resampler's look-ahead to the hold-back; at 8 kHz nothing is held back.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from .base import Encoder
from .pcm import to_int16

_SEG_UEND = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
_SEG_AEND = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])
_ULAW_BIAS = 0x84
_ULAW_CLIP = 8159


def _all_int16() -> np.ndarray:
    # Indexed by the sample's bit pattern, so encoding is table[x.view(uint16)].
    return np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.int16).astype(np.int32)


@cache
def _ulaw_table() -> np.ndarray:
    v = _all_int16() >> 2
    mask = np.where(v < 0, 0x7F, 0xFF)
    v = np.minimum(np.abs(v), _ULAW_CLIP) + (_ULAW_BIAS >> 2)
    seg = np.searchsorted(_SEG_UEND, v)
    code = np.where(seg >= 8, 0x7F, (seg << 4) | ((v >> np.minimum(seg + 1, 8)) & 0xF))
    return (code ^ mask).astype(np.uint8)


@cache
def _alaw_table() -> np.ndarray:
    v = _all_int16() >> 3
    mask = np.where(v >= 0, 0xD5, 0x55)
    v = np.where(v >= 0, v, -v - 1)
    seg = np.searchsorted(_SEG_AEND, v)
    mantissa = np.where(seg < 2, v >> 1, v >> np.clip(seg, 1, 8)) & 0xF
    code = np.where(seg >= 8, 0x7F, (seg << 4) | mantissa)
    return (code ^ mask).astype(np.uint8)


@cache
def _ulaw_decode_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((u & 0x0F) << 3) + _ULAW_BIAS) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, _ULAW_BIAS - t, t - _ULAW_BIAS).astype(np.int16)


@cache
def _alaw_decode_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    t = (a & 0x0F) << 4
    seg = (a & 0x70) >> 4
    t = np.where(seg == 0, t + 8, np.where(seg == 1, t + 0x108, (t + 0x108) << np.maximum(seg - 1, 0)))
    return np.where(a & 0x80, t, -t).astype(np.int16)


def ulaw_encode(x: np.ndarray) -> np.ndarray:
    """int16 samples -> mu-law bytes (uint8)."""
    return _ulaw_table()[np.asarray(x, dtype=np.int16).view(np.uint16)]


def alaw_encode(x: np.ndarray) -> np.ndarray:
    """int16 samples -> a-law bytes (uint8)."""
    return _alaw_table()[np.asarray(x, dtype=np.int16).view(np.uint16)]


def ulaw_decode(codes: np.ndarray | bytes) -> np.ndarray:
    """mu-law bytes -> int16 samples."""
    return _ulaw_decode_table()[np.frombuffer(codes, dtype=np.uint8) if isinstance(codes, bytes) else codes]


def alaw_decode(codes: np.ndarray | bytes) -> np.ndarray:
    """a-law bytes -> int16 samples."""
    return _alaw_decode_table()[np.frombuffer(codes, dtype=np.uint8) if isinstance(codes, bytes) else codes]


class MulawEncoder(Encoder):
    """Headerless 8 kHz mu-law, one byte per sample, interleaved."""

    format = "mulaw"

    def _encode(self, x: np.ndarray) -> bytes:
        return ulaw_encode(to_int16(x)).tobytes()


class AlawEncoder(Encoder):
    """Headerless 8 kHz a-law, one byte per sample, interleaved."""

    format = "alaw"

    def _encode(self, x: np.ndarray) -> bytes:
        return alaw_encode(to_int16(x)).tobytes()
