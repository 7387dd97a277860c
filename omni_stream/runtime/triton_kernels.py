"""Triton kernels for the decoder layer's elementwise chains (imported only where Triton is installed).

Each replaces a chain of eager kernels with one launch. Prefill attention stays with SDPA and the GEMMs with
cuBLAS. A one-token decode reads each row's valid cache positions in :func:`decode_attention` (SDPA would need
the rows' keys gathered, a mask over the whole span and transposes around it). At 1-16 rows (decode at small
batch) :func:`linear` reads the weight in one launch: cuBLAS's
heuristic picks a 12.7 us kernel for the code predictor's 1024 x 2048 output projection at one row, where a
plain tiled read takes 5.1 us (``benchmarks/results/small_linear.md``); :func:`embed_linear` is the same read with
its input rows taken from an embedding table by index (the code predictor's next input, one launch instead of a
lookup and a projection).
Rounding follows the eager bf16 path where it is cheap to (the residual sum, the normalized activations
before the weight, the SiLU output are rounded to the activation dtype as eager rounds them); the rotary
combination is computed in fp32 and rounded once. :mod:`omni_stream.runtime.decoder_kernels` holds the
torch versions these are tested against (``TRITON_INTERPRET=1`` runs them on the CPU in the suite).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import triton
import triton.language as tl

from omni_stream.runtime.kv_cache import KVRead, KVWrite
from omni_stream.runtime.sampling import SamplingTensors
from omni_stream.runtime.sampling import sample as torch_sample
from omni_stream.runtime.settings import PDL_KERNELS

# Which kernels launch dependently (``Tuning.pdl``, ``OMNI_STREAM_PDL``; default all): the kernels of this module by
# the names of PDL_KERNELS; "prefetch": the small-batch projection asks L2 for its first weight slices before it
# waits. Each public function takes the set as ``pdl``; :func:`with_pdl` binds another one.
F = TypeVar("F", bound=Callable[..., object])


@functools.cache
def _hopper(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def with_pdl(kernels: frozenset[str]) -> Callable[[F], F]:
    """A binder of ``pdl=kernels`` to this module's public functions (the identity for the default, all)."""
    if kernels == PDL_KERNELS:
        return lambda fn: fn
    return lambda fn: functools.partial(fn, pdl=kernels)  # type: ignore[return-value]


def _pdl(t: torch.Tensor, kernel: str, kernels: frozenset[str]) -> bool:
    """Launch with programmatic dependent launch: on Hopper and later a kernel may start while the one before it
    runs (each waits for its predecessor before it reads activations or writes anything, and lets its own
    successor start once it is past that wait), so the launch and the first weight reads of one kernel overlap
    the work of the previous one. A decode step is ~1,200 dependent kernels of a few microseconds each."""
    if not t.is_cuda or kernel not in kernels:
        return False
    return _hopper(t.device.index if t.device.index is not None else torch.cuda.current_device())


