"""Qwen2.5-VL checkpoint config: ``config.json`` (language model, vision tower, special ids) and
``preprocessor_config.json`` (how images become patches), as dataclasses.

Both layouts of ``config.json`` are read: the hub's (text fields at the top, ``rope_scaling.mrope_section``,
``vision_config``) and transformers 5's (a nested ``text_config`` with ``rope_parameters``). The language model is
Qwen2: q/k/v projections with bias, no q/k norm, ``head_dim = hidden_size / num_attention_heads``, multimodal
rotary positions (three sections t/h/w of the rotary half, ``mrope_section``). What this implementation does not
run (sliding windows, other activations, a vision tower whose output width is not the LM's) raises
:class:`ConfigError` naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omni_stream.errors import ConfigError
from omni_stream.models.causal_lm.config import CausalLMConfig, RopeScaling

MODEL_TYPE = "qwen2_5_vl"
# CLIP's normalization, which Qwen2-VL's image processor uses by default.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(slots=True, frozen=True)
class VisionSpec:
    """The vision tower's shape that the image policy needs; ``raw`` is ``vision_config`` as stored (transformers'
    ``Qwen2_5_VLVisionConfig`` is built from it)."""

    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    out_hidden_size: int
    raw: tuple[tuple[str, Any], ...]

    def as_dict(self) -> dict[str, Any]:
        return dict(self.raw)


@dataclass(slots=True, frozen=True)
class QwenVLConfig:
    """``text``: the decoder's shape (runs on :class:`~omni_stream.models.causal_lm.model.CausalLM`'s modules);
    ``mrope_section``: rotary frequencies per (t, h, w) section, summing to ``head_dim / 2``."""

    text: CausalLMConfig
    mrope_section: tuple[int, int, int]
    vision: VisionSpec
    image_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int


@dataclass(slots=True, frozen=True)
class ImageSpec:
    """``preprocessor_config.json``: pixel bounds of a resized image (area, pixels), patch sizes and the
    normalization (per RGB channel, of values scaled to 0..1)."""

    min_pixels: int
    max_pixels: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    mean: tuple[float, float, float] = CLIP_MEAN
    std: tuple[float, float, float] = CLIP_STD

    @property
    def factor(self) -> int:
        """Resized sides are multiples of this (pixels): one merged patch."""
        return self.patch_size * self.merge_size


def _int(cfg: Mapping[str, Any], key: str, where: str = "config field ", default: int | None = None) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}{key}: must be a positive integer, got {value!r}")
    return value


def _number(cfg: Mapping[str, Any], key: str, default: float) -> float:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"config field {key}: must be a positive number, got {value!r}")
    return float(value)


def _text_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's fields: the top level, overlaid by a nested ``text_config`` (transformers 5)."""
    text = dict(cfg)
    nested = cfg.get("text_config")
    if isinstance(nested, Mapping):
        text.update(nested)
    return text


def _rope(text: Mapping[str, Any], head_dim: int) -> tuple[float, tuple[int, int, int]]:
    params = text.get("rope_parameters")
    scaling = params if isinstance(params, Mapping) else text.get("rope_scaling")
    if not isinstance(scaling, Mapping):
        raise ConfigError("config field rope_scaling: must be an object with mrope_section")
    theta = scaling.get("rope_theta", text.get("rope_theta", 1000000.0))
    if isinstance(theta, bool) or not isinstance(theta, int | float) or theta <= 0:
        raise ConfigError(f"config field rope_theta: must be a positive number, got {theta!r}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ("mrope", "default"):
        raise ConfigError(f"config field rope_scaling.type: must be mrope or default, got {kind!r}")
    section = scaling.get("mrope_section")
    if (
        not isinstance(section, list | tuple)
        or len(section) != 3
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in section)
        or sum(section) != head_dim // 2
    ):
        raise ConfigError(
            f"config field rope_scaling.mrope_section: must be three counts summing to head_dim / 2 "
            f"({head_dim // 2}), got {section!r}"
        )
    return float(theta), (int(section[0]), int(section[1]), int(section[2]))


def _vision(cfg: Mapping[str, Any], hidden: int) -> VisionSpec:
    raw = cfg.get("vision_config")
    if not isinstance(raw, Mapping):
        raise ConfigError("config field vision_config: must be an object")
    where = "config field vision_config."
    for key in ("depth", "hidden_size", "intermediate_size", "num_heads"):
        _int(raw, key, where)
    out = _int(raw, "out_hidden_size", where, 3584)
    if out != hidden:
        raise ConfigError(f"{where}out_hidden_size: must equal the LM's hidden_size ({hidden}), got {out}")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"{where}hidden_act: only silu is supported, got {act!r}")
    patch = _int(raw, "patch_size", where, 14)
    return VisionSpec(
        patch_size=patch,
        temporal_patch_size=_int(raw, "temporal_patch_size", where, 2),
        spatial_merge_size=_int(raw, "spatial_merge_size", where, 2),
        out_hidden_size=out,
        raw=tuple(sorted(raw.items())),
    )


