"""Streaming band-limited resampling on numpy: a Kaiser-windowed sinc evaluated at exact rational times.

Output sample ``k`` sits at input time ``k * src / dst``; it is the sum of the ``taps`` input samples around that
time weighted by a filter row chosen by its fractional position. The filter is centred (no delay): each output
waits for ``lookahead`` input samples past its time, which the resampler keeps across ``process`` calls together
with the history it needs. Every output is computed from the same samples in the same order whatever the chunking,
so streamed output equals one-shot output bit for bit and joins cannot click.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

# Zero crossings of the sinc on each side: 32 gives a transition band of about 8% of the lower rate.
ZERO_CROSSINGS = 32
# Passband edge as a fraction of the lower Nyquist frequency; Kaiser beta for about 80 dB stopband.
CUTOFF = 0.9
KAISER_BETA = 7.86
# Above this many distinct phases (odd rate pairs such as 44100 -> 23999) rows are interpolated from a table.
MAX_EXACT_PHASES = 1024
TABLE_PHASES = 512
MAX_RATE = 768_000
# Bounds the temporary (outputs x taps) matrix of one internal block.
_BLOCK_ELEMENTS = 1 << 18
# Rate pairs with at most this many phases (24 <-> 16, 8, 48 kHz: 1-3) filter each phase over a strided view of the
# input: no per-output copies of windows and rows, a third of a turn detector's feed time (24 -> 16 kHz per append)
MAX_STRIDED_PHASES = 16


@cache
def _design(up: int, down: int) -> tuple[np.ndarray, int, bool]:
    """Filter rows ``(phases [+1], taps)``, the half width in input samples, and whether rows are interpolated."""
    cutoff = CUTOFF * min(1.0, up / down)  # in cycles per input sample times two
    half = math.ceil(ZERO_CROSSINGS / cutoff)
    exact = up <= MAX_EXACT_PHASES
    phases = up if exact else TABLE_PHASES
    frac = np.arange(phases + (0 if exact else 1), dtype=np.float64)[:, None] / phases
    # Row p, tap j weighs input base - half + 1 + j for an output at base + frac.
    t = frac + (half - 1) - np.arange(2 * half, dtype=np.float64)[None, :]
    window = np.i0(KAISER_BETA * np.sqrt(np.clip(1.0 - (t / half) ** 2, 0.0, 1.0))) / np.i0(KAISER_BETA)
    rows = cutoff * np.sinc(cutoff * t) * window
    rows /= rows.sum(axis=1, keepdims=True)  # unity DC gain at every phase
    return rows.astype(np.float32), half, not exact


class Resampler:
    """Stateful resampler from ``src_rate`` to ``dst_rate`` Hz; chunks are float32 ``(n,)`` or ``(n, channels)``."""

    def __init__(self, src_rate: int, dst_rate: int, channels: int = 1) -> None:
        for name, rate in (("src_rate", src_rate), ("dst_rate", dst_rate)):
            if not isinstance(rate, int | np.integer) or not 0 < rate <= MAX_RATE:
                raise ValueError(f"{name} must be an integer in 1..{MAX_RATE} Hz, got {rate!r}")
        if channels < 1:
            raise ValueError(f"channels must be >= 1, got {channels}")
        self.src_rate = int(src_rate)
        self.dst_rate = int(dst_rate)
        self.channels = channels
        g = math.gcd(self.src_rate, self.dst_rate)
        self._up, self._down = self.dst_rate // g, self.src_rate // g
        self._passthrough = self._up == self._down
        if self._passthrough:
            self._rows, self._half, self._interp = np.zeros((1, 0), dtype=np.float32), 0, False
        else:
            self._rows, self._half, self._interp = _design(self._up, self._down)
        # Buffer column 0 holds absolute input index self._start; the stream is zero before index 0.
        self._buf = np.zeros((channels, max(self._half - 1, 0)), dtype=np.float32)
        self._start = -(self._half - 1) if self._half else 0
        self._n_in = 0
        self._k = 0  # next output index
        self._flushed = False

    @property
    def lookahead(self) -> int:
        """Input samples an output waits for past its own time (the only latency added), in input samples."""
        return self._half

    @property
    def held(self) -> int:
        """Output samples :meth:`flush` would still give: the look-ahead held back so far."""
        if self._flushed or self._passthrough:
            return 0
        return max(0, -(-self._n_in * self._up // self._down) - self._k)

    def process(self, chunk: np.ndarray) -> np.ndarray:
        """Resample one chunk; returns every output sample whose inputs have all arrived (float32)."""
        if self._flushed:
            raise ValueError("Cannot call process() after flush()")
        x = self._as_planar(chunk)
        self._n_in += x.shape[1]
        if self._passthrough:
            return self._shape_out(x)
        self._buf = np.concatenate((self._buf, x), axis=1) if x.shape[1] else self._buf
        return self._shape_out(self._emit(self._k_end(self._n_in)))

    def process_pieces(self, pieces: Sequence[np.ndarray]) -> list[np.ndarray]:
        """What ``process`` gives each of consecutive ``pieces``, from one pass over them all: which outputs a piece
        completes depends only on how many inputs have arrived, never on how they were cut."""
        if len(pieces) < 2:
            return [self.process(piece) for piece in pieces]
        first = self._n_in if self._passthrough else self._k  # outputs given so far (a passthrough gives its inputs)
        arrived, ends = self._n_in, []
        for piece in pieces:
            arrived += np.asarray(piece).shape[0]
            ends.append(max(first, arrived if self._passthrough else self._k_end(arrived)) - first)
        whole = self.process(np.concatenate(pieces))
        return np.split(whole, ends[:-1])

    def _k_end(self, n_in: int) -> int:
        """Outputs complete once ``n_in`` inputs have arrived: output k needs inputs up to floor(k * down / up) +
        half."""
        avail = n_in - self._half
        return -(-avail * self._up // self._down) if avail > 0 else 0

    def flush(self) -> np.ndarray:
        """Emit the tail (the stream is treated as zero after its end); the resampler is finished afterwards."""
        if self._flushed:
            return self._shape_out(np.zeros((self.channels, 0), dtype=np.float32))
        self._flushed = True
        if self._passthrough:
            return self._shape_out(np.zeros((self.channels, 0), dtype=np.float32))
        self._buf = np.concatenate((self._buf, np.zeros((self.channels, self._half), dtype=np.float32)), axis=1)
        k_end = -(-self._n_in * self._up // self._down)
        return self._shape_out(self._emit(k_end))

    def _emit(self, k_end: int) -> np.ndarray:
        if k_end <= self._k:
            return np.zeros((self.channels, 0), dtype=np.float32)
        taps = 2 * self._half
        windows = sliding_window_view(self._buf, taps, axis=1)
        # The method depends on the rate pair only, so every output of a stream is computed the same way.
        if self._up <= MAX_STRIDED_PHASES:
            out = self._emit_by_phase(windows, k_end)
        else:
            out = self._emit_gathered(windows, k_end)
        self._k = max(self._k, k_end)
        # Drop history no later output can reach.
        keep_from = (self._k * self._down) // self._up - self._half + 1
        drop = keep_from - self._start
        if drop > 0:
            self._buf = self._buf[:, drop:].copy()
            self._start = keep_from
        return out

    def _emit_by_phase(self, windows: np.ndarray, k_end: int) -> np.ndarray:
        """Outputs ``self._k`` .. ``k_end`` of an exact design: the outputs of one phase (every ``up``-th) read input
        windows ``down`` samples apart, a strided view, so each phase is one pass of its filter row over that view
        (no gathered copies of windows or rows). Every output is the same row over the same window, however the
        stream was cut."""
        up, down, k0 = self._up, self._down, self._k
        out = np.empty((self.channels, k_end - k0), dtype=np.float32)
        for first in range(k0, min(k0 + up, k_end)):
            num = first * down
            start = num // up - self._half + 1 - self._start
            count = -(-(k_end - first) // up)
            view = windows[:, start : start + down * (count - 1) + 1 : down]
            out[:, first - k0 :: up] = np.einsum("cnt,t->cn", view, self._rows[num % up])
        return out

    def _emit_gathered(self, windows: np.ndarray, k_end: int) -> np.ndarray:
        """Outputs ``self._k`` .. ``k_end`` in blocks, each output's window and row gathered (many phases: a pass per
        phase would be a call per few outputs)."""
        block = max(1, _BLOCK_ELEMENTS // windows.shape[-1])
        parts = []
        for k0 in range(self._k, k_end, block):
            k = np.arange(k0, min(k0 + block, k_end), dtype=np.int64)
            num = k * self._down
            base = num // self._up
            rows = self._phase_rows(num % self._up)
            parts.append(np.einsum("cnt,nt->cn", windows[:, base - self._half + 1 - self._start], rows))
        return np.concatenate(parts, axis=1)

    def _phase_rows(self, phase: np.ndarray) -> np.ndarray:
        if not self._interp:
            return self._rows[phase]
        pos = phase.astype(np.float64) * (TABLE_PHASES / self._up)
        i = np.minimum(pos.astype(np.int64), TABLE_PHASES - 1)
        a = (pos - i).astype(np.float32)[:, None]
        return self._rows[i] * (1 - a) + self._rows[i + 1] * a

    def _as_planar(self, chunk: np.ndarray) -> np.ndarray:
        x = np.asarray(chunk)
        if x.dtype == np.int16:
            x = x.astype(np.float32) / 32768.0
        x = x.astype(np.float32, copy=False)
        if x.ndim == 1 and self.channels == 1:
            return x[None, :]
        if x.ndim == 2 and x.shape[1] == self.channels:
            return np.ascontiguousarray(x.T)
        raise ValueError(f"expected shape (n,) or (n, {self.channels}), got {x.shape}")

    def _shape_out(self, y: np.ndarray) -> np.ndarray:
        return y[0].copy() if self.channels == 1 else np.ascontiguousarray(y.T)


def resample(x: np.ndarray, src_rate: int, dst_rate: int) -> np.ndarray:
    """One-shot resampling of a whole signal (same filter as ``Resampler``); float32 out."""
    channels = 1 if np.ndim(x) == 1 else np.shape(x)[1]
    r = Resampler(src_rate, dst_rate, channels)
    head = r.process(x)
    return np.concatenate((head, r.flush()), axis=0)
