"""Qwen2.5-VL as modules named like the hub checkpoint: transformers' vision tower and our Qwen2 decoder.

Parameter names follow the hub's ``model.safetensors`` (``visual.patch_embed.proj``, ``visual.blocks.{i}.attn.qkv``,
``visual.merger.mlp.0``, ``model.embed_tokens``, ``model.layers.{i}.self_attn.q_proj`` (with bias), ...,
``model.norm``, ``lm_head``), so it loads name for name. The vision tower is transformers'
``Qwen2_5_VisionTransformerPretrainedModel`` built from ``vision_config`` (windowed attention, 2-D rotary, patch
merger): it runs once per image at prefill. The language model is the causal LM's decoder
(:class:`~omni_stream.models.causal_lm.model.CausalLM`: the shared layers, slot KV cache, batched decode) with
q/k/v biases and multimodal rotary positions.

Departure from the shared decoder: the fused CUDA layer kernels take no projection biases, so this family runs
the layers as modules (``fused=False``); its decode step is still one CUDA graph per bucket.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from omni_stream.errors import ConfigError
from omni_stream.models.causal_lm.model import CausalLM
from omni_stream.models.qwen_vl.config import QwenVLConfig, load_config
from omni_stream.runtime.decoder import SelfAttention, run_layers
from omni_stream.runtime.decoder_kernels import DecodeKernels
from omni_stream.runtime.kv_cache import Attend
from omni_stream.runtime.weights import init_dummy, load_safetensors, safetensors_files


def vision_tower(cfg: QwenVLConfig) -> nn.Module:
    """transformers' Qwen2.5-VL vision encoder at ``vision_config``'s sizes (random init; load weights after)."""
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    raw = cfg.vision.as_dict()
    known = {k: v for k, v in raw.items() if k in Qwen2_5_VLVisionConfig.__dataclass_fields__}
    try:
        vcfg = Qwen2_5_VLVisionConfig(**known)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config field vision_config: {exc}") from exc
    vcfg._attn_implementation = "sdpa"
    return Qwen2_5_VisionTransformerPretrainedModel(vcfg)


def _rope_axes(cfg: QwenVLConfig, device: torch.device | str | None) -> torch.Tensor:
    return torch.tensor([a for a, n in enumerate(cfg.mrope_section) for _ in range(n)], dtype=torch.long, device=device)


def _biased(linear: nn.Module) -> nn.Linear:
    assert isinstance(linear, nn.Linear)
    return nn.Linear(linear.in_features, linear.out_features, bias=True, device=linear.weight.device)


class QwenVLForGeneration(CausalLM):
    """Root of ``model.safetensors``: the causal LM's ``model``/``lm_head`` plus ``visual``.

    ``forward`` takes positions ``[3, B, T]`` (t, h, w: a prompt with images) or ``[B, T]`` (text positions, the
    same on all three axes; ``position_offset[:B]`` added where set: the runner's per-slot rotary deltas, so a
    decode step's ``length`` positions become ``length + delta``).
    """

    rope_axis: torch.Tensor

    def __init__(self, cfg: QwenVLConfig) -> None:
        super().__init__(cfg.text)
        self.vl_config = cfg
        for layer in self.model.layers:
            attn = layer.self_attn
            assert isinstance(attn, SelfAttention)
            attn.q_proj, attn.k_proj, attn.v_proj = _biased(attn.q_proj), _biased(attn.k_proj), _biased(attn.v_proj)
        self.visual = vision_tower(cfg)
        # Which rotary axis (t, h, w) each frequency of the rotary half follows.
        self.register_buffer("rope_axis", _rope_axes(cfg, None), persistent=False)
        self.position_offset: torch.Tensor | None = None

    def use_kernels(self, kernels: DecodeKernels | None) -> None:
        if kernels is not None:
            raise ValueError("Qwen2.5-VL's decoder layers have q/k/v biases, which the fused kernels do not take")

    def rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions`` ``[3, B, T]`` -> (cos, sin) ``[B, T, head_dim]`` in ``dtype`` (fp32 tables)."""
        inv = self.model.rotary.inv_freq.to(positions.device)
        freqs = positions.to(torch.float32)[..., None] * inv  # [3, B, T, D/2]
        index = self.rope_axis.to(positions.device).view(1, 1, 1, -1).expand(1, *freqs.shape[1:])
        picked = freqs.gather(0, index)[0]
        emb = torch.cat((picked, picked), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        if positions.dim() == 2:
            if self.position_offset is not None:
                positions = positions + self.position_offset[: positions.shape[0], None]
            positions = positions[None].expand(3, -1, -1)
        cos, sin = self.rotary(positions, x.dtype)
        return run_layers(self.model.layers, self.model.norm, x, cos, sin, attend)

    @torch.no_grad()
    def encode_images(self, patches: torch.Tensor, grids: torch.Tensor) -> torch.Tensor:
        """Patches ``[N, C * T * P * P]`` of images with ``grids`` ``[k, 3]`` -> LM embeddings ``[tokens, H]``
        (each image's merged patches in order)."""
        out: Any = self.visual(patches.to(self.model.embed_tokens.weight.dtype), grid_thw=grids)
        return out.pooler_output


def build_vl(cfg: QwenVLConfig, device: torch.device | str = "meta") -> QwenVLForGeneration:
    """The module tree without weights (``meta``: no memory)."""
    with torch.device(device):
        return QwenVLForGeneration(cfg)


def _set_rotary_tables(model: QwenVLForGeneration, device: torch.device | str) -> None:
    """The rotary tables are no checkpoint tensors: build them where the weights now live."""
    model.model.rotary.inv_freq = model.config.inv_freq().to(device)
    model.rope_axis = _rope_axes(model.vl_config, device)
    rot: Any = model.visual.rotary_pos_emb
    if hasattr(rot, "compute_axial_rope_parameters"):  # transformers >= 5.17 derives the table from the config
        inv_freq, _ = rot.compute_axial_rope_parameters(rot.config)
        rot.inv_freq = inv_freq.to(device)
        rot.original_inv_freq = rot.inv_freq.clone()
    else:
        dim, theta = rot.dim, rot.theta
        rot.inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))


