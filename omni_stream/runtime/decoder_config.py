"""The shape of a decoder stack, read from a checkpoint's config by each family that builds one (no torch here)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class DecoderConfig:
    """Shape of a Qwen3 / Llama decoder stack (the Qwen3-TTS talker and code predictor, the causal LMs)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int
