"""The speech-tokenizer decoder's split residual vector quantizer (codes -> latent), with hub parameter names."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .codec_config import CodecDecoderConfig


class DerivedTensor:
    """A tensor computed from parameters, recomputed only when they change (in place, dtype or device).

    Elementwise functions of the weights give the same bits whether computed per call or once, so caching
    them keeps bf16 parity with the reference while removing kernels from every decode step.
    """

    __slots__ = ("key", "value")

    def __init__(self) -> None:
        self.key: tuple[object, ...] | None = None
        self.value: Tensor | None = None

    def get(self, fn: Callable[..., Tensor], *params: Tensor) -> Tensor:
        if torch.is_grad_enabled() and any(p.requires_grad for p in params):
            return fn(*params)  # keep the autograd graph to the parameters
        key = tuple((p.data_ptr(), 0 if p.is_inference() else p._version, p.dtype, p.device) for p in params)
        # an inference-mode result cannot feed autograd-recording ops, so it is rebuilt outside inference mode
        stale = self.value is None or (self.value.is_inference() and not torch.is_inference_mode_enabled())
        if stale or key != self.key:
            with torch.no_grad():
                self.value = fn(*params)
            self.key = key
        return cast(Tensor, self.value)


class Codebook(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))
        self._derived = DerivedTensor()

    @staticmethod
    def _fold(embedding_sum: Tensor, cluster_usage: Tensor) -> Tensor:
        # in the weight dtype, as the reference computes it at run time (QWEN3_TTS.md pitfall 11)
        return embedding_sum / cluster_usage.clamp(min=1e-5)[:, None]

    def table(self) -> Tensor:
        return self._derived.get(self._fold, self.embedding_sum, self.cluster_usage)


class _VQ(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = Codebook(size, dim)


class _VQLayers(nn.Module):
    def __init__(self, n: int, size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList(_VQ(size, dim) for _ in range(n))


class ResidualVQ(nn.Module):
    """Sum of codebook rows, then a 1x1 conv up to ``codebook_dim``. ``input_proj`` is kept for strict loading."""

    def __init__(self, n: int, size: int, dim: int, io_dim: int):
        super().__init__()
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.vq = _VQLayers(n, size, dim)

    def decode(self, codes: Tensor) -> Tensor:
        """``codes [B, n, T]`` -> ``[B, io_dim, T]``."""
        out: Tensor | None = None
        for i, layer in enumerate(self.vq.layers):
            row = F.embedding(codes[:, i], cast(_VQ, layer)._codebook.table())
            out = row if out is None else out + row
        assert out is not None
        return self.output_proj(out.transpose(1, 2))


class SplitResidualVQ(nn.Module):
    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        dim = cfg.codebook_dim // 2
        self.rvq_first = ResidualVQ(1, cfg.codebook_size, dim, cfg.codebook_dim)
        self.rvq_rest = ResidualVQ(cfg.num_quantizers - 1, cfg.codebook_size, dim, cfg.codebook_dim)

    def decode(self, codes: Tensor) -> Tensor:
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])
