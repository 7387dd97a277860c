"""Slot-indexed static KV cache: ``[layers, slots, kv_heads, max_len, head_dim]``, shapes fixed at creation.

A slot belongs to one sequence at a time (the scheduler owns slot numbers). Rows are never cleared:
a row's valid length is tracked by its owner and every read is masked by it, so handing a slot to a
newcomer costs nothing and a newcomer's prefill can write its rows while other slots keep decoding.
"""

from __future__ import annotations

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

    def decode_rows(self, rows: torch.Tensor, write: torch.Tensor, lengths: torch.Tensor, span: int) -> Attend:
        """Attention over the first ``len(rows)`` slots (a graph's static batch): row ``i`` writes at ``write[i]``
        (an inactive row at a spare position past every length) and reads positions ``0..lengths[i]``."""
        b = rows.shape[0]
        keep = torch.arange(span, device=rows.device)[None, :] <= lengths[:, None]
        mask = keep[:, None, None, :]
        kc, vc = self.k, self.v

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            kl, vl = kc[layer], vc[layer]
            kl[rows, :, write] = k[:, :, 0]
            vl[rows, :, write] = v[:, :, 0]
            return decode_attention(q, kl[:b, :, :span], vl[:b, :, :span], mask)

        return attend


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

    def at(self, start: int) -> Attend:
        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            t = k.shape[2]
            end = start + t
            self.k[layer, :, :, start:end] = k
            self.v[layer, :, :, start:end] = v
            mask = None if t == 1 else self._causal[start:end, :end]
            return attention(q, self.k[layer, :, :, :end], self.v[layer, :, :, :end], mask)

        return attend
