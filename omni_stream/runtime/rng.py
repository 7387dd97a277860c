"""Counter-based Exponential(1) noise for the sampler's exponential race, computable inside a CUDA graph.

Row ``i`` of a draw is a pure function of ``(seed_i, counter_i, column)``: a 32-bit integer hash
(two rounds of a multiply-xorshift mix), turned into a uniform with 24 bits and then into ``-log(u)``.
Nothing is stateful, so a request's stream does not depend on which rows it is batched with, a graph
replays it without host work, and the eager path computes the very same values on any device.
All arithmetic stays below 2**63 in int64, so no step relies on signed overflow.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_MUL = 0x045D9F3B  # < 2**27: x * _MUL stays below 2**59 for 32-bit x
_GOLDEN = 0x9E3779B1
_STEP = 0x2C1B3C6D

_columns: dict[tuple[int, torch.device], torch.Tensor] = {}


def _mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = (x * _MUL) & _M32
    x = x ^ (x >> 16)
    x = (x * _MUL) & _M32
    return x ^ (x >> 16)


def row_keys(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """32-bit keys ``[B]`` (int64) from non-negative 63-bit ``seeds`` and per-row draw ``counters``."""
    lo = seeds & _M32
    hi = (seeds >> 32) & _M32
    key = _mix32(lo ^ _mix32(hi ^ _GOLDEN))
    return _mix32((key + (counters & 0xFFFFF) * _STEP) & _M32)


def _column_offsets(width: int, device: torch.device) -> torch.Tensor:
    key = (width, device)
    table = _columns.get(key)
    if table is None:
        # Built once per width, outside any capture: a graph reads it as a constant buffer.
        table = _columns[key] = (torch.arange(width, dtype=torch.int64, device=device) * _GOLDEN) & _M32
    return table


def prepare(width: int, device: torch.device | str) -> None:
    """Build the column table for ``width`` before a graph capture reads it."""
    _column_offsets(width, torch.device(device))


def exponential(keys: torch.Tensor, width: int) -> torch.Tensor:
    """``[B, width]`` float32 Exponential(1) draws, row ``i`` determined by ``keys[i]`` alone."""
    x = _mix32((_column_offsets(width, keys.device)[None, :] + keys[:, None]) & _M32)
    u = ((x >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))
    return -torch.log(u)