def random_vl(cfg: QwenVLConfig, *, seed: int, dtype: torch.dtype, device: torch.device | str = "cpu",
              tiny: bool = False) -> QwenVLForGeneration:  # fmt: skip
    """Random weights at ``cfg``'s sizes (tiny: jittered norms and non-zero biases, so every part matters)."""
    model = build_vl(cfg, "meta")
    init_dummy(model, seed=seed, dtype=dtype, device=device, norm_jitter=0.1 if tiny else 0.0,
               bias_std=0.05 if tiny else 0.0)  # fmt: skip
    _set_rotary_tables(model, device)
    return model.eval()


def load_vl(
    model_dir: str | Path,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    load_format: str = "auto",
    seed: int = 0,
    config: QwenVLConfig | None = None,
) -> QwenVLForGeneration:
    """The model of ``model_dir`` (``load_format`` auto|safetensors|dummy; dummy reads no weight file)."""
    cfg = config if config is not None else load_config(model_dir)
    if load_format == "dummy":
        return random_vl(cfg, seed=seed, dtype=dtype or torch.bfloat16, device=device)
    if load_format not in ("auto", "safetensors"):
        raise ConfigError(f"load_format: must be auto, safetensors or dummy, got {load_format!r}")
    model = build_vl(cfg, "meta")
    ignore = ("lm_head.",) if cfg.text.tie_word_embeddings else ()
    load_safetensors(model, safetensors_files(model_dir), dtype=dtype, device=device, ignore_prefixes=ignore)
    _set_rotary_tables(model, device)
    return model.eval()