def parse_config(cfg: Mapping[str, Any]) -> QwenVLConfig:
    """Validate a Qwen2.5-VL ``config.json`` dict."""
    if cfg.get("model_type") != MODEL_TYPE:
        raise ConfigError(f"config field model_type: must be {MODEL_TYPE}, got {cfg.get('model_type')!r}")
    text = _text_fields(cfg)
    if text.get("use_sliding_window"):
        raise ConfigError("config field use_sliding_window: true is not supported by the native Qwen2.5-VL")
    act = text.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"config field hidden_act: only silu is supported, got {act!r}")
    hidden = _int(text, "hidden_size")
    heads = _int(text, "num_attention_heads")
    kv_heads = _int(text, "num_key_value_heads", default=heads)
    if hidden % heads or heads % kv_heads:
        raise ConfigError(
            f"hidden_size ({hidden}) must be a multiple of num_attention_heads ({heads}), "
            f"and that of num_key_value_heads ({kv_heads})"
        )
    head_dim = hidden // heads
    theta, section = _rope(text, head_dim)
    eos = text.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (eos,) if isinstance(eos, int) else ()
    bos = text.get("bos_token_id")
    lm = CausalLMConfig(
        model_type=MODEL_TYPE,
        vocab_size=_int(text, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=_int(text, "intermediate_size"),
        num_hidden_layers=_int(text, "num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=_number(text, "rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=RopeScaling(),
        max_position_embeddings=_int(text, "max_position_embeddings", default=32768),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        qk_norm=False,
        bos_token_id=bos if isinstance(bos, int) else None,
        eos_token_ids=tuple(int(i) for i in eos_ids),
    )
    return QwenVLConfig(
        text=lm,
        mrope_section=section,
        vision=_vision(cfg, hidden),
        image_token_id=_int(cfg, "image_token_id", default=151655),
        vision_start_token_id=_int(cfg, "vision_start_token_id", default=151652),
        vision_end_token_id=_int(cfg, "vision_end_token_id", default=151653),
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must hold a JSON object")
    return data


def load_config(model_dir: str | Path) -> QwenVLConfig:
    return parse_config(_read_json(Path(model_dir) / "config.json"))


def parse_image_spec(pre: Mapping[str, Any], vision: VisionSpec) -> ImageSpec:
    """``preprocessor_config.json``'s fields (transformers' defaults where absent); patch sizes must match the
    vision tower's."""
    where = "preprocessor_config.json "
    size = pre.get("size") if isinstance(pre.get("size"), Mapping) else {}
    assert isinstance(size, Mapping)
    min_pixels = _int(pre, "min_pixels", where, size.get("shortest_edge", 56 * 56))
    max_pixels = _int(pre, "max_pixels", where, size.get("longest_edge", 28 * 28 * 1280))
    if min_pixels > max_pixels:
        raise ConfigError(f"{where}min_pixels ({min_pixels}) exceeds max_pixels ({max_pixels})")
    spec = ImageSpec(
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        patch_size=_int(pre, "patch_size", where, vision.patch_size),
        temporal_patch_size=_int(pre, "temporal_patch_size", where, vision.temporal_patch_size),
        merge_size=_int(pre, "merge_size", where, vision.spatial_merge_size),
        mean=_triple(pre, "image_mean", CLIP_MEAN),
        std=_triple(pre, "image_std", CLIP_STD),
    )
    shape = (vision.patch_size, vision.temporal_patch_size, vision.spatial_merge_size)
    if (spec.patch_size, spec.temporal_patch_size, spec.merge_size) != shape:
        raise ConfigError(
            f"{where}patch_size, temporal_patch_size, merge_size: must match vision_config's {shape}, got "
            f"{(spec.patch_size, spec.temporal_patch_size, spec.merge_size)}"
        )
    return spec


def _triple(pre: Mapping[str, Any], key: str, default: tuple[float, float, float]) -> tuple[float, float, float]:
    value = pre.get(key, default)
    if not isinstance(value, list | tuple) or len(value) != 3 or not all(isinstance(v, int | float) for v in value):
        raise ConfigError(f"preprocessor_config.json {key}: must be three numbers (R, G, B), got {value!r}")
    return (float(value[0]), float(value[1]), float(value[2]))


def load_image_spec(model_dir: str | Path, vision: VisionSpec) -> ImageSpec:
    """``preprocessor_config.json`` of ``model_dir`` (absent: transformers' defaults at the tower's patch sizes)."""
    path = Path(model_dir) / "preprocessor_config.json"
    return parse_image_spec(_read_json(path) if path.exists() else {}, vision)
