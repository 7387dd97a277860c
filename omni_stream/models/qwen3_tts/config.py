"""Qwen3-TTS checkpoint config: the hub ``config.json`` and ``generation_config.json`` as validated dataclasses.

Class defaults of the reference config classes differ from every released checkpoint (codec ids, layer
counts, code groups), so nothing here has a model default: each value must come from the file, and a
missing or unsupported value raises :class:`ConfigError` naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from omni_stream.errors import ConfigError
from omni_stream.requests import SamplingParams
from omni_stream.runtime.decoder_config import DecoderConfig

MODEL_TYPE = "qwen3_tts"
TASK_TYPES = ("custom_voice", "voice_design", "base")
NUM_CODE_GROUPS = 16
CODEBOOK_SIZE = 2048
# Codec ids at and above vocab_size - 1024 are control ids (languages, speakers, tags): never sampled.
CONTROL_ID_SPAN = 1024


@dataclass(slots=True, frozen=True)
class TalkerConfig:
    """``talker_config``: the decoder plus the text track and codec control ids."""

    decoder: DecoderConfig
    text_vocab_size: int
    text_hidden_size: int
    num_code_groups: int
    codec_bos_id: int
    codec_eos_token_id: int
    codec_pad_id: int
    codec_think_id: int
    codec_nothink_id: int
    codec_think_bos_id: int
    codec_think_eos_id: int
    codec_language_id: Mapping[str, int]
    spk_id: Mapping[str, int]
    spk_is_dialect: Mapping[str, str | bool]


@dataclass(slots=True, frozen=True)
class Qwen3TTSConfig:
    """The whole checkpoint config (root ``config.json``)."""

    talker: TalkerConfig
    code_predictor: DecoderConfig
    speaker_encoder: Mapping[str, Any] | None  # Base only; parsed by the speaker encoder module
    tts_model_type: str  # custom_voice | voice_design | base
    tts_model_size: str  # "0b6" | "1b7" (the reference tests substrings of "0b6")
    tokenizer_type: str
    im_start_token_id: int
    im_end_token_id: int
    tts_pad_token_id: int
    tts_bos_token_id: int
    tts_eos_token_id: int
    raw: Mapping[str, Any]

    @property
    def speakers(self) -> tuple[str, ...]:
        """Built-in speaker names (CustomVoice only), lowercase, in config order."""
        return tuple(self.talker.spk_id)

    @property
    def languages(self) -> tuple[str, ...]:
        """Languages a request may name: ``auto`` plus every non-dialect language id, lowercase."""
        return ("auto", *(k for k in self.talker.codec_language_id if "dialect" not in k))

    @property
    def supports_instructions(self) -> bool:
        """False for the 0.6B CustomVoice wrapper, which drops ``instruct`` (substring test on the size)."""
        return self.tts_model_size not in "0b6"


@dataclass(slots=True, frozen=True)
class GenerationDefaults:
    """``generation_config.json``: sampling defaults for codebook 0 (talker) and 1..15 (sub-talker)."""

    do_sample: bool = True
    top_k: int = 50
    top_p: float = 1.0
    temperature: float = 0.9
    repetition_penalty: float = 1.05
    subtalker_dosample: bool = True
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    subtalker_temperature: float = 0.9
    max_new_tokens: int = 8192

    def talker_sampling(self) -> SamplingParams:
        """Codebook-0 sampling (repetition penalty included)."""
        return SamplingParams(self.do_sample, self.temperature, self.top_k, self.top_p, self.repetition_penalty)

    def subtalker_sampling(self) -> SamplingParams:
        """Codebooks 1..15 sampling (the reference applies no repetition penalty there)."""
        return SamplingParams(
            self.subtalker_dosample, self.subtalker_temperature, self.subtalker_top_k, self.subtalker_top_p, 1.0
        )


def _get(d: Mapping[str, Any], key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if key not in d or d[key] is None:
        raise ConfigError(f"config field {where}{key} is missing")
    value = d[key]
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise ConfigError(f"config field {where}{key} has type {type(value).__name__}, expected {typ}")
    return value


def _check(cond: bool, field: str, message: str) -> None:
    if not cond:
        raise ConfigError(f"config field {field}: {message}")


def _decoder(d: Mapping[str, Any], where: str) -> DecoderConfig:
    cfg = DecoderConfig(
        hidden_size=_get(d, "hidden_size", int, where),
        intermediate_size=_get(d, "intermediate_size", int, where),
        num_hidden_layers=_get(d, "num_hidden_layers", int, where),
        num_attention_heads=_get(d, "num_attention_heads", int, where),
        num_key_value_heads=_get(d, "num_key_value_heads", int, where),
        head_dim=_get(d, "head_dim", int, where),
        rms_norm_eps=_get(d, "rms_norm_eps", float, where),
        rope_theta=_get(d, "rope_theta", float, where),
        max_position_embeddings=_get(d, "max_position_embeddings", int, where),
        vocab_size=_get(d, "vocab_size", int, where),
    )
    for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "head_dim"):
        _check(getattr(cfg, name) > 0, where + name, "must be positive")
    _check(
        cfg.num_key_value_heads > 0 and cfg.num_attention_heads % cfg.num_key_value_heads == 0,
        where + "num_key_value_heads",
        f"{cfg.num_key_value_heads} must divide num_attention_heads {cfg.num_attention_heads}",
    )
    _check(cfg.head_dim % 2 == 0, where + "head_dim", "must be even (rotary embedding)")
    act = d.get("hidden_act", "silu")
    _check(act == "silu", where + "hidden_act", f"only 'silu' is supported, got {act!r}")
    _check(not d.get("attention_bias", False), where + "attention_bias", "biased attention is not supported")
    _check(not d.get("use_sliding_window", False), where + "use_sliding_window", "sliding window is not supported")
    return cfg


def _rope_scaling(d: Mapping[str, Any], head_dim: int, where: str) -> None:
    rs = d.get("rope_scaling") or d.get("rope_parameters")
    if rs is None:
        return
    field = where + "rope_scaling"
    _check(isinstance(rs, Mapping), field, "must be an object")
    rope_type = rs.get("rope_type", rs.get("type", "default"))
    _check(rope_type == "default", field + ".rope_type", f"only 'default' is supported, got {rope_type!r}")
    section = rs.get("mrope_section")
    if section is not None:
        # With identical t/h/w position ids (always the case for speech), interleaved MRoPE is plain 1-D RoPE;
        # the sections still have to describe the head or the checkpoint is not what we think it is.
        _check(
            isinstance(section, list) and sum(section) == head_dim // 2,
            field + ".mrope_section",
            f"{section} must sum to head_dim/2 = {head_dim // 2}",
        )


def _int_map(d: Any, field: str) -> Mapping[str, int]:
    _check(isinstance(d, Mapping), field, "must be an object")
    out: dict[str, int] = {}
    for k, v in d.items():
        _check(isinstance(v, int) and not isinstance(v, bool), f"{field}.{k}", "must be an integer id")
        out[str(k).lower()] = v
    return MappingProxyType(out)


def parse_config(d: Mapping[str, Any]) -> Qwen3TTSConfig:
    """Validate a hub-style ``config.json`` dict."""
    model_type = d.get("model_type", MODEL_TYPE)
    _check(model_type == MODEL_TYPE, "model_type", f"expected {MODEL_TYPE!r}, got {model_type!r}")
    t = _get(d, "talker_config", dict, "")
    cp = _get(t, "code_predictor_config", dict, "talker_config.")
    talker_dec = _decoder(t, "talker_config.")
    cp_dec = _decoder(cp, "talker_config.code_predictor_config.")
    _rope_scaling(t, talker_dec.head_dim, "talker_config.")
    _rope_scaling(cp, cp_dec.head_dim, "talker_config.code_predictor_config.")

    groups = _get(t, "num_code_groups", int, "talker_config.")
    _check(groups == NUM_CODE_GROUPS, "talker_config.num_code_groups", f"must be {NUM_CODE_GROUPS}, got {groups}")
    cp_groups = cp.get("num_code_groups", groups)
    _check(
        cp_groups == NUM_CODE_GROUPS,
        "talker_config.code_predictor_config.num_code_groups",
        f"must be {NUM_CODE_GROUPS}, got {cp_groups}",
    )
    _check(
        cp_dec.vocab_size == CODEBOOK_SIZE,
        "talker_config.code_predictor_config.vocab_size",
        f"must be {CODEBOOK_SIZE}, got {cp_dec.vocab_size}",
    )
    _check(
        talker_dec.vocab_size == CODEBOOK_SIZE + CONTROL_ID_SPAN,
        "talker_config.vocab_size",
        f"must be {CODEBOOK_SIZE + CONTROL_ID_SPAN}, got {talker_dec.vocab_size}",
    )
    w = "talker_config."
    ids = {
        k: _get(t, k, int, w)
        for k in (
            "codec_bos_id",
            "codec_eos_token_id",
            "codec_pad_id",
            "codec_think_id",
            "codec_nothink_id",
            "codec_think_bos_id",
            "codec_think_eos_id",
        )
    }
    for k, v in ids.items():
        _check(0 <= v < talker_dec.vocab_size, w + k, f"{v} is outside the codec vocabulary")
    languages = _int_map(_get(t, "codec_language_id", dict, w), w + "codec_language_id")
    spk_id = _int_map(t.get("spk_id") or {}, w + "spk_id")
    dialect_raw = t.get("spk_is_dialect") or {}
    _check(isinstance(dialect_raw, Mapping), w + "spk_is_dialect", "must be an object")
    dialect = {str(k).lower(): v for k, v in dialect_raw.items()}
    for name, value in dialect.items():
        if value is not False:
            _check(
                isinstance(value, str) and value.lower() in languages,
                f"{w}spk_is_dialect.{name}",
                f"{value!r} is not a key of codec_language_id",
            )
    talker = TalkerConfig(
        decoder=talker_dec,
        text_vocab_size=_get(t, "text_vocab_size", int, w),
        text_hidden_size=_get(t, "text_hidden_size", int, w),
        num_code_groups=groups,
        codec_language_id=languages,
        spk_id=spk_id,
        spk_is_dialect=MappingProxyType(dialect),
        **ids,
    )
    model_type_tts = _get(d, "tts_model_type", str, "")
    _check(model_type_tts in TASK_TYPES, "tts_model_type", f"must be one of {TASK_TYPES}, got {model_type_tts!r}")
    tokenizer_type = d.get("tokenizer_type", "qwen3_tts_tokenizer_12hz")
    _check(
        tokenizer_type == "qwen3_tts_tokenizer_12hz",
        "tokenizer_type",
        f"only the 12 Hz tokenizer is supported, got {tokenizer_type!r}",
    )
    spk_enc = d.get("speaker_encoder_config")
    if model_type_tts == "base":
        _check(isinstance(spk_enc, Mapping), "speaker_encoder_config", "is required for base checkpoints")
        assert isinstance(spk_enc, Mapping)
        enc_dim = spk_enc.get("enc_dim")
        _check(
            enc_dim == talker_dec.hidden_size,
            "speaker_encoder_config.enc_dim",
            f"{enc_dim} must equal talker hidden_size {talker_dec.hidden_size}",
        )
    cfg = Qwen3TTSConfig(
        talker=talker,
        code_predictor=cp_dec,
        speaker_encoder=MappingProxyType(dict(spk_enc)) if isinstance(spk_enc, Mapping) else None,
        tts_model_type=model_type_tts,
        tts_model_size=_get(d, "tts_model_size", str, ""),
        tokenizer_type=tokenizer_type,
        im_start_token_id=_get(d, "im_start_token_id", int, ""),
        im_end_token_id=_get(d, "im_end_token_id", int, ""),
        tts_pad_token_id=_get(d, "tts_pad_token_id", int, ""),
        tts_bos_token_id=_get(d, "tts_bos_token_id", int, ""),
        tts_eos_token_id=_get(d, "tts_eos_token_id", int, ""),
        raw=MappingProxyType(dict(d)),
    )
    for k in ("im_start_token_id", "im_end_token_id", "tts_pad_token_id", "tts_bos_token_id", "tts_eos_token_id"):
        v = getattr(cfg, k)
        _check(0 <= v < talker.text_vocab_size, k, f"{v} is outside the text vocabulary {talker.text_vocab_size}")
    if model_type_tts == "custom_voice":
        _check(len(spk_id) > 0, "talker_config.spk_id", "custom_voice checkpoints need at least one speaker")
    return cfg


def parse_generation_config(d: Mapping[str, Any]) -> GenerationDefaults:
    """Validate a ``generation_config.json`` dict; absent keys keep the reference defaults."""
    base = GenerationDefaults()
    kw: dict[str, Any] = {}
    for name in GenerationDefaults.__dataclass_fields__:
        if name in d and d[name] is not None:
            default = getattr(base, name)
            value = d[name]
            if isinstance(default, bool):
                _check(isinstance(value, bool), f"generation_config.{name}", "must be a boolean")
            elif isinstance(default, int):
                _check(isinstance(value, int) and not isinstance(value, bool), f"generation_config.{name}", "int")
            else:
                _check(isinstance(value, (int, float)), f"generation_config.{name}", "must be a number")
                value = float(value)
            kw[name] = value
    return GenerationDefaults(**kw)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path.name} not found in {path.parent}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path.name} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path.name} must hold a JSON object")
    return data


def load_config(model_dir: str | Path) -> Qwen3TTSConfig:
    """Read and validate ``<model_dir>/config.json``."""
    return parse_config(_read_json(Path(model_dir) / "config.json"))


def load_generation_defaults(model_dir: str | Path) -> GenerationDefaults:
    """Read ``<model_dir>/generation_config.json``; reference defaults when the file is absent."""
    path = Path(model_dir) / "generation_config.json"
    if not path.exists():
        return GenerationDefaults(max_new_tokens=2048)
    return parse_generation_config(_read_json(path))
