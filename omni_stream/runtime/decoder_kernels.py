"""The decoder layer (:mod:`omni_stream.runtime.decoder`) as a few fused kernels around the GEMMs (the decode path
on CUDA), for every family that builds its stack from it (the Qwen3-TTS talker and code predictor, the causal LMs).

The decode loops are bound by kernel count, not bytes: a code-predictor frame is 15 steps x 5 layers,
and written module by module each layer is ~40 launches (every norm, cast, rotary half and residual add is
its own). The fused layer is

    h = norm(x += delta)            one kernel: the previous layer's residual add and this layer's norm
    q, k = qk_norm_rope(h @ Wqkv)   one GEMM over the concatenated q/k/v weights, one kernel for both norms + rotary
                                    (with a CacheAttend the same kernel writes k and v into the cache)
    o = attend(q, k, v)             one kernel reading the cache for one new token a row, else SDPA (and, with a
                                    plain attend, its cache writes)
    h = norm(x += o @ Wo)           one GEMM, one kernel
    delta = silu_mul(h @ Wgu) @ Wd  one GEMM over the concatenated gate/up weights, one kernel, one GEMM

so ~9 launches a layer, and the stack's final norm absorbs the last residual add. At 1-16 rows (decode at
small batch) the projections go through :class:`SmallRows` instead: Triton's tiled weight read (cuBLAS's
batch-1 kernels are up to 2.5x slower than they need to be), which also reads the code predictor's
embedding rows straight from their table. The norms and the SwiGLU stay kernels of their own: folded into
the projection's reduction loop they cost more than the launch they save
(``benchmarks/results/small_linear.md``, run 20).

The samplers (code 0 and the 15 code-predictor steps) are the other hot chain: temperature, top-k, top-p
and the exponential race are ~30 launches with two sorts in torch, one kernel per row in Triton.
:class:`DecodeKernels` is the set of these functions: :data:`TORCH` (plain torch, the reference; also what
the CPU tests run) or :func:`triton_kernels` (:mod:`omni_stream.runtime.triton_kernels`). The CPU default
stays the module path, whose numerics match the reference implementation exactly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from omni_stream.runtime.kv_cache import KVWrite, read_one
from omni_stream.runtime.sampling import SamplingTensors, sample
from omni_stream.runtime.settings import SMALL_ROW_TILE, Tuning

log = logging.getLogger(__name__)


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x + delta, rms_norm(x + delta) * weight)`` over the last axis (``delta`` None: ``x`` itself)."""
    if delta is not None:
        x = x + delta
    return x, _norm(x, weight, eps)


