"""Streaming codec windows over slot-indexed decoder states, replayed as CUDA graphs per (batch, window) bucket.

Each streaming request holds one row of a :class:`CodecStatePool` for its lifetime. A window job gathers
the rows of its requests, decodes, and scatters the new states back; on CUDA that whole job is one graph
per (batch bucket, window frames), with static slot and code buffers (padding rows point at a scratch row),
so a 2-frame first window costs one replay instead of hundreds of eager launches. Windows of other sizes
(an utterance's short last window, ICL priming) run the same pool step eagerly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from omni_stream.models.qwen3_tts.codec import CodecDecoder
from omni_stream.models.qwen3_tts.codec_stream import CodecStatePool
from omni_stream.runtime.cuda_graphs import GraphSet, batch_buckets, pick

DEFAULT_WINDOWS = (1, 2, 4, 8, 16, 25)


class CodecWindows:
    """``capacity`` streaming codec states; :meth:`decode` is the batched worker job (see module docstring)."""

    def __init__(
        self,
        decoder: CodecDecoder,
        capacity: int,
        *,
        graphs: bool | None = None,
        windows: Sequence[int] = DEFAULT_WINDOWS,
        max_batch: int | None = None,
    ) -> None:
        """``graphs``: None = on CUDA; ``max_batch``: largest graph batch (default ``capacity``)."""
        self.decoder = decoder
        self.capacity = capacity
        self.scratch = capacity  # the pool's last row: padding rows of a graph batch read and write it
        self.pool = CodecStatePool(decoder, capacity + 1)
        self.device = self.pool.buffers[next(iter(self.pool.buffers))].device
        self.q = decoder.cfg.num_quantizers
        self._free = list(range(capacity - 1, -1, -1))
        self._lock = threading.Lock()
        self.use_graphs = self.device.type == "cuda" if graphs is None else graphs
        self.windows = tuple(sorted(windows))
        self.batch_buckets = batch_buckets(max_batch or capacity)
        self._codes: dict[tuple[int, int], torch.Tensor] = {}
        self._slots: dict[int, torch.Tensor] = {}
        self._out: dict[tuple[int, int], torch.Tensor] = {}
        self.graphs = GraphSet(self._graph_step, self.device) if self.use_graphs else None
        self.graph_jobs = 0
        self.eager_jobs = 0

    # -- slots (event loop) ------------------------------------------------------------------------------------

    def acquire(self) -> int | None:
        """A free state row, or None when all are taken (the caller then decodes with a private state)."""
        with self._lock:
            return self._free.pop() if self._free else None

    def release(self, slot: int) -> None:
        """Give the row back; its next owner's first window starts it from zero."""
        with self._lock:
            self._free.append(slot)

    # -- graphs ------------------------------------------------------------------------------------------------

    def _static(self, b: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        codes = self._codes.get((b, n))
        if codes is None:
            codes = self._codes[(b, n)] = torch.zeros(b, self.q, n, dtype=torch.long, device=self.device)
        slots = self._slots.get(b)
        if slots is None:
            slots = self._slots[b] = torch.full((b,), self.scratch, dtype=torch.long, device=self.device)
        return codes, slots

    @torch.inference_mode()
    def _graph_step(self, b: int, n: int) -> None:
        codes, slots = self._static(b, n)
        self._out[(b, n)] = self.pool.decode(codes, slots)

    def capture_graphs(self, progress: Callable[..., Any] | None = None) -> float:
        """Capture every (batch bucket, window) graph, largest first; returns seconds (0 without graphs)."""
        if self.graphs is None:
            return 0.0
        keys = [(b, n) for b in self.batch_buckets for n in self.windows]
        for b, n in keys:
            self._static(b, n)
        # Warm-up and capture runs decode the scratch row only (static slots all point at it).
        return self.graphs.capture_all(keys, progress=progress, desc="capturing codec graphs")

    # -- the batched job (device worker) -----------------------------------------------------------------------

    @torch.inference_mode()
    def decode(self, slots: Sequence[int], codes: Sequence[torch.Tensor], fresh: Sequence[bool]) -> list[np.ndarray]:
        """Decode equal-length windows ``codes[i] [n, 16]`` of the streams in ``slots``; float32 audio each.

        ``fresh[i]``: the stream's first window (its row is zeroed first).
        """
        k, n = len(slots), int(codes[0].shape[0])
        largest = self.batch_buckets[-1]
        if self.graphs is not None and n in self.windows and k > largest:
            # More windows than the largest graph batch: several replays beat one eager decode by far
            # (measured at 64 windows: ~165 ms eager, which stalled every talker step behind it).
            parts: list[np.ndarray] = []
            for i in range(0, k, largest):
                parts += self.decode(slots[i : i + largest], codes[i : i + largest], fresh[i : i + largest])
            return parts
        starting = [s for s, f in zip(slots, fresh, strict=True) if f]
        if starting:
            self.pool.reset(torch.tensor(starting, dtype=torch.long, device=self.device))
        host = torch.stack([c.T for c in codes])  # [k, 16, n]
        b = pick(self.batch_buckets, k) if self.graphs is not None and n in self.windows else None
        if b is not None and self.graphs is not None:
            static_codes, static_slots = self._static(b, n)
            if (b, n) not in self.graphs:
                static_slots.fill_(self.scratch)
                self.graphs.capture((b, n))
            static_codes[:k].copy_(host, non_blocking=True)
            index = torch.full((b,), self.scratch, dtype=torch.long)
            index[:k] = torch.tensor(slots, dtype=torch.long)
            static_slots.copy_(index, non_blocking=True)
            self.graphs.replay((b, n))
            audio = self._out[(b, n)][:k].cpu()
            self.graph_jobs += 1
        else:
            index = torch.tensor(slots, dtype=torch.long, device=self.device)
            audio = self.pool.decode(host.to(self.device), index).cpu()
            self.eager_jobs += 1
        return [a.numpy().astype(np.float32, copy=False) for a in audio]

    @torch.inference_mode()
    def prime(self, slot: int, context: torch.Tensor) -> None:
        """Feed context frames ``[T, 16]`` (ICL reference codes) into a fresh row without returning audio."""
        index = torch.tensor([slot], dtype=torch.long, device=self.device)
        self.pool.reset(index)
        self.pool.decode(context.T.unsqueeze(0).to(self.device), index)
