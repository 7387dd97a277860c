"""Typed view of ``speech_tokenizer/config.json`` (12 Hz tokenizer: Mimi encoder + causal vocoder decoder)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omni_stream.errors import ConfigError

SPEECH_TOKENIZER_MODEL_TYPE = "qwen3_tts_tokenizer_12hz"


class JsonFields:
    """Reads typed fields from one JSON object; every error names the dotted field path."""

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where or 'config'} must be a JSON object, got {type(data).__name__}")
        self.data = data
        self.where = where

    def _path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def _get(self, key: str, default: Any) -> Any:
        if key in self.data and self.data[key] is not None:
            return self.data[key]
        if default is _REQUIRED:
            raise ConfigError(f"missing required field {self._path(key)!r}")
        return default

    def integer(self, key: str, default: Any = None, *, minimum: int = 1) -> int:
        value = self._get(key, _REQUIRED if default is None else default)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or int(value) != value
        ):
            raise ConfigError(f"field {self._path(key)!r} must be an integer, got {value!r}")
        if value < minimum:
            raise ConfigError(f"field {self._path(key)!r} must be >= {minimum}, got {value!r}")
        return int(value)

    def number(self, key: str, default: Any = None, *, positive: bool = True) -> float:
        value = self._get(key, _REQUIRED if default is None else default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(f"field {self._path(key)!r} must be a number, got {value!r}")
        if positive and value <= 0:
            raise ConfigError(f"field {self._path(key)!r} must be > 0, got {value!r}")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(f"field {self._path(key)!r} must be true or false, got {value!r}")
        return value

    def text(self, key: str, default: Any = None, *, choices: tuple[str, ...] | None = None) -> str:
        value = self._get(key, _REQUIRED if default is None else default)
        if not isinstance(value, str) or (choices is not None and value not in choices):
            allowed = f" (one of {', '.join(choices)})" if choices else ""
            raise ConfigError(f"field {self._path(key)!r} must be a string{allowed}, got {value!r}")
        return value

    def integers(self, key: str, default: Any = None) -> tuple[int, ...]:
        value = self._get(key, _REQUIRED if default is None else default)
        if (
            not isinstance(value, list | tuple)
            or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
        ):
            raise ConfigError(f"field {self._path(key)!r} must be a non-empty list of positive integers, got {value!r}")
        return tuple(int(v) for v in value)

    def sub(self, key: str) -> JsonFields:
        return JsonFields(self._get(key, _REQUIRED), self._path(key))


_REQUIRED = object()


@dataclass(slots=True, frozen=True)
class CodecDecoderConfig:
    """The 12 Hz decoder: split RVQ -> causal conv -> sliding-window transformer -> ConvNeXt/SnakeBeta vocoder."""

    codebook_size: int
    codebook_dim: int
    num_quantizers: int
    latent_dim: int
    hidden_size: int
    head_dim: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    num_hidden_layers: int
    sliding_window: int
    rope_theta: float
    rms_norm_eps: float
    layer_scale_initial_scale: float
    max_position_embeddings: int
    decoder_dim: int
    upsample_rates: tuple[int, ...]
    upsampling_ratios: tuple[int, ...]
    attention_bias: bool = False

    @property
    def samples_per_frame(self) -> int:
        """Output samples per codec frame (1920 on the hub checkpoints)."""
        return math.prod(self.upsample_rates) * math.prod(self.upsampling_ratios)

    @classmethod
    def from_dict(cls, data: Any, where: str = "decoder_config") -> CodecDecoderConfig:
        f = JsonFields(data, where)
        hidden_act = f.text("hidden_act", "silu")
        if hidden_act != "silu":
            raise ConfigError(f"field {where + '.hidden_act'!r} must be 'silu', got {hidden_act!r}")
        cfg = cls(
            codebook_size=f.integer("codebook_size"),
            # codebook_dim and head_dim have no usable class default (QWEN3_TTS.md pitfall 14): required
            codebook_dim=f.integer("codebook_dim"),
            num_quantizers=f.integer("num_quantizers", minimum=2),
            latent_dim=f.integer("latent_dim"),
            hidden_size=f.integer("hidden_size"),
            head_dim=f.integer("head_dim"),
            num_attention_heads=f.integer("num_attention_heads"),
            num_key_value_heads=f.integer("num_key_value_heads"),
            intermediate_size=f.integer("intermediate_size"),
            num_hidden_layers=f.integer("num_hidden_layers"),
            sliding_window=f.integer("sliding_window"),
            rope_theta=f.number("rope_theta", 10000.0),
            rms_norm_eps=f.number("rms_norm_eps", 1e-5),
            layer_scale_initial_scale=f.number("layer_scale_initial_scale", 0.01),
            max_position_embeddings=f.integer("max_position_embeddings", 8000),
            decoder_dim=f.integer("decoder_dim"),
            upsample_rates=f.integers("upsample_rates"),
            upsampling_ratios=f.integers("upsampling_ratios"),
            attention_bias=f.flag("attention_bias", False),
        )
        if cfg.codebook_dim % 2:
            raise ConfigError(f"field {where + '.codebook_dim'!r} must be even, got {cfg.codebook_dim}")
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise ConfigError(
                f"field {where + '.num_key_value_heads'!r} must divide num_attention_heads "
                f"({cfg.num_attention_heads}), got {cfg.num_key_value_heads}"
            )
        if cfg.decoder_dim % 2 ** len(cfg.upsample_rates):
            raise ConfigError(
                f"field {where + '.decoder_dim'!r} must be divisible by 2**len(upsample_rates), got {cfg.decoder_dim}"
            )
        return cfg


@dataclass(slots=True, frozen=True)
class MimiEncoderConfig:
    """The Mimi encoder subset used for reference-audio encoding (SEANet, transformer, downsample, split RVQ)."""

    sampling_rate: int
    audio_channels: int
    hidden_size: int
    num_filters: int
    num_residual_layers: int
    upsampling_ratios: tuple[int, ...]
    kernel_size: int
    last_kernel_size: int
    residual_kernel_size: int
    dilation_growth_rate: int
    pad_mode: str
    compress: int
    use_conv_shortcut: bool
    codebook_size: int
    codebook_dim: int
    num_quantizers: int
    num_semantic_quantizers: int
    vector_quantization_hidden_dimension: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    norm_eps: float
    rope_theta: float
    layer_scale_initial_scale: float
    frame_rate: float
    attention_bias: bool = False

    @property
    def hop_length(self) -> int:
        """Samples per SEANet step (960 on the hub: 25 Hz before the x2 downsample)."""
        return math.prod(self.upsampling_ratios)

    @property
    def downsample_kernel(self) -> int:
        """Kernel of the stride-2 frame-rate conv (4 on the hub: 25 Hz -> 12.5 Hz)."""
        encodec_rate = math.ceil(self.sampling_rate / self.hop_length)
        return 2 * int(encodec_rate / self.frame_rate)

    @classmethod
    def from_dict(cls, data: Any, where: str = "encoder_config") -> MimiEncoderConfig:
        f = JsonFields(data, where)
        if not f.flag("use_causal_conv", True):
            raise ConfigError(f"field {where + '.use_causal_conv'!r} must be true (the 12 Hz encoder is causal)")
        hidden_act = f.text("hidden_act", "gelu")
        if hidden_act != "gelu":
            raise ConfigError(f"field {where + '.hidden_act'!r} must be 'gelu', got {hidden_act!r}")
        hidden = f.integer("hidden_size", 512)
        heads = f.integer("num_attention_heads", 8)
        rope = data.get("rope_parameters") if isinstance(data.get("rope_parameters"), Mapping) else {}
        theta = data.get("rope_theta", rope.get("rope_theta", 10000.0))
        frame_rate = data.get("frame_rate", data.get("_frame_rate", 12.5))
        cfg = cls(
            sampling_rate=f.integer("sampling_rate", 24000),
            audio_channels=f.integer("audio_channels", 1),
            hidden_size=hidden,
            num_filters=f.integer("num_filters", 64),
            num_residual_layers=f.integer("num_residual_layers", 1),
            upsampling_ratios=f.integers("upsampling_ratios", [8, 6, 5, 4]),
            kernel_size=f.integer("kernel_size", 7),
            last_kernel_size=f.integer("last_kernel_size", 3),
            residual_kernel_size=f.integer("residual_kernel_size", 3),
            dilation_growth_rate=f.integer("dilation_growth_rate", 2),
            pad_mode=f.text("pad_mode", "constant", choices=("constant", "replicate", "reflect")),
            compress=f.integer("compress", 2),
            use_conv_shortcut=f.flag("use_conv_shortcut", False),
            codebook_size=f.integer("codebook_size", 2048),
            codebook_dim=f.integer("codebook_dim", 256),
            num_quantizers=f.integer("num_quantizers", 32, minimum=2),
            num_semantic_quantizers=f.integer("num_semantic_quantizers", 1),
            vector_quantization_hidden_dimension=f.integer("vector_quantization_hidden_dimension", 256),
            num_hidden_layers=f.integer("num_hidden_layers", 8),
            intermediate_size=f.integer("intermediate_size", 2048),
            num_attention_heads=heads,
            num_key_value_heads=f.integer("num_key_value_heads", heads),
            head_dim=f.integer("head_dim", hidden // heads),
            max_position_embeddings=f.integer("max_position_embeddings", 8000),
            norm_eps=f.number("norm_eps", 1e-5),
            rope_theta=JsonFields({"rope_theta": theta}, where).number("rope_theta"),
            layer_scale_initial_scale=f.number("layer_scale_initial_scale", 0.01),
            frame_rate=JsonFields({"frame_rate": frame_rate}, where).number("frame_rate"),
            attention_bias=f.flag("attention_bias", False),
        )
        if cfg.audio_channels != 1:
            raise ConfigError(f"field {where + '.audio_channels'!r} must be 1, got {cfg.audio_channels}")
        if cfg.num_semantic_quantizers >= cfg.num_quantizers:
            raise ConfigError(f"field {where + '.num_semantic_quantizers'!r} must be < num_quantizers")
        if cfg.codebook_dim != cfg.vector_quantization_hidden_dimension:
            raise ConfigError(
                f"field {where + '.codebook_dim'!r} must equal vector_quantization_hidden_dimension "
                f"({cfg.vector_quantization_hidden_dimension}), got {cfg.codebook_dim}"
            )
        if cfg.downsample_kernel != 4:
            # the downsample conv always has stride 2, so only a 2:1 SEANet-to-frame rate is consistent
            raise ConfigError(
                f"field {where + '.frame_rate'!r} must be half the SEANet rate "
                f"(sampling_rate / prod(upsampling_ratios)), got {cfg.frame_rate}"
            )
        return cfg


@dataclass(slots=True, frozen=True)
class SpeechTokenizerConfig:
    """Top level of ``speech_tokenizer/config.json``."""

    encoder: MimiEncoderConfig
    decoder: CodecDecoderConfig
    encoder_valid_num_quantizers: int
    input_sample_rate: int
    output_sample_rate: int
    decode_upsample_rate: int
    encode_downsample_rate: int

    @classmethod
    def from_dict(cls, data: Any) -> SpeechTokenizerConfig:
        f = JsonFields(data, "")
        model_type = f.text("model_type")
        if model_type != SPEECH_TOKENIZER_MODEL_TYPE:
            raise ConfigError(f"field 'model_type' must be {SPEECH_TOKENIZER_MODEL_TYPE!r}, got {model_type!r}")
        cfg = cls(
            encoder=MimiEncoderConfig.from_dict(f.sub("encoder_config").data),
            decoder=CodecDecoderConfig.from_dict(f.sub("decoder_config").data),
            encoder_valid_num_quantizers=f.integer("encoder_valid_num_quantizers", 16),
            input_sample_rate=f.integer("input_sample_rate", 24000),
            output_sample_rate=f.integer("output_sample_rate", 24000),
            decode_upsample_rate=f.integer("decode_upsample_rate", 1920),
            encode_downsample_rate=f.integer("encode_downsample_rate", 1920),
        )
        if cfg.decode_upsample_rate != cfg.decoder.samples_per_frame:
            raise ConfigError(
                f"field 'decode_upsample_rate' ({cfg.decode_upsample_rate}) must equal the decoder's "
                f"upsample_rates x upsampling_ratios product ({cfg.decoder.samples_per_frame})"
            )
        if cfg.encoder_valid_num_quantizers != cfg.decoder.num_quantizers:
            raise ConfigError(
                f"field 'encoder_valid_num_quantizers' ({cfg.encoder_valid_num_quantizers}) must equal "
                f"decoder_config.num_quantizers ({cfg.decoder.num_quantizers})"
            )
        if cfg.encoder_valid_num_quantizers > cfg.encoder.num_quantizers:
            raise ConfigError("field 'encoder_valid_num_quantizers' exceeds encoder_config.num_quantizers")
        if cfg.encoder.sampling_rate != cfg.input_sample_rate:
            raise ConfigError(
                f"field 'encoder_config.sampling_rate' ({cfg.encoder.sampling_rate}) must equal "
                f"input_sample_rate ({cfg.input_sample_rate})"
            )
        return cfg

    @classmethod
    def from_file(cls, path: str | Path) -> SpeechTokenizerConfig:
        """Parse ``speech_tokenizer/config.json``; raises ConfigError naming the bad field."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError(f"speech tokenizer config not found: {path}") from exc
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
        return cls.from_dict(data)
