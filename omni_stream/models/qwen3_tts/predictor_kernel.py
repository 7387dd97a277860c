"""The code predictor's frame at one row as one persistent Triton kernel (imported only where Triton is).

At batch 1 a frame's 15 dependent code-predictor steps are ~850 kernels of a few microseconds each, and the
launches, not the bytes, bound them (``benchmarks/results/tts_bench.md``, run 25: 2.83 ms for ~2.4 GB of
weight reads). Here one program per multiprocessor runs the whole frame: 16 single-token passes through the 5
layers (the 2-token prefill of :meth:`CodePredictor.generate` as two passes: causal attention over a cache
gives the same result), each pass's phases split over the programs and separated by a grid-wide barrier
(an atomic counter: every program arrives, then waits until all have). A phase is a matrix-vector product
over the program's output columns, with the RMSNorm before it folded into its input, the residual add or
the SwiGLU into its output; or the attention of one kv head per program; or the sampler in program 0. Before
each phase a program asks L2 for the weight columns of its next one, so the weight reads of the next phase
overlap this one and its barrier.

Every program must be resident at once (they wait for each other): the grid is at most the device's
multiprocessor count, one program each, and the launch is not dependent (no kernel before it holds a
multiprocessor waiting on it). The rounding follows the fused layer (:mod:`omni_stream.runtime.decoder_kernels` and
:mod:`omni_stream.runtime.triton_kernels`) step for step; only the products' summation order differs
(``tl.sum`` over a column tile instead of the projections' ``tl.dot``): in fp32 the codes are the loop's
(GPU test), in bf16 they may differ. Activations written during the launch are read with ``.cg`` (from L2):
a program's L1 may still hold the previous phase's lines, and with plain loads the codes came out wrong.
Triton's interpreter runs programs one after another, so on the CPU the kernel runs as one program, which
does every phase itself.

Measured on the H200 (``benchmarks/frame_kernel.py``, ``tts_bench.md`` run 26) at the 1.7B sizes, bf16 graph
replays: the loop 2.59 ms; this kernel 7.1 ms with 256-wide reduction slices (each slice's load waited its
latency), 3.28 ms with a program's whole tile as one load (8 warps; 16 warps 4.18 ms; 32 programs 3.4x
slower than 128, so the per-program reads, not the barriers' polls, dominate; a 500 ns poll back-off did not
help). So it stays off by default (``OMNI_STREAM_PREDICTOR_KERNEL``). 448 phases a frame at ~7 us each:
fewer phases (attention recomputed in each program before the output projection, the sampler beside the
next input) and more reads in flight per program are what is left to try.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import cast

import torch
import triton
import triton.language as tl

from omni_stream.runtime.sampling import SamplingTensors
from omni_stream.runtime.triton_kernels import sample_row

LINE_BYTES = 128  # an L2 line: one prefetch address each
MAX_PROGRAMS = 128  # the widest phase (the q/k/v projection, 4096 columns) in tiles of 32 columns
# Reduction slice of the matrix-vector products: a whole weight row (up to this many elements), so that a
# program's whole tile is one load in flight. Slices of 256 (run 26) left the loads one slice at a time, each
# waiting its memory latency: 6-8 ms a frame against the loop's 2.6.
BLOCK_K = 4096


@triton.jit
def _grid_sync(bar_ptr, target, SPIN_NS: tl.constexpr):
    # every thread's writes are done (bar.sync), one release arrival per program, then wait for all programs,
    # polling at most every SPIN_NS nanoseconds (0: back to back) so that the polls leave the counter's L2
    # slice to the arrivals
    tl.debug_barrier()
    tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    while tl.load(bar_ptr, volatile=True) < target:
        if SPIN_NS > 0:
            ns = tl.full([1], SPIN_NS, tl.int32)
            tl.inline_asm_elementwise("nanosleep.u32 $1; mov.u32 $0, $1;", "=r,r", [ns], dtype=tl.int32,
                                      is_pure=False, pack=1)  # fmt: skip
    tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _prefetch(w_ptr, n0, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, KL: tl.constexpr,
              LINE: tl.constexpr, ON: tl.constexpr):  # fmt: skip
    # ask L2 for rows n0..n0+BN of a [N, K] weight (no kernel writes weights, so no ordering is needed)
    if ON:
        rows = tl.minimum(n0 + tl.arange(0, BN), N - 1).to(tl.int64)
        cols = tl.minimum(tl.arange(0, KL) * LINE, K - 1)
        at = w_ptr + rows[:, None] * K + cols[None, :]
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [at], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _rms(x_ptr, eps, H: tl.constexpr, BH: tl.constexpr):
    offs = tl.arange(0, BH)
    x = tl.load(x_ptr + offs, mask=offs < H, other=0.0, cache_modifier=".cg").to(tl.float32)
    return tl.rsqrt(tl.sum(x * x, axis=0) / H + eps)


@triton.jit
def _matvec(x_ptr, w_ptr, n0, r, nw_ptr, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
            NORM: tl.constexpr):  # fmt: skip
    # fp32 sums of rows n0..n0+BN of a [N, K] weight times x (NORM: times rms_norm(x) * nw, r the row's factor,
    # rounded as the fused layer's norm kernel rounds it)
    rn = n0 + tl.arange(0, BN)
    nm = rn < N
    acc = tl.zeros([BN], dtype=tl.float32)
    for k0 in tl.static_range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        km = rk < K
        xk = tl.load(x_ptr + rk, mask=km, other=0.0, cache_modifier=".cg").to(tl.float32)
        if NORM:
            dt = x_ptr.dtype.element_ty
            wn = tl.load(nw_ptr + rk, mask=km, other=0.0).to(tl.float32)
            xk = ((xk * r).to(dt).to(tl.float32) * wn).to(dt).to(tl.float32)
        w = tl.load(w_ptr + rn.to(tl.int64)[:, None] * K + rk[None, :], mask=nm[:, None] & km[None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * xk[None, :], axis=1)
    return acc


@triton.jit
def _add_to(x_ptr, rn, nm, d):
    # the residual add of a projection's rounded columns, rounded as the fused layer's add
    x = tl.load(x_ptr + rn, mask=nm, other=0.0, cache_modifier=".cg").to(tl.float32)
    tl.store(x_ptr + rn, (x + d).to(x_ptr.dtype.element_ty), mask=nm)


@triton.jit
def _attend(qkv_ptr, qkn_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, o_ptr, kvh, pos, eps, scale,
            HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, S: tl.constexpr, G: tl.constexpr,
            GP: tl.constexpr):  # fmt: skip
    # kv head `kvh` at position `pos`: its k (q/k norm + rotary) and v into the layer's cache, then its G query
    # heads' attention over positions 0..pos (as triton_kernels' qk_norm_rope_kv and decode_attention)
    dt = qkv_ptr.dtype.element_ty
    half: tl.constexpr = D // 2
    offs = tl.arange(0, D)
    partner = tl.where(offs < half, offs + half, offs - half)
    c = tl.load(cos_ptr + pos * D + offs).to(tl.float32)
    s = tl.load(sin_ptr + pos * D + offs).to(tl.float32)
    kb = qkv_ptr + (HQ + kvh) * D
    x = tl.load(kb + offs, cache_modifier=".cg").to(tl.float32)
    xp = tl.load(kb + partner, cache_modifier=".cg").to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
    y = ((x * r).to(dt).to(tl.float32) * tl.load(qkn_ptr + D + offs).to(tl.float32)).to(dt).to(tl.float32)
    yp = ((xp * r).to(dt).to(tl.float32) * tl.load(qkn_ptr + D + partner).to(tl.float32)).to(dt).to(tl.float32)
    k = (y * c + tl.where(offs < half, -yp, yp) * s).to(dt)
    cache = kvh * S * D
    tl.store(kc_ptr + cache + pos * D + offs, k)
    tl.store(vc_ptr + cache + pos * D + offs, tl.load(qkv_ptr + (HQ + HKV + kvh) * D + offs, cache_modifier=".cg"))
    tl.debug_barrier()  # the stores above are read back below by other threads of this program
    g = tl.arange(0, GP)
    gm = g < G
    qa = qkv_ptr + (kvh * G + g)[:, None] * D
    x2 = tl.load(qa + offs[None, :], mask=gm[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
    xp2 = tl.load(qa + partner[None, :], mask=gm[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
    r2 = tl.rsqrt(tl.sum(x2 * x2, axis=1) / D + eps)[:, None]
    w = tl.load(qkn_ptr + offs).to(tl.float32)[None, :]
    wp = tl.load(qkn_ptr + partner).to(tl.float32)[None, :]
    y2 = ((x2 * r2).to(dt).to(tl.float32) * w).to(dt).to(tl.float32)
    yp2 = ((xp2 * r2).to(dt).to(tl.float32) * wp).to(dt).to(tl.float32)
    q = (y2 * c[None, :] + tl.where(offs[None, :] < half, -yp2, yp2) * s[None, :]).to(dt).to(tl.float32) * scale
    so = tl.arange(0, S)
    sm = so <= pos
    at = cache + so[:, None] * D + offs[None, :]
    kk = tl.load(kc_ptr + at, mask=sm[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
    sc = tl.sum(q[:, None, :] * kk[None, :, :], axis=2)
    sc = tl.where(sm[None, :], sc, float("-inf"))
    p = tl.exp(sc - tl.max(sc, axis=1)[:, None])
    vv = tl.load(vc_ptr + at, mask=sm[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
    out = tl.sum(p[:, :, None] * vv[None, :, :], axis=1) / tl.sum(p, axis=1)[:, None]
    tl.store(o_ptr + (kvh * G + g)[:, None] * D + offs[None, :], out.to(dt), mask=gm[:, None])


@triton.jit
def _frame_kernel(
    hid_ptr, c0_ptr, win_ptr, bin_ptr, tables_ptr,
    n1_ptrs, qkv_ptrs, qkn_ptrs, o_ptrs, n2_ptrs, gu_ptrs, dn_ptrs, fn_ptr, head_ptrs,
    cos_ptr, sin_ptr, noise_ptr, noise_stride, ds_ptr, temp_ptr, topk_ptr, topp_ptr,
    x_ptr, qkv_ptr, o_ptr, act_ptr, logits_ptr, kc_ptr, vc_ptr, codes_ptr, bar_ptr,
    eps, scale,
    E: tl.constexpr, H: tl.constexpr, I: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
    V: tl.constexpr, L: tl.constexpr, STEPS: tl.constexpr, S: tl.constexpr, P: tl.constexpr,
    HAS_PROJ: tl.constexpr, HAS_NOISE: tl.constexpr, PREFETCH: tl.constexpr, LINE: tl.constexpr,
    BH: tl.constexpr, BN_H: tl.constexpr, BN_QKV: tl.constexpr, BN_I: tl.constexpr, BN_V: tl.constexpr,
    BK_E: tl.constexpr, BK_H: tl.constexpr, BK_O: tl.constexpr, BK_I: tl.constexpr,
    KL_E: tl.constexpr, KL_H: tl.constexpr, KL_O: tl.constexpr, KL_I: tl.constexpr,
    BV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, SPIN_NS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    dt = x_ptr.dtype.element_ty
    NQKV: tl.constexpr = (HQ + 2 * HKV) * D
    NO: tl.constexpr = HQ * D
    t = 0  # barriers passed
    for p in range(STEPS + 1):  # pass p: the token at position p
        # -- the input: proj(hidden), proj(code-0 embedding), then proj(table[p - 2][code p - 1])
        if p == 0:
            e_ptr = hid_ptr
        elif p == 1:
            e_ptr = c0_ptr
        else:
            tok = tl.load(codes_ptr + p - 2, cache_modifier=".cg")
            e_ptr = tl.load(tables_ptr + p - 2).to(tl.pointer_type(dt)) + tok * E
        _prefetch(tl.load(qkv_ptrs).to(tl.pointer_type(dt)), pid * BN_QKV, NQKV, H, BN_QKV, KL_H, LINE, PREFETCH)
        for n0 in range(pid * BN_H, H, P * BN_H):
            rn = n0 + tl.arange(0, BN_H)
            nm = rn < H
            if HAS_PROJ:
                acc = _matvec(e_ptr, win_ptr, n0, 1.0, win_ptr, H, E, BN_H, BK_E, False)
                acc += tl.load(bin_ptr + rn, mask=nm, other=0.0).to(tl.float32)
                tl.store(x_ptr + rn, acc.to(dt), mask=nm)
            else:
                tl.store(x_ptr + rn, tl.load(e_ptr + rn, mask=nm, other=0.0), mask=nm)
        t += 1
        _grid_sync(bar_ptr, t * P, SPIN_NS)
        for layer in range(L):
            n1 = tl.load(n1_ptrs + layer).to(tl.pointer_type(dt))
            wqkv = tl.load(qkv_ptrs + layer).to(tl.pointer_type(dt))
            qkn = tl.load(qkn_ptrs + layer).to(tl.pointer_type(dt))
            wo = tl.load(o_ptrs + layer).to(tl.pointer_type(dt))
            n2 = tl.load(n2_ptrs + layer).to(tl.pointer_type(dt))
            wgu = tl.load(gu_ptrs + layer).to(tl.pointer_type(dt))
            wdn = tl.load(dn_ptrs + layer).to(tl.pointer_type(dt))
            # q/k/v = W_qkv rms_norm(x)
            _prefetch(wo, pid * BN_H, H, NO, BN_H, KL_O, LINE, PREFETCH)
            r = _rms(x_ptr, eps, H, BH)
            for n0 in range(pid * BN_QKV, NQKV, P * BN_QKV):
                rn = n0 + tl.arange(0, BN_QKV)
                acc = _matvec(x_ptr, wqkv, n0, r, n1, NQKV, H, BN_QKV, BK_H, True)
                tl.store(qkv_ptr + rn, acc.to(dt), mask=rn < NQKV)
            t += 1
            _grid_sync(bar_ptr, t * P, SPIN_NS)
            # attention, one kv head a program
            _prefetch(wgu, pid * BN_I, I, H, BN_I, KL_H, LINE, PREFETCH)
            _prefetch(wgu + I * H, pid * BN_I, I, H, BN_I, KL_H, LINE, PREFETCH)
            for kvh in range(pid, HKV, P):
                lc = layer * HKV * S * D
                _attend(qkv_ptr, qkn, cos_ptr, sin_ptr, kc_ptr + lc, vc_ptr + lc, o_ptr, kvh, p, eps, scale,
                        HQ, HKV, D, S, G, GP)  # fmt: skip
            t += 1
            _grid_sync(bar_ptr, t * P, SPIN_NS)
            # x += W_o o
            _prefetch(wdn, pid * BN_H, H, I, BN_H, KL_I, LINE, PREFETCH)
            for n0 in range(pid * BN_H, H, P * BN_H):
                rn = n0 + tl.arange(0, BN_H)
                nm = rn < H
                d = _matvec(o_ptr, wo, n0, 1.0, wo, H, NO, BN_H, BK_O, False).to(dt).to(tl.float32)
                _add_to(x_ptr, rn, nm, d)
            t += 1
            _grid_sync(bar_ptr, t * P, SPIN_NS)
            # act = silu(gate) * up of W_gu rms_norm(x)
            r = _rms(x_ptr, eps, H, BH)
            for n0 in range(pid * BN_I, I, P * BN_I):
                rn = n0 + tl.arange(0, BN_I)
                gate = _matvec(x_ptr, wgu, n0, r, n2, I, H, BN_I, BK_H, True).to(dt).to(tl.float32)
                up = _matvec(x_ptr, wgu + I * H, n0, r, n2, I, H, BN_I, BK_H, True).to(dt).to(tl.float32)
                act = (gate * tl.sigmoid(gate)).to(dt).to(tl.float32) * up
                tl.store(act_ptr + rn, act.to(dt), mask=rn < I)
            t += 1
            _grid_sync(bar_ptr, t * P, SPIN_NS)
            # x += W_down act
            if layer + 1 < L:
                nxt = tl.load(qkv_ptrs + layer + 1).to(tl.pointer_type(dt))
                _prefetch(nxt, pid * BN_QKV, NQKV, H, BN_QKV, KL_H, LINE, PREFETCH)
            elif p < STEPS:
                nxt = tl.load(head_ptrs + p).to(tl.pointer_type(dt))
                _prefetch(nxt, pid * BN_V, V, H, BN_V, KL_H, LINE, PREFETCH)
            for n0 in range(pid * BN_H, H, P * BN_H):
                rn = n0 + tl.arange(0, BN_H)
                nm = rn < H
                d = _matvec(act_ptr, wdn, n0, 1.0, wdn, H, I, BN_H, BK_I, False).to(dt).to(tl.float32)
                _add_to(x_ptr, rn, nm, d)
            t += 1
            _grid_sync(bar_ptr, t * P, SPIN_NS)
        if p > 0:
            # logits of code p = head[p - 1] rms_norm(x), then the sampler in program 0
            if HAS_PROJ:
                _prefetch(win_ptr, pid * BN_H, H, E, BN_H, KL_E, LINE, PREFETCH)
            whead = tl.load(head_ptrs + p - 1).to(tl.pointer_type(dt))
            r = _rms(x_ptr, eps, H, BH)
            for n0 in range(pid * BN_V, V, P * BN_V):
                rn = n0 + tl.arange(0, BN_V)
                acc = _matvec(x_ptr, whead, n0, r, fn_ptr, V, H, BN_V, BK_H, True)
                tl.store(logits_ptr + rn, acc.to(dt), mask=rn < V)
            t += 1
            _grid_sync(bar_ptr, t * P, SPIN_NS)
            if pid == 0:
                if HAS_NOISE:
                    tok = sample_row(logits_ptr, noise_ptr + (p - 1) * noise_stride, ds_ptr, temp_ptr, topk_ptr,
                                     topp_ptr, V, BV, ".cg")  # fmt: skip
                else:
                    offs = tl.arange(0, BV)
                    lg = tl.load(logits_ptr + offs, mask=offs < V, other=float("-inf"), cache_modifier=".cg")
                    tok = tl.argmax(lg.to(tl.float32), axis=0, tie_break_left=True)
                tl.store(codes_ptr + p - 1, tok.to(tl.int64))
            t += 1
            _grid_sync(bar_ptr, t * P, SPIN_NS)


def _addresses(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    for w in tensors:
        if not w.is_contiguous():
            raise ValueError("the predictor kernel reads contiguous weights")
    return torch.tensor([w.data_ptr() for w in tensors], dtype=torch.int64, device=device)


def _tile(n: int, programs: int) -> int:
    """Output columns a program takes so that ``programs`` programs cover ``n`` (a power of two)."""
    return max(2, triton.next_power_of_2(triton.cdiv(n, programs)))


def _lines(k: int, line: int) -> int:
    """Prefetch addresses a weight row of ``k`` elements takes, ``line`` elements each (a power of two)."""
    return triton.next_power_of_2(triton.cdiv(k, line))


@functools.cache
def _multiprocessors(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


@dataclass(slots=True)
class _Scratch:
    x: torch.Tensor
    qkv: torch.Tensor
    o: torch.Tensor
    act: torch.Tensor
    logits: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    barrier: torch.Tensor


class PredictorKernel:
    """The code predictor's frame for one row in one launch; built over a :class:`CodePredictor` whose layers
    run fused (their q/k/v, gate/up and q/k-norm weights concatenated), on the device of its weights.

    The weights are read where they lie (their addresses in small tables), so they must not move afterwards,
    as :meth:`DecoderLayer.use_kernels` already requires. ``programs``: the grid (default: one per
    multiprocessor, at most :data:`MAX_PROGRAMS`; the interpreter: 1).
    """

    def __init__(
        self,
        predictor: torch.nn.Module,
        programs: int | None = None,
        num_warps: int = 8,
        spin_ns: int = 0,
        block_k: int = BLOCK_K,
    ) -> None:
        from omni_stream.models.qwen3_tts.code_predictor import CACHE_LEN, STEPS, CodePredictor
        from omni_stream.runtime.decoder import DecoderLayer

        assert isinstance(predictor, CodePredictor)
        m, d = predictor.model, predictor.cfg
        layers = [layer for layer in m.layers if isinstance(layer, DecoderLayer)]
        if any(x.qkv_weight is None or x.gate_up_weight is None or x.qk_norm_weight is None for x in layers):
            raise ValueError("the predictor kernel needs the fused layers' weights (DecoderLayer.use_kernels)")
        w0 = layers[0].qkv_weight
        assert w0 is not None
        self.device, self.dtype = w0.device, w0.dtype
        self.steps, self.cache_len = STEPS, CACHE_LEN
        self.predictor = predictor
        proj = predictor.small_to_mtp_projection
        self.proj = proj if isinstance(proj, torch.nn.Linear) else None
        heads = [cast(torch.Tensor, h.weight) for h in predictor.lm_head]
        tables = [cast(torch.Tensor, t.weight) for t in m.codec_embedding]

        def each(pick) -> torch.Tensor:  # type: ignore[no-untyped-def]
            return _addresses([pick(x) for x in layers], self.device)

        self.n1 = each(lambda x: x.input_layernorm.weight)
        self.qkv = each(lambda x: x.qkv_weight)
        self.qkn = each(lambda x: x.qk_norm_weight)
        self.o = each(lambda x: x.self_attn.o_proj.weight)
        self.n2 = each(lambda x: x.post_attention_layernorm.weight)
        self.gu = each(lambda x: x.gate_up_weight)
        self.dn = each(lambda x: x.mlp.down_proj.weight)
        self.heads = _addresses(heads, self.device)
        self.tables = _addresses(tables, self.device)
        self.final_norm = m.norm.weight
        self.eps = m.norm.eps
        self.width = int(tables[0].shape[1])  # the talker's width (the input projection's)
        self.hidden, self.inter = d.hidden_size, d.intermediate_size
        self.hq, self.hkv, self.head_dim = d.num_attention_heads, d.num_key_value_heads, d.head_dim
        self.vocab, self.layers = int(heads[0].shape[0]), len(layers)
        interpreted = self.device.type != "cuda"
        if programs is None:
            programs = 1 if interpreted else min(MAX_PROGRAMS, _multiprocessors(self.device.index or 0))
        self.programs = programs
        self.num_warps = num_warps
        self.spin_ns = 0 if interpreted else spin_ns
        self.block_k = block_k
        self.prefetch = not interpreted
        nqkv = (self.hq + 2 * self.hkv) * self.head_dim

        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, device=self.device, dtype=self.dtype)

        cache = (self.layers, self.hkv, CACHE_LEN, self.head_dim)
        self.scratch = _Scratch(
            x=zeros(self.hidden),
            qkv=zeros(nqkv),
            o=zeros(self.hq * self.head_dim),
            act=zeros(self.inter),
            logits=zeros(self.vocab),
            k=zeros(*cache),
            v=zeros(*cache),
            barrier=torch.zeros(1, dtype=torch.int32, device=self.device),
        )

    def _slice(self, k: int) -> int:
        return min(self.block_k, triton.next_power_of_2(k))

    def __call__(
        self, hidden: torch.Tensor, c0_embed: torch.Tensor, params: SamplingTensors, noise: torch.Tensor | None
    ) -> torch.Tensor:
        """Codes 1..15 ``[1, 15]`` (int64) as :meth:`CodePredictor.generate` for one row."""
        if hidden.shape[0] != 1 or c0_embed.shape[0] != 1:
            raise ValueError(f"the predictor kernel takes one row, got {hidden.shape[0]}")
        hidden, c0_embed = hidden.contiguous(), c0_embed.contiguous()
        cos, sin = self.predictor._tables(self.dtype, self.device)
        cos, sin = cos[0].contiguous(), sin[0].contiguous()
        if noise is not None:
            noise = noise[0]
            if noise.stride(-1) != 1:
                noise = noise.contiguous()
        codes = torch.empty(1, self.steps, dtype=torch.int64, device=self.device)
        s = self.scratch
        s.barrier.zero_()
        n, h, d = self.programs, self.hidden, self.head_dim
        line = max(1, LINE_BYTES // hidden.element_size())
        proj = self.proj
        win = proj.weight if proj is not None else hidden
        bias = proj.bias if proj is not None and proj.bias is not None else None
        if proj is not None and (bias is None or not win.is_contiguous()):
            raise ValueError("the predictor kernel expects a contiguous input projection with a bias")
        g = self.hq // self.hkv
        _frame_kernel[(n,)](
            hidden, c0_embed, win, bias if bias is not None else win, self.tables,
            self.n1, self.qkv, self.qkn, self.o, self.n2, self.gu, self.dn, self.final_norm, self.heads,
            cos, sin, noise if noise is not None else s.logits, noise.stride(0) if noise is not None else 0,
            params.do_sample.view(torch.uint8), params.temperature, params.top_k, params.top_p,
            s.x, s.qkv, s.o, s.act, s.logits, s.k, s.v, codes, s.barrier,
            self.eps, d**-0.5,
            E=self.width, H=h, I=self.inter, HQ=self.hq, HKV=self.hkv, D=d, V=self.vocab, L=self.layers,
            STEPS=self.steps, S=self.cache_len, P=n, HAS_PROJ=proj is not None, HAS_NOISE=noise is not None,
            PREFETCH=self.prefetch, LINE=line, BH=triton.next_power_of_2(h), BN_H=_tile(h, n),
            BN_QKV=_tile((self.hq + 2 * self.hkv) * d, n), BN_I=_tile(self.inter, n), BN_V=_tile(self.vocab, n),
            BK_E=self._slice(self.width), BK_H=self._slice(h), BK_O=self._slice(self.hq * d),
            BK_I=self._slice(self.inter), KL_E=_lines(self.width, line),
            KL_H=_lines(h, line), KL_O=_lines(self.hq * d, line), KL_I=_lines(self.inter, line),
            BV=triton.next_power_of_2(self.vocab), G=g, GP=max(2, triton.next_power_of_2(g)), SPIN_NS=self.spin_ns,
            num_warps=self.num_warps,
        )  # fmt: skip
        return codes
