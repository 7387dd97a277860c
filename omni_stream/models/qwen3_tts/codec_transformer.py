"""The speech-tokenizer decoder's transformer (hub names): sliding-window causal attention with RoPE.

Keys are cached after RoPE in the streaming ``state`` (the last ``sliding_window - 1`` per layer), with each
row's frame count under ``POSITION_KEY``, so a windowed decode attends exactly as the whole-utterance one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .codec_config import CodecDecoderConfig

State = dict[str, Tensor]
POSITION_KEY = "position"  # [B] long: frames consumed so far by each row


class StatefulBlock(nn.Module):
    """A block that keeps per-request history between streaming windows under ``state[state_key]``."""

    state_key: str = ""

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Per-row state tensor shapes (without the batch dim)."""
        raise NotImplementedError


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # normalize in fp32, round to the activation dtype, then scale (QWEN3_TTS.md pitfall 10)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos/sin ``[B, 1, n, head_dim]`` for integer positions ``[B, n]``, built in fp32 then cast."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim))
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)[:, None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def window_mask(q_pos: Tensor, k_pos: Tensor, window: int) -> Tensor:
    """Bool ``[B, 1, n, m]``: key visible iff ``0 <= k_pos <= q_pos`` and within the last ``window`` positions."""
    q = q_pos[:, None, :, None]
    k = k_pos[:, None, None, :]
    return (k >= 0) & (k <= q) & (k > q - window)


def grouped_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """``q [B, H, N, D]`` over ``k, v [B, KV, M, D]`` (KV divides H) -> ``[B, N, H * D]``."""
    heads, kv_heads = q.shape[1], k.shape[1]
    if kv_heads != heads:
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=q.shape[-1] ** -0.5)
    b, _, n, _ = q.shape
    return out.transpose(1, 2).reshape(b, n, -1)


class CodecAttention(StatefulBlock):
    """MHA/GQA with RoPE, no q/k norm; attention width heads*head_dim may differ from hidden."""

    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.window = cfg.sliding_window
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=bias)

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        kv = (self.kv_heads, self.window - 1, self.head_dim)
        return {self.state_key + ".k": kv, self.state_key + ".v": kv}

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, state: State | None) -> Tensor:
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if state is not None:
            # keys are cached after RoPE; only the last window-1 can ever be seen again
            k = torch.cat([state[self.state_key + ".k"], k], dim=2)
            v = torch.cat([state[self.state_key + ".v"], v], dim=2)
            state[self.state_key + ".k"] = k[:, :, -(self.window - 1) :]
            state[self.state_key + ".v"] = v[:, :, -(self.window - 1) :]
        return self.o_proj(grouped_attention(q, k, v, mask))


class CodecMLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class CodecTransformerLayer(nn.Module):
    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.self_attn = CodecAttention(cfg)
        self.mlp = CodecMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, state: State | None) -> Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask, state))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class CodecTransformer(nn.Module):
    """latent -> hidden, sliding-window causal layers, RMSNorm, hidden -> latent; input/output ``[B, n, latent]``."""

    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.layers = nn.ModuleList(CodecTransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)

    def forward(self, x: Tensor, state: State | None) -> Tensor:
        n = x.shape[1]
        steps = torch.arange(n, device=x.device)
        if state is None:
            q_pos = steps[None]
            k_pos = q_pos
        else:
            start = state[POSITION_KEY]
            q_pos = start[:, None] + steps
            k_pos = start[:, None] + torch.arange(-(self.cfg.sliding_window - 1), n, device=x.device)
        h = self.input_proj(x)
        cos, sin = rope_cos_sin(q_pos, self.cfg.head_dim, self.cfg.rope_theta, h.dtype)
        mask = window_mask(q_pos, k_pos, self.cfg.sliding_window)
        for layer in self.layers:
            h = layer(h, cos, sin, mask, state)
        return self.output_proj(self.norm(h))
