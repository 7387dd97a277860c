"""The code predictor ("sub-talker"): 5 Qwen3 layers that turn (talker hidden, code 0) into codes 1..15.

Per frame it runs 15 dependent micro-steps on a fresh 16-position cache: a 2-token prefill
``[proj(h), proj(C_talker(c0))]`` -> ``lm_head[0]``, then for j = 1..14 the input
``proj(codec_embedding[j-1](c_j))`` -> ``lm_head[j]``. :meth:`CodePredictor.generate` is written to be
captured whole as one CUDA graph per batch size: static scratch buffers, shapes fixed by the batch size,
the loop unrolled over Python constants, sampling inside, and no host synchronisation. With
``Tuning.predictor_kernel`` on (``OMNI_STREAM_PREDICTOR_KERNEL=on``; CUDA, Triton kernels) a one-row frame is one
persistent kernel instead (:mod:`.predictor_kernel`), an arm for comparisons: slower than the loop's graph so far.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from omni_stream.models.qwen3_tts.config import NUM_CODE_GROUPS, Qwen3TTSConfig
from omni_stream.runtime.decoder import DecoderLayer, RMSNorm, Rotary, run_layers, use_kernels
from omni_stream.runtime.decoder_kernels import DecodeKernels, SmallRows
from omni_stream.runtime.kv_cache import FrameKVCache, KVShape
from omni_stream.runtime.sampling import SamplingTensors, sample

STEPS = NUM_CODE_GROUPS - 1  # codes 1..15
CACHE_LEN = NUM_CODE_GROUPS  # 2-token prefill + 14 single-token steps


class CodePredictorModel(nn.Module):
    def __init__(self, cfg: Qwen3TTSConfig) -> None:
        super().__init__()
        d = cfg.code_predictor
        talker_hidden = cfg.talker.decoder.hidden_size
        # Embeddings of codes 1..15 live at the talker width: their sum is the talker's next input.
        self.codec_embedding = nn.ModuleList(nn.Embedding(d.vocab_size, talker_hidden) for _ in range(STEPS))
        self.layers = nn.ModuleList(DecoderLayer(d) for _ in range(d.num_hidden_layers))
        self.norm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        self.rotary = Rotary(d.head_dim, d.rope_theta)


class CodePredictor(nn.Module):
    def __init__(self, cfg: Qwen3TTSConfig) -> None:
        super().__init__()
        d = cfg.code_predictor
        talker_hidden = cfg.talker.decoder.hidden_size
        self.cfg = d
        self.model = CodePredictorModel(cfg)
        self.lm_head = nn.ModuleList(nn.Linear(d.hidden_size, d.vocab_size, bias=False) for _ in range(STEPS))
        if talker_hidden != d.hidden_size:
            self.small_to_mtp_projection: nn.Module = nn.Linear(talker_hidden, d.hidden_size, bias=True)
        else:
            self.small_to_mtp_projection = nn.Identity()
        self._caches: dict[tuple[int, torch.dtype, torch.device], FrameKVCache] = {}
        self._rope: dict[tuple[torch.dtype, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}
        self.sample: Callable[[torch.Tensor, SamplingTensors, torch.Tensor | None], torch.Tensor] = sample
        self.kernels: DecodeKernels | None = None
        # the one-row frame as one persistent kernel (predictor_kernel.PredictorKernel), where the kernels ask
        self.frame: Callable[[torch.Tensor, torch.Tensor, SamplingTensors, torch.Tensor | None], torch.Tensor] | None
        self.frame = None

    def use_kernels(self, kernels: DecodeKernels | None) -> None:
        """Run the decoder layers fused through ``kernels`` (None: the modules), at the predictor's row limit;
        a one-row frame through the persistent kernel where ``kernels.predictor_frame`` says so (CUDA)."""
        kernels = None if kernels is None else kernels.for_predictor()
        self.sample = sample if kernels is None else kernels.sample
        self.kernels = kernels
        use_kernels(self.model.layers, kernels)
        self.frame = None
        weight = self.model.norm.weight
        if kernels is not None and kernels.predictor_frame and weight.is_cuda:
            from omni_stream.models.qwen3_tts.predictor_kernel import PredictorKernel

            self.frame = PredictorKernel(self)

    def _small(self, rows: int) -> SmallRows | None:
        k = self.kernels
        return k.small if k is not None and rows <= k.small_rows else None

    def _linear(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``module(x)`` for a linear layer; the kernels' small-batch projection at few rows."""
        small = self._small(x.numel() // x.shape[-1])
        if small is None or not isinstance(module, nn.Linear):
            return module(x)
        return small.linear(x, module.weight, module.bias)

    def _next_input(self, j: int, token: torch.Tensor) -> torch.Tensor:
        """The input ``[B, 1, H]`` after code ``j + 1``: its embedding, projected to the predictor's width."""
        table, proj = self.model.codec_embedding[j], self.small_to_mtp_projection
        small = self._small(token.shape[0])
        if small is not None and isinstance(proj, nn.Linear):  # the lookup read by the projection itself
            return small.embed_linear(table.weight, token, proj.weight, proj.bias)[:, None]
        return self._linear(proj, table(token))[:, None]

    def _cache(self, batch: int, dtype: torch.dtype, device: torch.device) -> FrameKVCache:
        key = (batch, dtype, device)
        cache = self._caches.get(key)
        if cache is None:
            shape = KVShape(
                self.cfg.num_hidden_layers, batch, self.cfg.num_key_value_heads, CACHE_LEN, self.cfg.head_dim
            )
            cache = self._caches[key] = FrameKVCache(shape, dtype=dtype, device=device)
        return cache

    def _tables(self, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (dtype, device)
        if key not in self._rope:
            self._rope[key] = self.model.rotary(torch.arange(CACHE_LEN, device=device)[None], dtype)
        return self._rope[key]

    def generate(
        self,
        hidden: torch.Tensor,
        c0_embed: torch.Tensor,
        params: SamplingTensors,
        noise: torch.Tensor | None,
    ) -> torch.Tensor:
        """Codes 1..15 ``[B, 15]`` (int64) for talker hidden states and code-0 embeddings ``[B, H_talker]``.

        ``noise``: ``[B, 15, 2048]`` Exponential(1) draws for the sampled rows, or None when all rows are greedy.
        """
        b = hidden.shape[0]
        if b == 1 and self.frame is not None:
            return self.frame(hidden, c0_embed, params, noise)
        cache = self._cache(b, hidden.dtype, hidden.device)
        cos_all, sin_all = self._tables(hidden.dtype, hidden.device)
        proj = self.small_to_mtp_projection
        x = self._linear(proj, torch.stack((hidden, c0_embed), dim=1))
        codes = []
        pos = 0
        for j in range(STEPS):
            n = x.shape[1]
            cos = cos_all[:, pos : pos + n].expand(b, -1, -1)
            sin = sin_all[:, pos : pos + n].expand(b, -1, -1)
            out = run_layers(self.model.layers, self.model.norm, x, cos, sin, cache.at(pos, n))
            pos += n
            logits = self._linear(self.lm_head[j], out[:, -1])
            token = self.sample(logits, params, None if noise is None else noise[:, j])
            codes.append(token)
            if j + 1 < STEPS:
                x = self._next_input(j, token)
        return torch.stack(codes, dim=1)
