"""Slot-indexed static KV cache: ``[layers, slots, kv_heads, max_len, head_dim]``, shapes fixed at creation.

A slot belongs to one sequence at a time (the scheduler owns slot numbers). Rows are never cleared:
a row's valid length is tracked by its owner and every read is masked by it, so handing a slot to a
newcomer costs nothing and a newcomer's prefill can write its rows while other slots keep decoding.

The decode attends are :class:`CacheAttend` objects: besides attending they name where this step's K/V
rows go (:class:`KVWrite`), so the fused layer's rotary kernel writes k and v there itself and the two
copy kernels per layer and step disappear (206 of a batch-1 Qwen3-TTS frame's ~1,560 kernels). For one new
token per row they also name what the query reads (:class:`KVRead`), so a decode-attention kernel can read each
row's valid positions straight from the cache (no gathered keys, no mask, no transposes around SDPA).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# attend(layer_index, q [B, Hq, T, D], k [B, Hkv, T, D], v [B, Hkv, T, D]) -> [B, Hq, T, D]
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Eager GQA attention with an fp32 softmax; ``mask`` is boolean (True = attend), broadcast to ``[B, Hq, T, S]``."""
    n_rep = q.shape[1] // k.shape[1]
    if n_rep > 1:
        k = k.repeat_interleave(n_rep, dim=1)
        v = v.repeat_interleave(n_rep, dim=1)
    w = torch.matmul(q, k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    if mask is not None:
        w = w.masked_fill(~mask, torch.finfo(w.dtype).min)
    w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(w, v)


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One query per row against ``[B, Hkv, S, D]`` keys; GQA heads folded onto the query axis for SDPA on CUDA."""
    if not q.is_cuda:
        return attention(q, keys, values, mask)
    b, hq, t, d = q.shape
    hkv = keys.shape[1]
    o = F.scaled_dot_product_attention(q.reshape(b, hkv, (hq // hkv) * t, d), keys, values, attn_mask=mask)
    return o.reshape(b, hq, t, d)


@dataclass(slots=True, frozen=True)
class KVWrite:
    """Where one layer's new K/V rows go: token ``t`` of batch row ``i`` -> ``k[slots[i], :, start[i] + t]``.

    ``k``/``v``: that layer's cache ``[slots, kv_heads, positions, head_dim]`` (unit stride in the last axis);
    ``slots``/``start``: int64 ``[B]`` (any stride, 0 included: one start for every row).
    """

    k: torch.Tensor
    v: torch.Tensor
    slots: torch.Tensor
    start: torch.Tensor


@dataclass(slots=True, frozen=True)
class KVRead:
    """What one new query token of batch row ``i`` attends: positions ``0..last[i]`` of slot ``slots[i]``.

    ``k``/``v``: that layer's cache ``[slots, kv_heads, positions, head_dim]``; ``slots``/``last``: int64 ``[B]``
    (any stride); ``span``: a host bound, ``last[i] < span`` for every row that matters (a row past it reads
    ``0..span-1``: the inactive rows of a graph's static batch, whose output is discarded).
    """

    k: torch.Tensor
    v: torch.Tensor
    slots: torch.Tensor
    last: torch.Tensor
    span: int


def read_one(q: torch.Tensor, src: KVRead) -> torch.Tensor:
    """Attention of one query token per row ``q`` ``[B, 1, Hq, D]`` over ``src``; ``[B, 1, Hq * D]`` (torch)."""
    b, _, hq, d = q.shape
    keys, values = src.k[src.slots, :, : src.span], src.v[src.slots, :, : src.span]
    keep = torch.arange(src.span, device=q.device)[None, :] <= src.last[:, None]
    return attention(q.transpose(1, 2), keys, values, keep[:, None, None, :]).reshape(b, 1, hq * d)


class CacheAttend(ABC):
    """An :data:`Attend` that can also hand its write target to the kernel that makes K and V.

    Calling it writes ``k``/``v`` into the cache and attends; a fused layer may instead write them itself
    through :meth:`target` (no separate copy kernels) and then call :meth:`read`.
    """

    @abstractmethod
    def target(self, layer: int) -> KVWrite: ...

    @abstractmethod
    def read(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Attention of ``q`` ``[B, Hq, T, D]`` over the cache, this step's K/V rows already written."""

    def source(self, layer: int) -> KVRead | None:
        """What :meth:`read` attends when every row has one new token, for a decode-attention kernel (None:
        more than one token per row; :meth:`read` it is)."""
        return None

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """``k``/``v`` ``[B, Hkv, T, D]`` into :meth:`target` (the unfused path's copies)."""
        dst = self.target(layer)
        pos = dst.start[:, None] + torch.arange(k.shape[2], device=k.device)
        dst.k[dst.slots[:, None], :, pos] = k.transpose(1, 2)
        dst.v[dst.slots[:, None], :, pos] = v.transpose(1, 2)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.write(layer, k, v)
        return self.read(layer, q)


@dataclass(slots=True, frozen=True)
class KVShape:
    num_layers: int
    num_slots: int
    num_kv_heads: int
    max_len: int
    head_dim: int


class SlotKVCache:
    """Static per-slot K/V rows with per-row lengths supplied by the caller."""

    def __init__(self, shape: KVShape, *, dtype: torch.dtype, device: torch.device | str) -> None:
        s = shape
        self.shape = s
        size = (s.num_layers, s.num_slots, s.num_kv_heads, s.max_len, s.head_dim)
        self.k = torch.zeros(size, dtype=dtype, device=device)
        self.v = torch.zeros(size, dtype=dtype, device=device)

    @property
    def max_len(self) -> int:
        return self.shape.max_len

    def prefill(self, slot: int, start: int = 0) -> Attend:
        """Attention for ``T`` new tokens of one slot at positions ``start..start+T-1`` (causal)."""

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            t = k.shape[2]
            end = start + t
            self.k[layer, slot, :, start:end] = k[0]
            self.v[layer, slot, :, start:end] = v[0]
            keys = self.k[layer, slot : slot + 1, :, :end]
            values = self.v[layer, slot : slot + 1, :, :end]
            qpos = torch.arange(start, end, device=q.device)[:, None]
            mask = torch.arange(end, device=q.device)[None, :] <= qpos
            return attention(q, keys, values, mask)

        return attend

    def prefill_rows(self, slots: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, bound: int) -> Attend:
        """Attention for right-padded new tokens of several slots at once: token ``j`` of row ``i`` sits at
        position ``starts[i] + j`` of slot ``slots[i]`` (causal over the slot's earlier rows) for ``j <
        lengths[i]``; a padding token's K/V is not written and its output is junk. ``bound`` (host int) is at least
        ``max(starts + lengths)``. The rows each token writes are found once, for every layer."""
        dev = slots.device
        t = int(lengths.max())
        j = torch.arange(t, device=dev)
        rows, cols = (j[None, :] < lengths[:, None]).nonzero(as_tuple=True)
        dst_slots, dst_pos = slots[rows], starts[rows] + cols
        qpos = starts[:, None] + j[None, :]  # [B, T]
        mask = (torch.arange(bound, device=dev)[None, None, :] <= qpos[:, :, None])[:, None]  # [B, 1, T, bound]

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.k[layer, dst_slots, :, dst_pos] = k[rows, :, cols]
            self.v[layer, dst_slots, :, dst_pos] = v[rows, :, cols]
            return attention(q, self.k[layer][slots, :, :bound], self.v[layer][slots, :, :bound], mask)

        return attend

    def decode(self, slots: torch.Tensor, lengths: torch.Tensor, bound: int) -> Attend:
        """Attention for one new token per row: row ``i`` writes at ``lengths[i]`` of slot ``slots[i]``.

        ``bound`` (host int) is at least ``max(lengths) + 1``; keys past each row's length are masked,
        so ``bound`` may be any larger value (a bucket) without changing results.
        """
        keep = torch.arange(bound, device=slots.device)[None, :] <= lengths[:, None]
        mask = keep[:, None, None, :]

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            kl, vl = self.k[layer], self.v[layer]
            kl[slots, :, lengths] = k[:, :, 0]
            vl[slots, :, lengths] = v[:, :, 0]
            keys = kl[slots, :, :bound]
            values = vl[slots, :, :bound]
            return attention(q, keys, values, mask)

        return attend

    def decode_rows(self, rows: torch.Tensor, write: torch.Tensor, lengths: torch.Tensor, span: int) -> CacheAttend:
        """Attention over the first ``len(rows)`` slots (a graph's static batch): row ``i`` writes at ``write[i]``
        (an inactive row at a spare position past every length) and reads positions ``0..lengths[i]``."""
        return _RowsDecode(self, rows, write, lengths, span)


class _RowsDecode(CacheAttend):
    def __init__(self, cache: SlotKVCache, rows: torch.Tensor, write: torch.Tensor, lengths: torch.Tensor, span: int):
        self.cache, self.rows, self.write_at, self.lengths, self.span = cache, rows, write, lengths, span
        self._mask: torch.Tensor | None = None  # built on the first read (a decode-attention kernel needs none)

    @property
    def mask(self) -> torch.Tensor:
        if self._mask is None:
            keep = torch.arange(self.span, device=self.rows.device)[None, :] <= self.lengths[:, None]
            self._mask = keep[:, None, None, :]
        return self._mask

    def target(self, layer: int) -> KVWrite:
        return KVWrite(self.cache.k[layer], self.cache.v[layer], self.rows, self.write_at)

    def source(self, layer: int) -> KVRead:
        return KVRead(self.cache.k[layer], self.cache.v[layer], self.rows, self.lengths, self.span)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.cache.k[layer][self.rows, :, self.write_at] = k[:, :, 0]
        self.cache.v[layer][self.rows, :, self.write_at] = v[:, :, 0]

    def read(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        b, s = self.rows.shape[0], self.span
        return decode_attention(q, self.cache.k[layer][:b, :, :s], self.cache.v[layer][:b, :, :s], self.mask)


class FrameKVCache:
    """Per-frame scratch cache of the code predictor: ``[layers, batch, kv_heads, max_len, head_dim]``.

    Positions restart at 0 every frame and the write offsets are Python constants of the unrolled loop,
    so the whole loop has fixed shapes per batch size and no data-dependent control flow.
    """

    def __init__(self, shape: KVShape, *, dtype: torch.dtype, device: torch.device | str) -> None:
        s = shape
        size = (s.num_layers, s.num_slots, s.num_kv_heads, s.max_len, s.head_dim)
        self.k = torch.zeros(size, dtype=dtype, device=device)
        self.v = torch.zeros(size, dtype=dtype, device=device)
        n = s.max_len
        self._causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        self.batch = torch.arange(s.num_slots, device=device)
        self.positions = torch.arange(n, device=device)

    def at(self, start: int, t: int) -> CacheAttend:
        """Attention for ``t`` new tokens of every row at positions ``start..start+t-1`` (causal among them)."""
        return _FrameAt(self, start, t)


class _FrameAt(CacheAttend):
    def __init__(self, cache: FrameKVCache, start: int, t: int) -> None:
        self.cache, self.start, self.end = cache, start, start + t

    def target(self, layer: int) -> KVWrite:
        c = self.cache
        return KVWrite(c.k[layer], c.v[layer], c.batch, c.positions[self.start : self.start + 1].expand(c.batch.shape))

    def source(self, layer: int) -> KVRead | None:
        c, end = self.cache, self.end
        if end - self.start != 1:
            return None
        return KVRead(c.k[layer], c.v[layer], c.batch, c.positions[end - 1 : end].expand(c.batch.shape), end)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.cache.k[layer, :, :, self.start : self.end] = k
        self.cache.v[layer, :, :, self.start : self.end] = v

    def read(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        c, start, end = self.cache, self.start, self.end
        keys, values = c.k[layer, :, :, :end], c.v[layer, :, :, :end]
        if end - start == 1:
            if q.is_cuda:  # SDPA with the GQA heads folded onto the query axis
                b, hq, _, d = q.shape
                hkv = keys.shape[1]
                o = F.scaled_dot_product_attention(q.reshape(b, hkv, hq // hkv, d), keys, values)
                return o.reshape(b, hq, 1, d)
            return attention(q, keys, values, None)
        return attention(q, keys, values, c._causal[start:end, :end])