@triton.jit
def _after_previous(PDL: tl.constexpr):
    # wait for the previous kernel (and its writes), then let the next one launch: at most one kernel waits
    # ahead of the running one
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _add_rms_norm_kernel(
    x_ptr, d_ptr, w_ptr, sum_ptr, out_ptr, n_cols, eps,
    HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    _after_previous(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, mask=m, other=0.0)
    if HAS_DELTA:
        d = tl.load(d_ptr + row * n_cols + offs, mask=m, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * n_cols + offs, x, mask=m)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / n_cols
    y = (xf * tl.rsqrt(var + eps)).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + offs, (y * w).to(out_ptr.dtype.element_ty), mask=m)


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float, *, pdl: frozenset[str] = PDL_KERNELS
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x + delta, rms_norm(x + delta) * weight)`` over the last axis (``delta`` None: ``x`` itself)."""
    h = x.shape[-1]
    xs = x.reshape(-1, h).contiguous()
    out = torch.empty_like(xs)
    if delta is None:
        total = xs
        ds = xs
    else:
        ds = delta.reshape(-1, h).contiguous()
        total = torch.empty_like(xs)
    block = triton.next_power_of_2(h)
    _add_rms_norm_kernel[(xs.shape[0],)](
        xs, ds, weight, total, out, h, eps, HAS_DELTA=delta is not None, BLOCK=block, PDL=(on := _pdl(xs, "norm", pdl)),
        num_warps=max(1, min(8, block // 256)), launch_pdl=on,
    )  # fmt: skip
    return total.view(x.shape), out.view(x.shape)


# Integer arguments whose values follow the prompts of a batch, left unspecialized. Triton compiles a kernel again
# for each new class of an integer argument (1, a multiple of 16, any other), and CUDA graphs capture every
# decode and bucketed-prefill shape at start-up, but a burst of newcomers beyond the prefill graphs prefills
# eagerly at its longest prompt: a length that is no multiple of 16 would compile the rotary kernel anew while
# the whole batch waits (a compile is ~0.2 s; tests/test_qwen3_fused.py records every launch's classes).
UNSPECIALIZED = {"_qk_norm_rope_kernel": ("t_len",)}


@triton.jit(do_not_specialize=UNSPECIALIZED["_qk_norm_rope_kernel"])
def _qk_norm_rope_kernel(
    qkv_ptr, w_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, kc_ptr, vc_ptr, slots_ptr, start_ptr,
    row_stride, t_len, cos_sb, cos_st, sin_sb, sin_st, c_slot, c_head, c_pos, slots_stride, start_stride, eps,
    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, KV: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    _after_previous(PDL)
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    half: tl.constexpr = D // 2
    offs = tl.arange(0, D)
    base = qkv_ptr + row * row_stride + head * D  # q, k then v heads are adjacent in the fused projection
    b = row // t_len
    t = row % t_len
    cache = row * 0  # k and v go straight into the cache (KV): token t of row b at start[b] + t of slot slots[b]
    if KV:
        slot = tl.load(slots_ptr + b * slots_stride)
        pos = tl.load(start_ptr + b * start_stride) + t
        cache = slot * c_slot + pos * c_pos
    if head < HQ + HKV:
        partner = tl.where(offs < half, offs + half, offs - half)
        x = tl.load(base + offs).to(tl.float32)
        xp = tl.load(base + partner).to(tl.float32)
        r = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
        wsel = (head >= HQ).to(tl.int32) * D  # row 0 of the weight pair: q norm, row 1: k norm
        w = tl.load(w_ptr + wsel + offs).to(tl.float32)
        wp = tl.load(w_ptr + wsel + partner).to(tl.float32)
        dt = q_ptr.dtype.element_ty
        y = ((x * r).to(dt).to(tl.float32) * w).to(dt).to(tl.float32)
        yp = ((xp * r).to(dt).to(tl.float32) * wp).to(dt).to(tl.float32)
        rot = tl.where(offs < half, -yp, yp)
        c = tl.load(cos_ptr + b * cos_sb + t * cos_st + offs).to(tl.float32)
        s = tl.load(sin_ptr + b * sin_sb + t * sin_st + offs).to(tl.float32)
        out = (y * c + rot * s).to(dt)
        if head < HQ:
            tl.store(q_ptr + (row * HQ + head) * D + offs, out)
        elif KV:
            tl.store(kc_ptr + cache + (head - HQ) * c_head + offs, out)
        else:
            tl.store(k_ptr + (row * HKV + (head - HQ)) * D + offs, out)
    elif KV:  # the v heads (launched only with KV), copied as they are
        tl.store(vc_ptr + cache + (head - HQ - HKV) * c_head + offs, tl.load(base + offs))


def _qk_norm_rope(qkv, norm_weights, cos, sin, eps, heads, kv_heads, dst, pdl):  # type: ignore[no-untyped-def]
    b, t, width = qkv.shape
    d = norm_weights.shape[-1]
    if d & (d - 1) or cos.stride(-1) != 1 or sin.stride(-1) != 1:
        raise ValueError(f"head_dim must be a power of two and cos/sin unit-stride in it, got head_dim {d}")
    rows = qkv.reshape(b * t, width)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    q = torch.empty(b, t, heads, d, dtype=qkv.dtype, device=qkv.device)
    cs, ss = cos.stride(), sin.stride()
    if dst is None:
        k = torch.empty(b, t, kv_heads, d, dtype=qkv.dtype, device=qkv.device)
        kc = vc = slots = start = k
        cache_strides = (0, 0, 0, 0, 0)
        programs = heads + kv_heads
    else:
        k = None
        kc, vc, slots, start = dst.k, dst.v, dst.slots, dst.start
        if kc.stride() != vc.stride() or kc.stride(-1) != 1 or kc.dtype != qkv.dtype:
            raise ValueError("the K and V caches must share strides and dtype, unit stride in head_dim")
        cache_strides = (kc.stride(0), kc.stride(1), kc.stride(2), slots.stride(0), start.stride(0))
        programs = heads + 2 * kv_heads
    _qk_norm_rope_kernel[(b * t, programs)](
        rows, norm_weights, cos, sin, q, k if k is not None else q, kc, vc, slots, start,
        rows.stride(0), t, cs[0], cs[1], ss[0], ss[1], *cache_strides, eps,
        HQ=heads, HKV=kv_heads, D=d, KV=dst is not None, PDL=(on := _pdl(rows, "rope", pdl)), num_warps=1,
        launch_pdl=on,
    )  # fmt: skip
    return q, k


def qk_norm_rope(
    qkv: torch.Tensor,
    norm_weights: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    heads: int,
    kv_heads: int,
    *,
    pdl: frozenset[str] = PDL_KERNELS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head RMSNorm and rotary of the q and k parts of a fused projection ``[B, T, (Hq + 2 Hkv) D]``.

    ``norm_weights`` ``[2, D]`` (q norm, k norm); ``cos``/``sin`` ``[B, T, D]`` (any strides, unit last axis).
    Returns q ``[B, T, Hq, D]`` and k ``[B, T, Hkv, D]``, contiguous.
    """
    q, k = _qk_norm_rope(qkv, norm_weights, cos, sin, eps, heads, kv_heads, None, pdl)
    return q, k


