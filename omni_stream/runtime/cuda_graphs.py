"""CUDA graphs of a step function, one per shape bucket, sharing one memory pool (nano-vllm style).

The step function reads and writes only static tensors (its owner's slot-indexed state), so a graph is
replayed after the owner has filled those tensors, and outputs are read from them afterwards. Buckets are
captured largest first so the shared pool is sized once by the largest graph and the smaller ones reuse it.
Replay picks the smallest bucket that fits; shapes outside every bucket run eagerly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from omni_stream.runtime.load_display import ProgressFactory

log = logging.getLogger(__name__)


@contextmanager
def idle_rows(active: torch.Tensor) -> Iterator[None]:
    """Every row of the boolean ``active`` mask off for the block, then as it was (capturing a step needs no
    running sequence: idle rows compute along and their results are dropped)."""
    saved = active.clone()
    active.zero_()
    try:
        yield
    finally:
        active.copy_(saved)


def batch_buckets(max_batch: int, *, fine: bool = False) -> tuple[int, ...]:
    """Powers of two below ``max_batch``, then ``max_batch``: ``8 -> (1, 2, 4, 8)``, ``12 -> (1, 2, 4, 8, 12)``.

    ``fine``: three times the powers of two too (``32 -> (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)``), so a batch pads by a
    third at most instead of nearly half: for a model whose every row is heavy work at any batch (Whisper's encoder
    over a 30 s window: ~10 ms of the H200 per utterance), the padding is work as costly as the rows'."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    out = []
    b = 1
    while b < max_batch:
        out.append(b)
        if fine and b >= 2 and b * 3 // 2 < max_batch:
            out.append(b * 3 // 2)
        b *= 2
    out.append(max_batch)
    return tuple(out)


def length_buckets(max_len: int, smallest: int = 512) -> tuple[int, ...]:
    """Attention spans: ``smallest`` doubling, capped by (and ending at) ``max_len``."""
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    out = []
    n = min(smallest, max_len)
    while n < max_len:
        out.append(n)
        n *= 2
    out.append(max_len)
    return tuple(out)


def pick(buckets: Sequence[int], n: int) -> int | None:
    """The smallest bucket ``>= n`` (``buckets`` ascending), or None when ``n`` exceeds them all."""
    for b in buckets:
        if b >= n:
            return b
    return None


class GraphSet:
    """Graphs of ``fn(*key)`` keyed by shape tuples; ``fn`` must touch static tensors only and never sync."""

    def __init__(self, fn: Callable[..., Any], device: torch.device | str) -> None:
        self.fn = fn
        self.device = torch.device(device)
        self.graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}
        self.capture_seconds = 0.0
        self._pool: Any = None
        self._stream: torch.cuda.Stream | None = None

    def __contains__(self, key: Hashable) -> bool:
        return key in self.graphs

    def __len__(self) -> int:
        return len(self.graphs)

    def capture(self, key: tuple[Any, ...]) -> None:
        """Warm ``fn(*key)`` up on a side stream, then record it into the shared pool."""
        t0 = time.perf_counter()
        if self._stream is None:
            # One side stream for every warm-up and capture: the caching allocator keys free blocks by stream,
            # so graphs captured on one stream share the pool's blocks instead of each holding its own.
            self._stream = torch.cuda.Stream(self.device)
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        # Lazy initialisations (cuBLAS handles and workspaces, attention plans per shape) must run outside capture.
        with torch.cuda.stream(stream):
            self.fn(*key)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA calls of other threads (host-side copies) must not invalidate this capture.
        with torch.cuda.graph(graph, pool=self._pool, stream=stream, capture_error_mode="thread_local"):
            self.fn(*key)
        if self._pool is None:
            self._pool = graph.pool()
        self.graphs[key] = graph
        torch.cuda.synchronize(self.device)
        self.capture_seconds += time.perf_counter() - t0

    def capture_all(
        self,
        keys: Iterable[tuple[Any, ...]],
        *,
        progress: ProgressFactory | None = None,
        desc: str = "capturing CUDA graphs",
    ) -> float:
        """Capture ``keys`` largest first (descending tuples); returns the seconds it took."""
        ordered = sorted(set(keys), key=lambda k: tuple(-x for x in k))
        t0 = time.perf_counter()
        bar = progress(total=len(ordered), desc=desc, unit="graph") if progress is not None else None
        try:
            for key in ordered:
                self.capture(key)
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        seconds = time.perf_counter() - t0
        log.info("captured %d CUDA graphs in %.2f s", len(ordered), seconds)
        return seconds

    def replay(self, key: Hashable) -> bool:
        """Replay the graph for ``key``; False when none was captured."""
        graph = self.graphs.get(key)
        if graph is None:
            return False
        graph.replay()
        return True

    def clear(self) -> None:
        """Drop every graph (static buffers were reallocated); the pool goes with the last graph."""
        self.graphs.clear()
        self._pool = None
