"""Causal-LM checkpoint config: ``config.json`` (Qwen3 or Llama) and ``generation_config.json`` as dataclasses.

Defaults follow the transformers config classes of each architecture (``head_dim`` defaults to 128 for Qwen3,
to ``hidden_size / num_attention_heads`` for Llama); anything this implementation does not run (biases,
sliding windows, other activations and rotary types) raises :class:`ConfigError` naming the field, instead of
loading a model that would compute something else. Both the hub's legacy ``rope_theta`` + ``rope_scaling`` keys
and transformers 5's ``rope_parameters`` are read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omni_stream.errors import ConfigError
from omni_stream.requests import SamplingParams
from omni_stream.runtime.decoder_config import DecoderConfig

ARCHITECTURES = ("qwen3", "llama")
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(slots=True, frozen=True)
class RopeScaling:
    """Rotary frequency scaling: ``default`` (none), ``linear`` (positions / factor) or ``llama3`` (by wavelength)."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(slots=True, frozen=True)
class CausalLMConfig:
    """Shape of a decoder-only LM. ``qk_norm``: Qwen3's per-head q/k RMSNorm (Llama: none)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling
    max_position_embeddings: int
    tie_word_embeddings: bool
    qk_norm: bool
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def decoder(self) -> DecoderConfig:
        """The decoder-stack shape the shared Qwen3 layers are built from."""
        return DecoderConfig(
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            max_position_embeddings=self.max_position_embeddings,
            vocab_size=self.vocab_size,
        )

    def inv_freq(self) -> torch.Tensor:
        """Rotary inverse frequencies ``[head_dim / 2]`` (fp32), scaled as transformers scales them."""
        d = self.head_dim
        inv = 1.0 / (self.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        s = self.rope_scaling
        if s.rope_type == "linear":
            return inv / s.factor
        if s.rope_type != "llama3":
            return inv
        old = s.original_max_position_embeddings
        low_wavelen, high_wavelen = old / s.low_freq_factor, old / s.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / s.factor, inv)
        smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
        smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)


def _int(cfg: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"config field {key}: must be a positive integer, got {value!r}")
    return value


def _ids(value: Any, key: str) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, list | tuple) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ConfigError(f"{key}: must be a token id or a list of token ids, got {value!r}")
    return tuple(values)


def _rope(cfg: Mapping[str, Any]) -> tuple[float, RopeScaling]:
    params = cfg.get("rope_parameters")
    if isinstance(params, Mapping):  # transformers 5
        theta, scaling = params.get("rope_theta", cfg.get("rope_theta")), params
    else:
        theta, scaling = cfg.get("rope_theta", 10000.0), cfg.get("rope_scaling") or {}
    if not isinstance(theta, int | float) or theta <= 0:
        raise ConfigError(f"config field rope_theta: must be a positive number, got {theta!r}")
    if not isinstance(scaling, Mapping):
        raise ConfigError(f"config field rope_scaling: must be an object or null, got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ConfigError(f"config field rope_scaling.rope_type: {kind!r} is not supported (one of: {ROPE_TYPES})")
    d = RopeScaling()
    try:
        scaled = RopeScaling(
            rope_type=kind,
            factor=float(scaling.get("factor", d.factor)),
            low_freq_factor=float(scaling.get("low_freq_factor", d.low_freq_factor)),
            high_freq_factor=float(scaling.get("high_freq_factor", d.high_freq_factor)),
            original_max_position_embeddings=int(
                scaling.get("original_max_position_embeddings", d.original_max_position_embeddings)
            ),
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config field rope_scaling: {exc}") from exc
    return float(theta), scaled


def parse_config(cfg: Mapping[str, Any]) -> CausalLMConfig:
    """Validate a ``config.json`` dict of a Qwen3 or Llama checkpoint."""
    model_type = cfg.get("model_type")
    if model_type not in ARCHITECTURES:
        raise ConfigError(f"config field model_type: must be one of {ARCHITECTURES}, got {model_type!r}")
    for key in ("attention_bias", "mlp_bias", "use_sliding_window"):
        if cfg.get(key):
            raise ConfigError(f"config field {key}: true is not supported by the native {model_type} implementation")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"config field hidden_act: only silu is supported, got {act!r}")
    hidden = _int(cfg, "hidden_size")
    heads = _int(cfg, "num_attention_heads")
    kv_heads = _int(cfg, "num_key_value_heads", heads)
    if heads % kv_heads:
        raise ConfigError(f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})")
    default_head_dim = 128 if model_type == "qwen3" else hidden // heads
    head_dim = _int({"head_dim": cfg.get("head_dim") or default_head_dim}, "head_dim")
    theta, scaling = _rope(cfg)
    eps = cfg.get("rms_norm_eps", 1e-6)
    if not isinstance(eps, int | float) or eps <= 0:
        raise ConfigError(f"config field rms_norm_eps: must be a positive number, got {eps!r}")
    bos = cfg.get("bos_token_id")
    return CausalLMConfig(
        model_type=model_type,
        vocab_size=_int(cfg, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=_int(cfg, "intermediate_size"),
        num_hidden_layers=_int(cfg, "num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(eps),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=_int(cfg, "max_position_embeddings", 2048),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qk_norm=model_type == "qwen3",
        bos_token_id=bos if isinstance(bos, int) else None,
        eos_token_ids=_ids(cfg.get("eos_token_id"), "config field eos_token_id"),
    )


def load_config(model_dir: str | Path) -> CausalLMConfig:
    path = Path(model_dir) / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    return parse_config(data)


@dataclass(slots=True, frozen=True)
class GenerationDefaults:
    """``generation_config.json``: EOS ids and the default sampling (transformers' defaults where a key is absent)."""

    eos_token_ids: tuple[int, ...]
    sampling: SamplingParams


def parse_generation_config(gen: Mapping[str, Any], config: CausalLMConfig) -> GenerationDefaults:
    """EOS ids from ``gen`` (else ``config.json``'s); sampling as transformers' ``GenerationConfig`` defaults."""
    eos = _ids(gen.get("eos_token_id"), "generation_config eos_token_id") or config.eos_token_ids
    do_sample = bool(gen.get("do_sample", False))
    try:
        sampling = SamplingParams(
            do_sample=do_sample,
            temperature=float(gen.get("temperature", 1.0) or 1.0),
            top_k=int(gen.get("top_k", 50) or 0),
            top_p=float(gen.get("top_p", 1.0) or 1.0),
            repetition_penalty=float(gen.get("repetition_penalty", 1.0) or 1.0),
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"generation_config.json: {exc}") from exc
    return GenerationDefaults(eos, sampling)


def load_generation_defaults(model_dir: str | Path, config: CausalLMConfig) -> GenerationDefaults:
    """``generation_config.json`` of ``model_dir`` (absent: config.json's EOS ids and greedy decoding)."""
    path = Path(model_dir) / "generation_config.json"
    if not path.exists():
        return parse_generation_config({}, config)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    return parse_generation_config(data, config)
