"""Hub-layout configs and random weights for the speech tokenizer and speaker encoder (tests, dummy loads)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from .codec import SpeechTokenizer
from .codec_config import SPEECH_TOKENIZER_MODEL_TYPE, SpeechTokenizerConfig

_TOP = {
    "architectures": ["Qwen3TTSTokenizerV2Model"],
    "model_type": SPEECH_TOKENIZER_MODEL_TYPE,
    "encoder_valid_num_quantizers": 16,
    "input_sample_rate": 24000,
    "output_sample_rate": 24000,
    "decode_upsample_rate": 1920,
    "encode_downsample_rate": 1920,
}

# The hub values (Mimi encoder defaults as shipped; decoder per QWEN3_TTS.md section 1.9).
_REAL_ENCODER = {
    "sampling_rate": 24000,
    "frame_rate": 12.5,
    "_frame_rate": 12.5,
    "audio_channels": 1,
    "hidden_size": 512,
    "num_filters": 64,
    "num_residual_layers": 1,
    "upsampling_ratios": [8, 6, 5, 4],
    "kernel_size": 7,
    "last_kernel_size": 3,
    "residual_kernel_size": 3,
    "dilation_growth_rate": 2,
    "use_causal_conv": True,
    "pad_mode": "constant",
    "compress": 2,
    "trim_right_ratio": 1.0,
    "codebook_size": 2048,
    "codebook_dim": 256,
    "num_quantizers": 32,
    "use_conv_shortcut": False,
    "vector_quantization_hidden_dimension": 256,
    "num_semantic_quantizers": 1,
    "upsample_groups": 512,
    "num_hidden_layers": 8,
    "intermediate_size": 2048,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "hidden_act": "gelu",
    "max_position_embeddings": 8000,
    "norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 250,
    "layer_scale_initial_scale": 0.01,
    "attention_bias": False,
}
_REAL_DECODER = {
    "codebook_size": 2048,
    "codebook_dim": 512,
    "num_quantizers": 16,
    "latent_dim": 1024,
    "hidden_size": 512,
    "head_dim": 64,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "intermediate_size": 1024,
    "num_hidden_layers": 8,
    "sliding_window": 72,
    "rope_theta": 10000,
    "rms_norm_eps": 1e-05,
    "layer_scale_initial_scale": 0.01,
    "max_position_embeddings": 8000,
    "decoder_dim": 1536,
    "upsample_rates": [8, 5, 4, 3],
    "upsampling_ratios": [2, 2],
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
}

# Tiny sizes keep every structural trait of the real codec: 16 x 2048 codebooks, the 1920-sample hop,
# a 72-frame attention window, attention width (heads * head_dim = 64) != hidden (32), and 32 encoder quantizers.
_TINY_ENCODER = dict(
    _REAL_ENCODER,
    hidden_size=32,
    num_filters=4,
    codebook_dim=16,
    vector_quantization_hidden_dimension=16,
    upsample_groups=32,
    num_hidden_layers=1,
    intermediate_size=64,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=16,
)
_TINY_DECODER = dict(
    _REAL_DECODER,
    codebook_dim=16,
    latent_dim=32,
    hidden_size=32,
    head_dim=16,
    num_attention_heads=4,
    num_key_value_heads=4,
    intermediate_size=64,
    num_hidden_layers=2,
    decoder_dim=64,
)

_PREPROCESSOR = {
    "chunk_length_s": None,
    "feature_extractor_type": "EncodecFeatureExtractor",
    "feature_size": 1,
    "overlap": None,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": 24000,
}


def real_speech_tokenizer_config() -> dict[str, Any]:
    """The hub ``speech_tokenizer/config.json`` values (for dummy-weight benchmarks at real size)."""
    return dict(
        copy.deepcopy(_TOP), encoder_config=copy.deepcopy(_REAL_ENCODER), decoder_config=copy.deepcopy(_REAL_DECODER)
    )


def tiny_speech_tokenizer_config() -> dict[str, Any]:
    """A tiny config in hub layout (~1 M parameters) with the real frame geometry."""
    return dict(
        copy.deepcopy(_TOP), encoder_config=copy.deepcopy(_TINY_ENCODER), decoder_config=copy.deepcopy(_TINY_DECODER)
    )


@torch.no_grad()
def randomize_speech_tokenizer_(model: SpeechTokenizer, seed: int = 0) -> None:
    """Random weights giving audible, unclipped audio (QWEN3_TTS.md section 3.3 step 6); deterministic in ``seed``."""
    gen = torch.Generator().manual_seed(seed)

    def normal(t: torch.Tensor, std: float) -> None:
        t.copy_(torch.randn(t.shape, generator=gen) * std)

    for name, t in model.state_dict(keep_vars=True).items():
        if name.endswith(("embedding_sum", "embed_sum")):
            normal(t, 1.0)
        elif name.endswith("cluster_usage"):
            t.copy_(torch.rand(t.shape, generator=gen) * 1.5 + 0.5)
        elif name.endswith("codebook.initialized"):
            t.fill_(1.0)
        elif name.endswith((".alpha", ".beta")):
            normal(t, 0.1)
        elif name.endswith(("layer_scale.scale", ".gamma")):
            t.fill_(0.1)
        elif name.endswith("weight") and t.dim() >= 2:
            # dim 1 is fan-in per tap for Conv1d/Linear, and a proxy for it for ConvTranspose1d ([in, out, k])
            fan_in = t.shape[1] * (t.shape[2] if t.dim() == 3 else 1)
            # the decoder gain is very nonlinear in this scale: 0.77/sqrt(fan_in) gives rms ~0.03-0.13 audio, unclipped,
            # at tiny and at real size (0.7 gives ~1e-2, 0.8 starts clipping)
            gain = 0.77 if name.startswith("decoder.") else 1.0
            normal(t, gain / math.sqrt(fan_in))
        elif name.endswith("bias"):
            t.zero_()
        elif name.endswith("weight"):  # norms
            t.fill_(1.0)


def write_tiny_speech_tokenizer(out_dir: Path, seed: int = 0) -> None:
    """Write ``out_dir/speech_tokenizer/{config.json, model.safetensors (fp32), preprocessor_config.json}``."""
    directory = Path(out_dir) / "speech_tokenizer"
    directory.mkdir(parents=True, exist_ok=True)
    config = tiny_speech_tokenizer_config()
    model = SpeechTokenizer(SpeechTokenizerConfig.from_dict(config), with_encoder=True)
    randomize_speech_tokenizer_(model, seed)
    tensors = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(dict(config, dtype="float32"), indent=2) + "\n")
    (directory / "preprocessor_config.json").write_text(json.dumps(_PREPROCESSOR, indent=2) + "\n")


def tiny_speaker_encoder_config(enc_dim: int) -> dict[str, Any]:
    """A tiny ``speaker_encoder_config`` (ECAPA-TDNN, real mel front end) whose x-vector has ``enc_dim`` dims."""
    return {
        "mel_dim": 128,
        "enc_dim": enc_dim,
        "enc_channels": [32, 32, 32, 32, 96],
        "enc_kernel_sizes": [5, 3, 3, 3, 1],
        "enc_dilations": [1, 2, 3, 4, 1],
        "enc_attention_channels": 16,
        "enc_res2net_scale": 8,
        "enc_se_channels": 16,
        "sample_rate": 24000,
    }


@torch.no_grad()
def randomize_speaker_encoder_(model: nn.Module, seed: int = 0) -> None:
    """He-style random conv weights and small biases, deterministic in ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    for name, t in model.state_dict(keep_vars=True).items():
        if name.endswith("weight") and t.dim() == 3:
            t.copy_(torch.randn(t.shape, generator=gen) * math.sqrt(2.0 / (t.shape[1] * t.shape[2])))
        elif name.endswith("bias"):
            t.copy_(torch.randn(t.shape, generator=gen) * 0.05)


def random_speaker_encoder_state(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """fp32 random ``speaker_encoder.*`` tensors for a root ``model.safetensors`` built from ``config``."""
    from .speaker_encoder import SpeakerEncoder, SpeakerEncoderConfig

    model = SpeakerEncoder(SpeakerEncoderConfig.from_dict(config))
    randomize_speaker_encoder_(model, seed)
    return {f"speaker_encoder.{k}": v.detach().float().contiguous() for k, v in model.state_dict().items()}
