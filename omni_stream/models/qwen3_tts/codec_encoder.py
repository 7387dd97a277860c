"""Mimi-style encoder of the 12 Hz speech tokenizer (reference audio -> 16 codebooks), hub ``encoder.*`` names.

Only what encoding needs: SEANet conv encoder, causal transformer, stride-2 downsample, split RVQ encode.
Matches the reference as loaded by its tokenizer wrapper, which widens Mimi's attention window to
``max_position_embeddings`` (full causal attention in practice).
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .codec_config import MimiEncoderConfig
from .codec_transformer import grouped_attention, rope_cos_sin, rotate_half, window_mask


def extra_right_padding(length: int, kernel: int, stride: int, padding_total: int) -> int:
    """Right zero padding so the last window is complete (Encodec/Mimi ``pad_for_conv1d``)."""
    n_frames = math.ceil((length - kernel + padding_total) / stride + 1) - 1
    ideal = n_frames * stride + kernel - padding_total
    return ideal - length


class MimiConv1d(nn.Module):
    """Causal conv: ``k_eff - stride`` left padding plus the extra right padding, in ``pad_mode``."""

    def __init__(
        self,
        cin: int,
        cout: int,
        kernel: int,
        stride: int = 1,
        dilation: int = 1,
        bias: bool = True,
        pad_mode: str = "constant",
    ):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride, dilation=dilation, bias=bias)
        self.kernel = (kernel - 1) * dilation + 1
        self.stride = stride
        self.padding_total = self.kernel - stride
        self.pad_mode = pad_mode

    def forward(self, x: Tensor) -> Tensor:
        extra = extra_right_padding(x.shape[-1], self.kernel, self.stride, self.padding_total)
        pads = (self.padding_total, extra)
        if self.pad_mode == "reflect":
            # reflect needs length > pad: zero-extend first, as Encodec's _pad1d does
            short = max(pads) - x.shape[-1] + 1 if x.shape[-1] <= max(pads) else 0
            x = F.pad(F.pad(x, (0, short)), pads, mode="reflect")
            x = x[..., : x.shape[-1] - short]
        elif self.pad_mode == "constant":
            x = F.pad(x, pads)
        else:
            x = F.pad(x, pads, mode=self.pad_mode)
        return self.conv(x)


class SeanetResBlock(nn.Module):
    """ELU -> conv(k, dilation) -> ELU -> conv(1), identity shortcut. ``block.{1,3}`` are the convs."""

    def __init__(self, cfg: MimiEncoderConfig, dim: int, dilation: int):
        super().__init__()
        hidden = dim // cfg.compress
        self.block = nn.ModuleList(
            [
                nn.ELU(),
                MimiConv1d(dim, hidden, cfg.residual_kernel_size, dilation=dilation, pad_mode=cfg.pad_mode),
                nn.ELU(),
                MimiConv1d(hidden, dim, 1, pad_mode=cfg.pad_mode),
            ]
        )

    def forward(self, x: Tensor) -> Tensor:
        h = x
        for layer in self.block:
            h = layer(h)
        return x + h


class SeanetEncoder(nn.Module):
    def __init__(self, cfg: MimiEncoderConfig):
        super().__init__()
        layers: list[nn.Module] = [MimiConv1d(1, cfg.num_filters, cfg.kernel_size, pad_mode=cfg.pad_mode)]
        scale = 1
        for ratio in reversed(cfg.upsampling_ratios):
            dim = scale * cfg.num_filters
            layers += [SeanetResBlock(cfg, dim, cfg.dilation_growth_rate**j) for j in range(cfg.num_residual_layers)]
            layers += [nn.ELU(), MimiConv1d(dim, dim * 2, 2 * ratio, stride=ratio, pad_mode=cfg.pad_mode)]
            scale *= 2
        layers += [
            nn.ELU(),
            MimiConv1d(scale * cfg.num_filters, cfg.hidden_size, cfg.last_kernel_size, pad_mode=cfg.pad_mode),
        ]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class MimiAttention(nn.Module):
    def __init__(self, cfg: MimiEncoderConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=bias)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor) -> Tensor:
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        return self.o_proj(grouped_attention(q, k, v, mask))


class MimiMLP(nn.Module):
    def __init__(self, cfg: MimiEncoderConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class MimiLayerScale(nn.Module):
    def __init__(self, dim: int, init: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x


class MimiTransformerLayer(nn.Module):
    def __init__(self, cfg: MimiEncoderConfig):
        super().__init__()
        self.self_attn = MimiAttention(cfg)
        self.mlp = MimiMLP(cfg)
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.self_attn_layer_scale = MimiLayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = MimiLayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor) -> Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class MimiTransformer(nn.Module):
    def __init__(self, cfg: MimiEncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(MimiTransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, x: Tensor) -> Tensor:
        pos = torch.arange(x.shape[1], device=x.device)[None]
        cos, sin = rope_cos_sin(pos, self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        mask = window_mask(pos, pos, self.cfg.max_position_embeddings)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return x


class MimiCodebook(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        # buffers, not parameters, in Mimi; all three are stored in the checkpoint
        self.register_buffer("initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(size))
        self.register_buffer("embed_sum", torch.zeros(size, dim))

    embed_sum: Tensor
    cluster_usage: Tensor

    def table(self) -> Tensor:
        return self.embed_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class _MimiVQ(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.codebook = MimiCodebook(size, dim)


class MimiResidualVQ(nn.Module):
    def __init__(self, cfg: MimiEncoderConfig, n: int):
        super().__init__()
        self.layers = nn.ModuleList(_MimiVQ(cfg.codebook_size, cfg.codebook_dim) for _ in range(n))
        self.input_proj: nn.Module | None = None
        self.output_proj: nn.Module | None = None
        if cfg.vector_quantization_hidden_dimension != cfg.hidden_size:
            dim = cfg.vector_quantization_hidden_dimension
            self.input_proj = nn.Conv1d(cfg.hidden_size, dim, 1, bias=False)
            self.output_proj = nn.Conv1d(dim, cfg.hidden_size, 1, bias=False)

    def encode(self, x: Tensor, n: int) -> Tensor:
        """``x [B, hidden, T]`` -> codes ``[B, n, T]`` by greedy residual nearest-centroid search."""
        if self.input_proj is not None:
            x = self.input_proj(x)
        residual = x.transpose(1, 2)  # [B, T, D]
        codes = []
        for layer in self.layers[:n]:
            table = cast(_MimiVQ, layer).codebook.table()
            flat = residual.reshape(-1, residual.shape[-1])
            # torch.cdist exactly as Mimi calls it, so distance ties break the same way
            idx = torch.cdist(flat[None].float(), table[None].float(), p=2)[0].argmin(dim=-1)
            idx = idx.view(residual.shape[:-1])
            residual = residual - F.embedding(idx, table)
            codes.append(idx)
        return torch.stack(codes, dim=1)


class MimiSplitResidualVQ(nn.Module):
    def __init__(self, cfg: MimiEncoderConfig):
        super().__init__()
        self.semantic_residual_vector_quantizer = MimiResidualVQ(cfg, cfg.num_semantic_quantizers)
        self.acoustic_residual_vector_quantizer = MimiResidualVQ(cfg, cfg.num_quantizers - cfg.num_semantic_quantizers)
        self.n_semantic = cfg.num_semantic_quantizers

    def encode(self, x: Tensor, n: int) -> Tensor:
        # both stacks quantize the same embeddings (the acoustic one is not a residual of the semantic one)
        codes = self.semantic_residual_vector_quantizer.encode(x, self.n_semantic)
        if n > self.n_semantic:
            rest = self.acoustic_residual_vector_quantizer.encode(x, n - self.n_semantic)
            codes = torch.cat([codes, rest], dim=1)
        return codes


class MimiEncoder(nn.Module):
    """24 kHz mono audio -> 12.5 Hz codes. Submodule names follow the hub ``encoder.*`` weights."""

    def __init__(self, cfg: MimiEncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = SeanetEncoder(cfg)
        self.encoder_transformer = MimiTransformer(cfg)
        self.downsample = MimiConv1d(
            cfg.hidden_size, cfg.hidden_size, cfg.downsample_kernel, stride=2, bias=False, pad_mode="replicate"
        )
        self.quantizer = MimiSplitResidualVQ(cfg)

    def forward(self, audio: Tensor, num_quantizers: int) -> Tensor:
        """``audio [B, 1, T]`` -> codes ``[B, num_quantizers, frames]`` (frames before trimming)."""
        h = self.encoder(audio)
        h = self.encoder_transformer(h.transpose(1, 2)).transpose(1, 2)
        return self.quantizer.encode(self.downsample(h), num_quantizers)

    def encode(self, audio: Tensor, num_quantizers: int, samples_per_frame: int) -> Tensor:
        """float mono ``[T]`` at the encoder rate -> codes ``[ceil(T / samples_per_frame), num_quantizers]``."""
        if audio.dim() != 1 or audio.numel() == 0:
            raise ValueError(f"expected non-empty mono audio [T], got shape {tuple(audio.shape)}")
        weight = self.downsample.conv.weight
        x = audio.to(device=weight.device, dtype=weight.dtype)[None, None]
        codes = self.forward(x, num_quantizers)[0]
        n_frames = -(-audio.numel() // samples_per_frame)
        return codes[:, :n_frames].transpose(0, 1).contiguous()
