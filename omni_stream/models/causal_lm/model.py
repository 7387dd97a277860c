"""The decoder-only LM (Qwen3 or Llama) as modules named like the hub checkpoint, plus loading.

Parameter names follow transformers' ``Qwen3ForCausalLM`` / ``LlamaForCausalLM`` (``model.embed_tokens``,
``model.layers.{i}.self_attn.q_proj``, ..., ``model.norm``, ``lm_head``), so a hub ``model.safetensors`` (or its
shards) loads name for name. The layers are the shared Qwen3 decoder layers
(:mod:`omni_stream.runtime.decoder`), built without q/k norms for Llama. With tied embeddings there is
no ``lm_head`` parameter: the logits use the embedding table (a stored ``lm_head.weight`` is then ignored).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from omni_stream.errors import ConfigError
from omni_stream.models.causal_lm.config import CausalLMConfig, load_config
from omni_stream.runtime.decoder import DecoderLayer, RMSNorm, Rotary, run_layers, use_kernels
from omni_stream.runtime.decoder_kernels import DecodeKernels
from omni_stream.runtime.kv_cache import Attend
from omni_stream.runtime.weights import init_dummy, load_safetensors, safetensors_files


class DecoderModel(nn.Module):
    """``model.*``: embeddings, the layer stack, the final norm and the rotary tables."""

    def __init__(self, cfg: CausalLMConfig) -> None:
        super().__init__()
        d = cfg.decoder
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(d, qk_norm=cfg.qk_norm) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta)


class CausalLM(nn.Module):
    """Root of ``model.safetensors``: ``forward`` gives final-normed hidden states, ``logits`` the next-token scores."""

    def __init__(self, cfg: CausalLMConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = DecoderModel(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def use_kernels(self, kernels: DecodeKernels | None) -> None:
        """Run the decoder layers fused through ``kernels`` (None: the modules)."""
        use_kernels(self.model.layers, kernels)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., H]`` -> ``[..., V]`` in the activation dtype."""
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        """Embeddings ``x`` ``[B, T, H]`` at ``positions`` ``[B, T]`` -> final-normed hidden states ``[B, T, H]``."""
        cos, sin = self.model.rotary(positions, x.dtype)
        return run_layers(self.model.layers, self.model.norm, x, cos, sin, attend)


def build_lm(cfg: CausalLMConfig, device: torch.device | str = "meta") -> CausalLM:
    """The module tree without weights (``meta``: no memory, for parameter counts and loads)."""
    with torch.device(device):
        return CausalLM(cfg)


def load_lm(
    model_dir: str | Path,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    load_format: str = "auto",
    seed: int = 0,
    config: CausalLMConfig | None = None,
) -> CausalLM:
    """The LM of ``model_dir`` (``load_format`` auto|safetensors|dummy; dummy reads no weight file)."""
    cfg = config if config is not None else load_config(model_dir)
    lm = build_lm(cfg, "meta")
    if load_format == "dummy":
        init_dummy(lm, seed=seed, dtype=dtype or torch.bfloat16, device=device)
    elif load_format in ("auto", "safetensors"):
        ignore = ("lm_head.",) if cfg.tie_word_embeddings else ()
        load_safetensors(lm, safetensors_files(model_dir), dtype=dtype, device=device, ignore_prefixes=ignore)
    else:
        raise ConfigError(f"load_format: must be auto, safetensors or dummy, got {load_format!r}")
    # The rotary table is no checkpoint tensor: build it where the weights now live, scaled per the config.
    lm.model.rotary.inv_freq = cfg.inv_freq().to(device)
    return lm.eval()