def qk_norm_rope_kv(
    qkv: torch.Tensor,
    norm_weights: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    heads: int,
    kv_heads: int,
    dst: KVWrite,
    *,
    pdl: frozenset[str] = PDL_KERNELS,
) -> torch.Tensor:
    """:func:`qk_norm_rope` with k and the v part written into the cache at ``dst``; returns q."""
    return _qk_norm_rope(qkv, norm_weights, cos, sin, eps, heads, kv_heads, dst, pdl)[0]


@triton.jit
def _decode_attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, slots_ptr, last_ptr,
    q_sb, q_sh, o_sb, c_slot, c_head, c_pos, slots_stride, last_stride, span, scale,
    G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # one program per (row, kv head): the G query heads sharing that kv head, online softmax over blocks of keys
    _after_previous(PDL)
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    offs_g = tl.arange(0, GP)
    offs_d = tl.arange(0, D)
    g_ok = offs_g < G
    heads = kvh * G + offs_g
    q = tl.load(q_ptr + b * q_sb + heads[:, None] * q_sh + offs_d[None, :], mask=g_ok[:, None], other=0.0)
    q = q.to(tl.float32) * scale
    slot = tl.load(slots_ptr + b * slots_stride)
    n = tl.minimum(tl.load(last_ptr + b * last_stride) + 1, span).to(tl.int32)
    base = slot * c_slot + kvh * c_head
    m = tl.full([GP], float("-inf"), tl.float32)
    den = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    for s0 in range(0, n, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        ok = offs_s < n
        at = base + offs_s[:, None] * c_pos + offs_d[None, :]
        k = tl.load(k_ptr + at, mask=ok[:, None], other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # [GP, BLOCK_S]
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        v = tl.load(v_ptr + at, mask=ok[:, None], other=0.0).to(tl.float32)
        den = den * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new
    out = acc / den[:, None]
    at_o = o_ptr + b * o_sb + heads[:, None] * D + offs_d[None, :]
    tl.store(at_o, out.to(o_ptr.dtype.element_ty), mask=g_ok[:, None])


def decode_attention(q: torch.Tensor, src: KVRead, *, pdl: frozenset[str] = PDL_KERNELS) -> torch.Tensor:
    """One query token per row ``q`` ``[B, 1, Hq, D]`` (unit stride in D) over ``src``; ``[B, 1, Hq * D]``.

    Reads positions ``0..min(last, span - 1)`` of each row's slot and nothing else (fp32 online softmax, the
    scale ``D ** -0.5``); the same result for a row alone or in any batch.
    """
    b, t, hq, d = q.shape
    hkv = src.k.shape[1]
    if t != 1 or hq % hkv or d & (d - 1) or q.stride(-1) != 1:
        raise ValueError(f"one token, whole GQA groups and a power-of-two head_dim, got q {tuple(q.shape)}")
    if src.k.stride() != src.v.stride() or src.k.stride(-1) != 1:
        raise ValueError("the K and V caches must share strides, unit stride in head_dim")
    g = hq // hkv
    o = torch.empty(b, 1, hq * d, dtype=q.dtype, device=q.device)
    ks = src.k.stride()
    _decode_attention_kernel[(b, hkv)](
        q, src.k, src.v, o, src.slots, src.last,
        q.stride(0), q.stride(2), o.stride(0), ks[0], ks[1], ks[2], src.slots.stride(0), src.last.stride(0),
        src.span, d**-0.5,
        G=g, GP=max(2, triton.next_power_of_2(g)), D=d, BLOCK_S=32, PDL=(on := _pdl(q, "attention", pdl)), num_warps=4,
        launch_pdl=on,
    )  # fmt: skip
    return o


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, n: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    _after_previous(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    g = tl.load(gu_ptr + row * 2 * n + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * n + n + offs, mask=m, other=0.0).to(tl.float32)
    dt = out_ptr.dtype.element_ty
    s = (g * tl.sigmoid(g)).to(dt).to(tl.float32)
    tl.store(out_ptr + row * n + offs, (s * u).to(dt), mask=m)


def silu_mul(gate_up: torch.Tensor, *, pdl: frozenset[str] = PDL_KERNELS) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up = [..., gate | up]``."""
    width = gate_up.shape[-1]
    n = width // 2
    rows = gate_up.reshape(-1, width).contiguous()
    out = torch.empty(rows.shape[0], n, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(n))
    on = _pdl(rows, "silu", pdl)
    _silu_mul_kernel[(rows.shape[0], triton.cdiv(n, block))](
        rows, out, n, BLOCK=block, PDL=on, num_warps=4, launch_pdl=on
    )
    return out.view(*gate_up.shape[:-1], n)


# -- small-batch projections ----------------------------------------------------------------------------------

SMALL_ROWS = 16  # the row tile of the small-batch projection; a call may pass at most this many rows


@triton.jit
def _small_linear_kernel(
    x_ptr, idx_ptr, w_ptr, bias_ptr, out_ptr, M, N, K, x_stride,
    GATHER: tl.constexpr, BIAS: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr, PREFETCH_K: tl.constexpr, LINE: tl.constexpr,
):  # fmt: skip
    rm = tl.arange(0, BLOCK_M)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    mm = rm < M
    nm = rn < N
    if PREFETCH_K > 0:  # only with PDL
        # No earlier kernel writes the weights: while the previous kernel still runs, ask L2 for the first
        # PREFETCH_K columns of this program's rows (one address per LINE elements, clamped inside the weight)
        pn = tl.minimum(rn, N - 1).to(tl.int64)
        pk = tl.minimum(tl.arange(0, PREFETCH_K // LINE) * LINE, K - 1)
        at = w_ptr + pn[:, None] * K + pk[None, :]
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [at], dtype=tl.int32, is_pure=False, pack=1)
    _after_previous(PDL)
    if GATHER:  # input row i is row idx[i] of a table: an embedding lookup folded into the projection
        src = tl.load(idx_ptr + rm, mask=mm, other=0).to(tl.int64)
    else:
        src = rm.to(tl.int64)
    xrow = x_ptr + src[:, None] * x_stride
    wrow = w_ptr + rn.to(tl.int64)[:, None] * K
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        km = kk < K
        a = tl.load(xrow + kk[None, :], mask=mm[:, None] & km[None, :], other=0.0)
        w = tl.load(wrow + kk[None, :], mask=nm[:, None] & km[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(a, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, tl.trans(w), acc)
    if BIAS:
        acc += tl.load(bias_ptr + rn, mask=nm, other=0.0).to(tl.float32)[None, :]
    om = mm[:, None] & nm[None, :]
    tl.store(out_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :], acc.to(out_ptr.dtype.element_ty), mask=om)


@dataclass(slots=True, frozen=True)
class SmallLinearBlocks:
    """Launch shape of the small-batch projection: output columns and reduction width per program."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


SMEM_BUDGET = 192 << 10  # bytes of shared memory the pipelined tiles may take (the H100/H200 limit is 227 KB)


def small_linear_blocks(n: int, k: int, itemsize: int = 2) -> SmallLinearBlocks:
    """Tile sizes for an ``[N, K]`` weight of ``itemsize``-byte elements: never a function of the row count.

    The row tile is always :data:`SMALL_ROWS`, so a row's sums run in the same order whether it is
    projected alone or with 15 others (batched rows get their solo results bit for bit). The column
    widths are the fastest of a sweep on the H200 at one row (``benchmarks/small_linear.py --sweep``,
    ``benchmarks/results/small_linear.md``): 16 columns a program up to 2048 output columns, 32 up to
    4096, 64 up to 8192, then 32 with a narrower reduction slice; four pipelined stages where they fit
    in :data:`SMEM_BUDGET` (bf16: always; fp32 takes fewer stages or a narrower slice).
    """
    if n <= 2048:
        block_n, block_k = 16, 512
    elif n <= 4096:
        block_n, block_k = 32, 512
    elif n <= 8192:
        block_n, block_k = 64, 256
    else:
        block_n, block_k = 32, 128
    block_k = max(16, min(block_k, triton.next_power_of_2(k)))
    while True:
        stages = min(4, SMEM_BUDGET // ((block_n + SMALL_ROWS) * block_k * itemsize))
        if stages >= 2 or block_k == 16:
            return SmallLinearBlocks(block_n, block_k, num_warps=4, num_stages=max(stages, 1))
        block_k //= 2


def _project(
    rows: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out_shape: tuple[int, ...],
    blocks: SmallLinearBlocks | None,
    m: int,
    idx: torch.Tensor | None = None,
    pdl: frozenset[str] = PDL_KERNELS,
) -> torch.Tensor:
    """``m`` input rows (``rows[idx[i]]`` with ``idx``, else ``rows[i]``) times ``weight``, bias added."""
    n, k = weight.shape
    if m > SMALL_ROWS:
        raise ValueError(f"the small-batch projection takes at most {SMALL_ROWS} rows, got {m}")
    if not weight.is_contiguous():
        raise ValueError("the weight must be contiguous")
    out = torch.empty(*out_shape, n, dtype=rows.dtype, device=rows.device)
    b = blocks or small_linear_blocks(n, k, rows.element_size())
    on = _pdl(rows, "linear", pdl)
    line = max(1, 128 // weight.element_size())  # elements a 128-byte L2 line holds
    # the first two slices of the loop; 0: none
    prefetch = max(line, min(2 * b.block_k, triton.next_power_of_2(k))) if on and _pdl(rows, "prefetch", pdl) else 0
    _small_linear_kernel[(triton.cdiv(n, b.block_n),)](
        rows, rows if idx is None else idx, weight, weight if bias is None else bias, out, m, n, k, rows.stride(0),
        GATHER=idx is not None, BIAS=bias is not None, IEEE=rows.dtype == torch.float32, BLOCK_M=SMALL_ROWS,
        BLOCK_N=b.block_n, BLOCK_K=b.block_k, PDL=on, PREFETCH_K=prefetch, LINE=line,
        num_warps=b.num_warps, num_stages=b.num_stages, launch_pdl=on,
    )  # fmt: skip
    return out


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    blocks: SmallLinearBlocks | None = None,
    pdl: frozenset[str] = PDL_KERNELS,
) -> torch.Tensor:
    """``F.linear`` for at most :data:`SMALL_ROWS` rows in one launch (``blocks`` overrides the tile choice)."""
    k = weight.shape[1]
    if x.shape[-1] != k:
        raise ValueError(f"input width {x.shape[-1]} does not fit a [{weight.shape[0]}, {k}] weight")
    rows = x.reshape(-1, k)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    return _project(rows, weight, bias, tuple(x.shape[:-1]), blocks, rows.shape[0], pdl=pdl)


def embed_linear(
    table: torch.Tensor,
    ids: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    blocks: SmallLinearBlocks | None = None,
    pdl: frozenset[str] = PDL_KERNELS,
) -> torch.Tensor:
    """``linear(table[ids], weight, bias)`` in one launch: the rows are read from the table where they lie."""
    k = weight.shape[1]
    if table.shape[-1] != k or table.stride(-1) != 1 or table.dim() != 2:
        raise ValueError(f"a [V, {k}] table with unit stride in its width fits a [{weight.shape[0]}, {k}] weight")
    flat = ids.reshape(-1)
    return _project(table, weight, bias, tuple(ids.shape), blocks, flat.shape[0], flat.contiguous(), pdl)


@triton.jit
def sample_row(
    lg_ptr, noise_ptr, ds_ptr, temp_ptr, top_k_ptr, top_p_ptr, n_cols, BLOCK: tl.constexpr, LOGITS_CACHE: tl.constexpr
):  # fmt: skip
    """The next token of one row (pointers at the row): greedy where ``do_sample`` is 0, else the exponential
    race over the temperature / top-k / top-p filtered distribution (:func:`sample`'s per-row body).
    ``LOGITS_CACHE``: the logits' load cache modifier (".cg" where other programs of the launch wrote them)."""
    offs = tl.arange(0, BLOCK)
    m = offs < n_cols
    neg = float("-inf")
    lg = tl.load(lg_ptr + offs, mask=m, other=neg, cache_modifier=LOGITS_CACHE).to(tl.float32)
    greedy = tl.argmax(lg, axis=0, tie_break_left=True)
    x = lg / tl.load(temp_ptr)
    # top-k: keep values >= the k-th largest (k == 0 keeps all). The k-th largest by bisection over the values'
    # order-preserving integer keys: 32 counting passes instead of a sort of the vocabulary (34 us a row on an
    # H200 at 2048 entries, a tenth of a batch-1 frame)
    k = tl.load(top_k_ptr)
    kk = tl.minimum(tl.maximum(k, 1), n_cols)
    bits = x.to(tl.int32, bitcast=True)
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)
    lo = tl.min(key, axis=0)  # invariant: at least kk keys >= lo
    hi = tl.max(key, axis=0)
    for _ in range(32):
        mid = lo + (hi - lo + 1) // 2
        enough = tl.sum((key >= mid).to(tl.int32), axis=0) >= kk
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid - 1)
    kth = tl.max(tl.where(key == lo, x, neg), axis=0)
    kth = tl.where(k > 0, kth, neg)
    threshold = kth
    tp = tl.load(top_p_ptr)
    if tp < 1.0:  # top-p: in descending order keep a token while the mass strictly before it is < p (the best stays)
        s = tl.sort(x, dim=0, descending=True)
        s = tl.where(s < kth, neg, s)
        e = tl.exp(s - tl.max(s, axis=0))
        ps = e / tl.sum(e, axis=0)
        before = tl.cumsum(ps, axis=0) - ps
        keep = (before < tp) | (offs == 0)
        threshold = tl.maximum(tl.min(tl.where(keep, s, float("inf")), axis=0), kth)
    x = tl.where(x < threshold, neg, x)
    # exponential race over the filtered distribution
    e = tl.exp(x - tl.max(x, axis=0))
    probs = e / tl.sum(e, axis=0)
    nz = tl.load(noise_ptr + offs, mask=m, other=1.0)
    raced = tl.argmax(tl.where(m, probs / tl.maximum(nz, 1e-20), neg), axis=0, tie_break_left=True)
    return tl.where(tl.load(ds_ptr) != 0, raced, greedy)


@triton.jit
def _sample_kernel(
    logits_ptr, noise_ptr, do_sample_ptr, temp_ptr, top_k_ptr, top_p_ptr, out_ptr,
    n_cols, logits_stride, noise_stride,
    BLOCK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    _after_previous(PDL)
    row = tl.program_id(0).to(tl.int64)
    token = sample_row(
        logits_ptr + row * logits_stride, noise_ptr + row * noise_stride, do_sample_ptr + row, temp_ptr + row,
        top_k_ptr + row, top_p_ptr + row, n_cols, BLOCK, "",
    )  # fmt: skip
    tl.store(out_ptr + row, token.to(tl.int64))


def sample(
    logits: torch.Tensor, params: SamplingTensors, noise: torch.Tensor | None, *, pdl: frozenset[str] = PDL_KERNELS
) -> torch.Tensor:
    """:func:`omni_stream.runtime.sampling.sample` in one kernel per row (ties at a cut-off are all kept)."""
    if noise is None:
        return torch_sample(logits, params, None)
    b, v = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    if noise.stride(1) != 1:
        noise = noise.contiguous()
    out = torch.empty(b, dtype=torch.int64, device=logits.device)
    block = triton.next_power_of_2(v)
    _sample_kernel[(b,)](
        logits, noise, params.do_sample.view(torch.uint8), params.temperature, params.top_k, params.top_p, out,
        v, logits.stride(0), noise.stride(0), BLOCK=block, PDL=(on := _pdl(logits, "sample", pdl)),
        num_warps=max(1, min(8, block // 512)), launch_pdl=on,
    )  # fmt: skip
    return out
