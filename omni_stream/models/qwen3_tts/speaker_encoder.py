"""ECAPA-TDNN speaker encoder (Base checkpoints): 24 kHz audio -> x-vector of the talker's hidden size."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from omni_stream.errors import ConfigError

from .codec_config import JsonFields
from .mel import log_mel_spectrogram


@dataclass(slots=True, frozen=True)
class SpeakerEncoderConfig:
    """``speaker_encoder_config`` of the root ``config.json``."""

    mel_dim: int
    enc_dim: int
    enc_channels: tuple[int, ...]
    enc_kernel_sizes: tuple[int, ...]
    enc_dilations: tuple[int, ...]
    enc_attention_channels: int
    enc_res2net_scale: int
    enc_se_channels: int
    sample_rate: int

    @classmethod
    def from_dict(cls, data: Any, where: str = "speaker_encoder_config") -> SpeakerEncoderConfig:
        f = JsonFields(data, where)
        cfg = cls(
            mel_dim=f.integer("mel_dim", 128),
            enc_dim=f.integer("enc_dim"),
            enc_channels=f.integers("enc_channels", [512, 512, 512, 512, 1536]),
            enc_kernel_sizes=f.integers("enc_kernel_sizes", [5, 3, 3, 3, 1]),
            enc_dilations=f.integers("enc_dilations", [1, 2, 3, 4, 1]),
            enc_attention_channels=f.integer("enc_attention_channels", 128),
            enc_res2net_scale=f.integer("enc_res2net_scale", 8),
            enc_se_channels=f.integer("enc_se_channels", 128),
            sample_rate=f.integer("sample_rate", 24000),
        )
        n = len(cfg.enc_channels)
        if n < 3 or len(cfg.enc_kernel_sizes) != n or len(cfg.enc_dilations) != n:
            raise ConfigError(
                f"fields {where}.enc_channels/enc_kernel_sizes/enc_dilations must have one equal length >= 3"
            )
        if sum(cfg.enc_channels[1:-1]) != cfg.enc_channels[-1]:
            raise ConfigError(f"field {where + '.enc_channels'!r}: the last entry must be the sum of the middle ones")
        if any(c % cfg.enc_res2net_scale for c in cfg.enc_channels[:-1]):
            raise ConfigError(f"field {where + '.enc_res2net_scale'!r} must divide every enc_channels entry")
        if cfg.sample_rate != 24000 or cfg.mel_dim != 128:
            raise ConfigError(f"fields {where}.sample_rate/mel_dim must be 24000/128 (the fixed mel front end)")
        return cfg


def _same_conv(cin: int, cout: int, kernel: int = 1, dilation: int = 1) -> nn.Conv1d:
    # "same" length with reflect padding (left = total // 2), as the reference ECAPA uses everywhere
    return nn.Conv1d(cin, cout, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class TDNNBlock(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, dilation: int):
        super().__init__()
        self.conv = _same_conv(cin, cout, kernel, dilation)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.conv(x))


class Res2NetBlock(nn.Module):
    def __init__(self, channels: int, scale: int, kernel: int, dilation: int):
        super().__init__()
        self.scale = scale
        width = channels // scale
        self.blocks = nn.ModuleList(TDNNBlock(width, width, kernel, dilation) for _ in range(scale - 1))

    def forward(self, x: Tensor) -> Tensor:
        parts = torch.chunk(x, self.scale, dim=1)
        outs = [parts[0]]
        prev: Tensor | None = None
        for i in range(1, self.scale):
            prev = self.blocks[i - 1](parts[i] if prev is None else parts[i] + prev)
            outs.append(prev)
        return torch.cat(outs, dim=1)


class SEBlock(nn.Module):
    def __init__(self, channels: int, se_channels: int):
        super().__init__()
        self.conv1 = _same_conv(channels, se_channels)
        self.conv2 = _same_conv(se_channels, channels)

    def forward(self, x: Tensor) -> Tensor:
        gate = torch.sigmoid(self.conv2(torch.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gate


class SERes2NetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, scale: int, se_channels: int, kernel: int, dilation: int):
        super().__init__()
        self.tdnn1 = TDNNBlock(cin, cout, 1, 1)
        self.res2net_block = Res2NetBlock(cout, scale, kernel, dilation)
        self.tdnn2 = TDNNBlock(cout, cout, 1, 1)
        self.se_block = SEBlock(cout, se_channels)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


def _weighted_stats(x: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    mean = (w * x).sum(dim=2)
    std = torch.sqrt((w * (x - mean[..., None]).pow(2)).sum(dim=2).clamp(min=1e-12))
    return mean, std


class AttentiveStatsPooling(nn.Module):
    def __init__(self, channels: int, attention_channels: int):
        super().__init__()
        self.tdnn = TDNNBlock(channels * 3, attention_channels, 1, 1)
        self.conv = _same_conv(attention_channels, channels)

    def forward(self, x: Tensor) -> Tensor:
        frames = x.shape[-1]
        uniform = torch.full_like(x[:, :1], 1.0 / frames)
        mean, std = _weighted_stats(x, uniform)
        context = torch.cat([x, mean[..., None].expand_as(x), std[..., None].expand_as(x)], dim=1)
        attention = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = _weighted_stats(x, attention)
        return torch.cat([mean, std], dim=1)[..., None]


class SpeakerEncoder(nn.Module):
    """``mels [B, frames, 128]`` -> x-vectors ``[B, enc_dim]``; parameter names follow ``speaker_encoder.*``."""

    def __init__(self, cfg: SpeakerEncoderConfig):
        super().__init__()
        self.cfg = cfg
        ch, ks, ds = cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_dilations
        blocks: list[nn.Module] = [TDNNBlock(cfg.mel_dim, ch[0], ks[0], ds[0])]
        for i in range(1, len(ch) - 1):
            blocks.append(SERes2NetBlock(ch[i - 1], ch[i], cfg.enc_res2net_scale, cfg.enc_se_channels, ks[i], ds[i]))
        self.blocks = nn.ModuleList(blocks)
        self.mfa = TDNNBlock(ch[-1], ch[-1], ks[-1], ds[-1])
        self.asp = AttentiveStatsPooling(ch[-1], cfg.enc_attention_channels)
        self.fc = _same_conv(ch[-1] * 2, cfg.enc_dim)

    def forward(self, mels: Tensor) -> Tensor:
        h = mels.transpose(1, 2)
        outs = []
        for block in self.blocks:
            h = block(h)
            outs.append(h)
        h = self.mfa(torch.cat(outs[1:], dim=1))
        return self.fc(self.asp(h)).squeeze(-1)

    @torch.inference_mode()
    def embed(self, audio: Tensor) -> Tensor:
        """24 kHz float32 mono ``[T]`` -> x-vector ``[enc_dim]`` in the weight dtype (mel computed in fp32)."""
        if audio.dim() != 1 or audio.numel() < 1024:
            raise ValueError(f"expected mono audio [T] of at least 1024 samples, got shape {tuple(audio.shape)}")
        weight = self.fc.weight
        mels = log_mel_spectrogram(audio.float().to(weight.device)).transpose(1, 2)
        return self(mels.to(weight.dtype))[0]


def load_speaker_encoder(
    ckpt_dir: str | Path,
    config: SpeakerEncoderConfig | Mapping[str, Any],
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    load_format: Literal["auto", "dummy"] = "auto",
    *,
    seed: int = 0,
) -> SpeakerEncoder:
    """Build from ``speaker_encoder_config``; load the root checkpoint's ``speaker_encoder.*`` weights strictly."""
    cfg = config if isinstance(config, SpeakerEncoderConfig) else SpeakerEncoderConfig.from_dict(config)
    model = SpeakerEncoder(cfg)
    if load_format == "dummy":
        from .codec_checkpoint import randomize_speaker_encoder_

        randomize_speaker_encoder_(model, seed)
    elif load_format == "auto":
        from safetensors import safe_open

        from .codec import load_state_strict

        paths = sorted(Path(ckpt_dir).glob("model*.safetensors"))
        if not paths:
            raise ConfigError(f"no model*.safetensors under {ckpt_dir}")
        prefix = "speaker_encoder."
        tensors: dict[str, Tensor] = {}
        for path in paths:  # read only this module's tensors, not the whole talker
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():
                    if key.startswith(prefix):
                        tensors[key[len(prefix) :]] = f.get_tensor(key)
        load_state_strict(model, tensors, f"{ckpt_dir} (speaker_encoder.*)")
    else:
        raise ConfigError(f"load_format must be 'auto' or 'dummy', got {load_format!r}")
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)
