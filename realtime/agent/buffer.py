"""A realtime session's input audio buffer: int16 chunks at 24 kHz, addressed by stream position."""

from __future__ import annotations

import numpy as np


class InputBuffer:
    """Int16 chunks at 24 kHz; ``start`` is the stream position (samples since the session began) of the first."""

    def __init__(self) -> None:
        self.chunks: list[np.ndarray] = []
        self.start = 0
        self.length = 0

    @property
    def end(self) -> int:
        return self.start + self.length

    def append(self, samples: np.ndarray) -> None:
        if samples.size:
            self.chunks.append(samples)
            self.length += samples.size

    def drop_before(self, position: int) -> None:
        """Forget the samples before stream ``position``."""
        cut = min(max(position - self.start, 0), self.length)
        if not cut:
            return
        whole = self.take(cut)
        del whole

    def peek(self, start: int, end: int) -> np.ndarray:
        """A copy of the samples between stream positions ``start`` and ``end`` (clipped to what is held)."""
        lo, hi = max(start - self.start, 0), min(end - self.start, self.length)
        if hi <= lo:
            return np.zeros(0, np.int16)
        return np.concatenate(self.chunks)[lo:hi].copy()

    def take(self, n: int) -> np.ndarray:
        """Remove and return the first ``n`` samples."""
        n = min(n, self.length)
        out, need = [], n
        while need:
            chunk = self.chunks[0]
            if chunk.size <= need:
                out.append(self.chunks.pop(0))
                need -= chunk.size
            else:
                out.append(chunk[:need])
                self.chunks[0] = chunk[need:]
                need = 0
        self.start += n
        self.length -= n
        return np.concatenate(out) if out else np.zeros(0, np.int16)

    def clear(self) -> None:
        self.drop_before(self.end)
