"""Qwen3 decoder pieces shared by the talker, the code predictor and the causal LMs (hub parameter names).

The causal-LM family (:mod:`omni_stream.models.causal_lm`) builds Llama layers from the same class with
``qk_norm=False``: Llama is this decoder without the per-head q/k norms.

Numerics mirror the reference where it matters for token parity: RMSNorm normalizes in fp32, casts back,
then multiplies by the weight in the input dtype; rotary tables are built in fp32 and cast to the
activation dtype; attention softmax runs in fp32. Attention itself is delegated to an ``attend``
callable so one layer serves the slot-indexed talker cache and the per-frame code-predictor cache.
With kernels set (:meth:`DecoderLayer.use_kernels`, CUDA by default) :func:`run_layers` runs each layer as
:meth:`DecoderLayer.fused_forward`: the same function in ~12 launches
(:mod:`omni_stream.runtime.decoder_kernels`).
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from omni_stream.runtime.decoder_config import DecoderConfig
from omni_stream.runtime.decoder_kernels import DecodeKernels
from omni_stream.runtime.kv_cache import Attend, CacheAttend


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if x.is_cuda:
            # Same fp32 math in one fused kernel instead of five (the code predictor runs 300 norms a frame).
            return self.weight * F.rms_norm(x.to(torch.float32), (x.shape[-1],), eps=self.eps).to(dtype)
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class Rotary(nn.Module):
    """1-D rotary tables for arbitrary per-row positions (the talker's MRoPE with equal t/h/w ids is this)."""

    inv_freq: torch.Tensor

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions`` ``[B, T]`` -> (cos, sin) ``[B, T, head_dim]`` in ``dtype``."""
        freqs = positions.to(torch.float32)[..., None] * self.inv_freq.to(positions.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` ``[B, H, T, D]``, ``cos``/``sin`` ``[B, T, D]``."""
    cos, sin = cos[:, None], sin[:, None]
    return x * cos + _rotate_half(x) * sin


class SelfAttention(nn.Module):
    """Grouped-query attention; ``qk_norm``: per-head RMSNorm of q and k before rotary (Qwen3; Llama has none)."""

    def __init__(self, cfg: DecoderConfig, qk_norm: bool = True) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.n_heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.n_kv * d, bias=False)
        self.v_proj = nn.Linear(h, self.n_kv * d, bias=False)
        self.o_proj = nn.Linear(self.n_heads * d, h, bias=False)
        # Identity holds no parameters, so a Llama state dict has no q_norm/k_norm tensors.
        self.q_norm: nn.Module = RMSNorm(d, cfg.rms_norm_eps) if qk_norm else nn.Identity()
        self.k_norm: nn.Module = RMSNorm(d, cfg.rms_norm_eps) if qk_norm else nn.Identity()
        self.qk_norm = qk_norm

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend, layer: int
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.n_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, self.n_kv, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        o = attend(layer, q, k, v)
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig, qk_norm: bool = True) -> None:
        super().__init__()
        self.self_attn = SelfAttention(cfg, qk_norm)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.kernels: DecodeKernels | None = None
        self.qkv_weight: torch.Tensor | None = None
        self.gate_up_weight: torch.Tensor | None = None
        self.qk_norm_weight: torch.Tensor | None = None

    @torch.no_grad()
    def use_kernels(self, kernels: DecodeKernels | None) -> None:
        """Run the fused layer through ``kernels`` (:mod:`omni_stream.runtime.decoder_kernels`), or the modules
        again with None.

        The q/k/v and gate/up weights are concatenated once and the projections' parameters become views
        of the concatenations, so memory is not doubled and the state dict is unchanged. Call it once the
        weights are on their device (a later ``.to()`` would separate the views from the concatenations).
        """
        self.kernels = kernels
        if kernels is None or self.qkv_weight is not None:
            return
        a, m = self.self_attn, self.mlp
        self.qkv_weight = _concat_as_views(a.q_proj, a.k_proj, a.v_proj)
        self.gate_up_weight = _concat_as_views(m.gate_proj, m.up_proj)
        if a.qk_norm:
            self.qk_norm_weight = _concat_as_views(a.q_norm, a.k_norm, stack=True)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend, layer: int
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attend, layer)
        return x + self.mlp(self.post_attention_layernorm(x))

    def fused_forward(
        self,
        x: torch.Tensor,
        delta: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attend: Attend,
        layer: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer on residual ``x`` plus the previous layer's pending ``delta``; returns (residual, its delta).

        At most ``kernels.small_rows`` rows the projections go through ``kernels.small.linear``.
        """
        k = self.kernels
        assert k is not None and self.qkv_weight is not None and self.gate_up_weight is not None
        a, eps = self.self_attn, self.input_layernorm.eps
        b, t, _ = x.shape
        proj = k.small.linear if b * t <= k.small_rows else F.linear
        x, h = k.add_rms_norm(x, delta, self.input_layernorm.weight, eps)
        qkv = proj(h, self.qkv_weight)
        nq, nkv = a.n_heads * a.head_dim, a.n_kv * a.head_dim
        v = qkv[..., nq + nkv :].view(b, t, a.n_kv, a.head_dim).transpose(1, 2)
        if self.qk_norm_weight is not None and k.qk_norm_rope_kv is not None and isinstance(attend, CacheAttend):
            # k and v go into the cache from the kernel that makes them: no copy kernels
            q = k.qk_norm_rope_kv(qkv, self.qk_norm_weight, cos, sin, eps, a.n_heads, a.n_kv, attend.target(layer))
            read_one = k.decode_attention
            src = attend.source(layer) if t == 1 and read_one is not None else None
            if read_one is not None and src is not None:  # one token a row: read the cache where it lies
                o = read_one(q, src)  # already [B, 1, Hq * D]
            else:
                o = attend.read(layer, q.transpose(1, 2)).transpose(1, 2).reshape(b, t, nq)
        else:
            if self.qk_norm_weight is not None:
                q, kk = k.qk_norm_rope(qkv, self.qk_norm_weight, cos, sin, eps, a.n_heads, a.n_kv)
                q, kk = q.transpose(1, 2), kk.transpose(1, 2)
            else:  # no q/k norm (Llama): rotary alone, in torch
                q = apply_rope(qkv[..., :nq].view(b, t, a.n_heads, a.head_dim).transpose(1, 2), cos, sin)
                kk = apply_rope(qkv[..., nq : nq + nkv].view(b, t, a.n_kv, a.head_dim).transpose(1, 2), cos, sin)
            o = attend(layer, q, kk, v).transpose(1, 2).reshape(b, t, nq)
        x, h = k.add_rms_norm(x, proj(o, a.o_proj.weight), self.post_attention_layernorm.weight, eps)
        return x, proj(k.silu_mul(proj(h, self.gate_up_weight)), self.mlp.down_proj.weight)


def use_kernels(layers: nn.ModuleList, kernels: DecodeKernels | None) -> None:
    """:meth:`DecoderLayer.use_kernels` on every layer of a stack."""
    for layer in layers:
        assert isinstance(layer, DecoderLayer)
        layer.use_kernels(kernels)


def _concat_as_views(*modules: nn.Module, stack: bool = False) -> torch.Tensor:
    """Concatenate (or stack) the modules' weights and rebind each weight as a view of the result."""
    weights = [cast(torch.Tensor, m.weight).detach() for m in modules]
    fused = torch.stack(weights) if stack else torch.cat(weights)
    start = 0
    for i, m in enumerate(modules):
        n = weights[i].shape[0]
        m.weight = nn.Parameter(fused[i] if stack else fused[start : start + n], requires_grad=False)
        start += n
    return fused


def run_layers(
    layers: nn.ModuleList, norm: RMSNorm, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend
) -> torch.Tensor:
    """The decoder stack followed by its final norm (fused layers when the first layer has kernels)."""
    first = layers[0]
    if isinstance(first, DecoderLayer) and first.kernels is not None:
        delta = None
        for i, layer in enumerate(layers):
            assert isinstance(layer, DecoderLayer)
            x, delta = layer.fused_forward(x, delta, cos, sin, attend, i)
        return first.kernels.add_rms_norm(x, delta, norm.weight, norm.eps)[1]
    for i, layer in enumerate(layers):
        x = layer(x, cos, sin, attend, i)
    return norm(x)
