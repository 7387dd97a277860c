"""The talker: a Qwen3 decoder over summed text + codec embeddings that predicts codebook 0 per frame.

Module and parameter names follow the hub checkpoint (``talker.model.layers.{i}...``) so a safetensors
state dict loads without renaming. The root module :class:`Qwen3TTSLM` holds everything in
``model.safetensors`` except the speaker encoder.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from omni_stream.models.qwen3_tts.code_predictor import CodePredictor
from omni_stream.models.qwen3_tts.config import Qwen3TTSConfig
from omni_stream.runtime.decoder import DecoderLayer, RMSNorm, Rotary, run_layers, use_kernels
from omni_stream.runtime.decoder_kernels import DecodeKernels
from omni_stream.runtime.kv_cache import Attend
from omni_stream.runtime.sampling import SamplingTensors, sample


class TextProjection(nn.Module):
    """``linear_fc2(silu(linear_fc1(x)))``: text embedding width -> talker hidden."""

    def __init__(self, text_hidden: int, hidden: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class TalkerModel(nn.Module):
    def __init__(self, cfg: Qwen3TTSConfig) -> None:
        super().__init__()
        t = cfg.talker
        d = t.decoder
        self.text_embedding = nn.Embedding(t.text_vocab_size, t.text_hidden_size)
        self.codec_embedding = nn.Embedding(d.vocab_size, d.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(d) for _ in range(d.num_hidden_layers))
        self.norm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        self.rotary = Rotary(d.head_dim, d.rope_theta)


class Talker(nn.Module):
    def __init__(self, cfg: Qwen3TTSConfig) -> None:
        super().__init__()
        t = cfg.talker
        self.model = TalkerModel(cfg)
        self.text_projection = TextProjection(t.text_hidden_size, t.decoder.hidden_size)
        self.codec_head = nn.Linear(t.decoder.hidden_size, t.decoder.vocab_size, bias=False)
        self.code_predictor = CodePredictor(cfg)
        self.sample: Callable[[torch.Tensor, SamplingTensors, torch.Tensor | None], torch.Tensor] = sample
        self.kernels: DecodeKernels | None = None

    def use_kernels(self, kernels: DecodeKernels | None) -> None:
        """Run every decoder layer (talker and code predictor) fused through ``kernels`` (None: the modules)."""
        self.sample = sample if kernels is None else kernels.sample
        self.kernels = kernels
        use_kernels(self.model.layers, kernels)
        self.code_predictor.use_kernels(kernels)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Code-0 logits of final-normed hidden states ``[B, H]`` (the small-batch projection at few rows)."""
        k = self.kernels
        if k is not None and h.shape[0] <= k.small_rows:
            return k.small.linear(h, self.codec_head.weight)
        return self.codec_head(h)

    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        """Text ids -> projected embeddings (``T(ids)``), any leading shape."""
        return self.text_projection(self.model.text_embedding(ids))

    def embed_codec(self, ids: torch.Tensor) -> torch.Tensor:
        """Codebook-0 / control ids -> talker codec embeddings (``C(ids)``)."""
        return self.model.codec_embedding(ids)

    def embed_frames(self, codes: torch.Tensor) -> torch.Tensor:
        """``[..., 16]`` codes -> sum of the 16 codebook embeddings (talker table for 0, predictor tables for 1..15).

        Stacked then summed in one reduction, as the reference does, so fp32 results match bit for bit.
        """
        parts = [self.model.codec_embedding(codes[..., 0])]
        parts += [table(codes[..., g + 1]) for g, table in enumerate(self.code_predictor.model.codec_embedding)]
        return torch.stack(parts, dim=-2).sum(dim=-2)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        """``x`` ``[B, T, H]`` at ``positions`` ``[B, T]`` -> final-normed hidden states ``[B, T, H]``."""
        cos, sin = self.model.rotary(positions, x.dtype)
        return run_layers(self.model.layers, self.model.norm, x, cos, sin, attend)


class Qwen3TTSLM(nn.Module):
    """Root of ``model.safetensors`` (``talker.*``); the speaker encoder (``speaker_encoder.*``) lives elsewhere."""

    def __init__(self, cfg: Qwen3TTSConfig) -> None:
        super().__init__()
        self.config = cfg
        self.talker = Talker(cfg)