def qk_norm_rope(
    qkv: torch.Tensor,
    norm_weights: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    heads: int,
    kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q ``[B, T, Hq, D]`` and k ``[B, T, Hkv, D]`` from a fused projection ``[B, T, (Hq + 2 Hkv) D]``.

    Per-head RMSNorm (``norm_weights`` ``[2, D]``: q, k) then rotary with ``cos``/``sin`` ``[B, T, D]``.
    """
    b, t, _ = qkv.shape
    d = norm_weights.shape[-1]
    q = _norm(qkv[..., : heads * d].reshape(b, t, heads, d), norm_weights[0], eps)
    k = _norm(qkv[..., heads * d : (heads + kv_heads) * d].reshape(b, t, kv_heads, d), norm_weights[1], eps)
    c, s = cos[:, :, None], sin[:, :, None]
    half = d // 2

    def rope(x: torch.Tensor) -> torch.Tensor:
        return x * c + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * s

    return rope(q), rope(k)


def qk_norm_rope_kv(
    qkv: torch.Tensor,
    norm_weights: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    heads: int,
    kv_heads: int,
    dst: KVWrite,
) -> torch.Tensor:
    """:func:`qk_norm_rope` with k and the v part ``[B, T, Hkv, D]`` written into the cache at ``dst``; returns q."""
    b, t, _ = qkv.shape
    d = norm_weights.shape[-1]
    q, k = qk_norm_rope(qkv, norm_weights, cos, sin, eps, heads, kv_heads)
    v = qkv[..., (heads + kv_heads) * d :].reshape(b, t, kv_heads, d)
    pos = dst.start[:, None] + torch.arange(t, device=qkv.device)
    dst.k[dst.slots[:, None], :, pos] = k
    dst.v[dst.slots[:, None], :, pos] = v
    return q


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up = [..., gate | up]``."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def embed_linear(
    table: torch.Tensor, ids: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``F.linear(table[ids], weight, bias)``: an embedding lookup into a projection."""
    return F.linear(F.embedding(ids, table), weight, bias)


@dataclass(slots=True, frozen=True)
class SmallRows:
    """The projections of a few rows (one launch each on CUDA).

    ``linear`` has F.linear's signature, ``embed_linear`` that of this module's :func:`embed_linear` (the
    code predictor's embedding lookup read by its input projection where the table lies).
    """

    linear: Callable[..., torch.Tensor] = F.linear
    embed_linear: Callable[..., torch.Tensor] = embed_linear


@dataclass(slots=True, frozen=True)
class DecodeKernels:
    """The fused layer's elementwise functions (signatures of this module's torch versions)."""

    add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    qk_norm_rope: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    silu_mul: Callable[[torch.Tensor], torch.Tensor]
    sample: Callable[[torch.Tensor, SamplingTensors, torch.Tensor | None], torch.Tensor]
    name: str
    # Projections of at most this many rows go through ``small`` (0: never): the talker's and, unless
    # ``predictor_rows`` says otherwise, the code predictor's
    small: SmallRows = SmallRows()
    small_rows: int = 0
    predictor_rows: int | None = None
    # qk_norm_rope writing k and v into a :class:`CacheAttend`'s target (None: the attend copies them).
    qk_norm_rope_kv: Callable[..., torch.Tensor] | None = None
    # one-token attention over a :class:`KVRead` (``kv_cache.read_one``'s signature; None: the attend's read)
    decode_attention: Callable[..., torch.Tensor] | None = None
    # the code predictor's one-row frame as one persistent kernel (qwen3_tts/predictor_kernel.py; CUDA only)
    predictor_frame: bool = False

    def for_predictor(self) -> DecodeKernels:
        """These kernels with the code predictor's row limit (``predictor_rows``) as ``small_rows``."""
        if self.predictor_rows is None or self.predictor_rows == self.small_rows:
            return self
        return replace(self, small_rows=self.predictor_rows)


SMALL_ROWS = SMALL_ROW_TILE  # the Triton small-batch projection's row tile (``triton_kernels.SMALL_ROWS``)

TORCH = DecodeKernels(
    add_rms_norm, qk_norm_rope, silu_mul, sample, name="torch", qk_norm_rope_kv=qk_norm_rope_kv,
    decode_attention=read_one,
)  # fmt: skip


def triton_kernels(tuning: Tuning | None = None) -> DecodeKernels:
    """The Triton versions (imports Triton), with ``tuning``'s row limits (``small_rows``, ``predictor_small_rows``),
    frame kernel (``predictor_kernel``) and dependent launches (``pdl``); None: the defaults."""
    from omni_stream.runtime import triton_kernels as tk

    t = Tuning() if tuning is None else tuning
    bind = tk.with_pdl(t.pdl)
    small = SmallRows(bind(tk.linear), bind(tk.embed_linear))
    return DecodeKernels(
        bind(tk.add_rms_norm), bind(tk.qk_norm_rope), bind(tk.silu_mul), bind(tk.sample), name="triton", small=small,
        small_rows=t.small_rows, predictor_rows=t.predictor_small_rows, qk_norm_rope_kv=bind(tk.qk_norm_rope_kv),
        decode_attention=bind(tk.decode_attention), predictor_frame=t.predictor_kernel,
    )  # fmt: skip


def default_kernels(device: torch.device, tuning: Tuning | None = None) -> DecodeKernels | None:
    """Triton kernels on CUDA when Triton is installed and ``tuning.fused`` is on (None: the defaults), else None."""
    if device.type != "cuda" or not (Tuning() if tuning is None else tuning).fused:
        return None
    try:
        return triton_kernels(tuning)
    except ImportError:
        log.warning("Triton is not installed: decoder layers run unfused (slower decode steps)")
        return None
