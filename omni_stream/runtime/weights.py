"""Weights: load hub safetensors into modules named like the hub, or fill real-size random ("dummy") weights.

Modules use the checkpoint's parameter names, so loading is a strict name-for-name copy: a missing or
unexpected tensor, or a shape mismatch, raises :class:`ConfigError` listing the offending names.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from omni_stream.errors import ConfigError

LOAD_FORMATS = ("auto", "safetensors", "dummy")

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def parse_dtype(dtype: torch.dtype | str | None, device: str) -> torch.dtype:
    """``None`` -> float32 on CPU, bfloat16 on GPU; strings as in ``--dtype`` (others raise ConfigError)."""
    if dtype is None:
        return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise ConfigError(f"dtype: unknown dtype {dtype!r} (one of: {', '.join(sorted(_DTYPES))})") from None


def safetensors_files(model_dir: str | Path, name: str = "model.safetensors") -> list[Path]:
    """The single-file checkpoint, or the shards of ``model-XXXXX-of-YYYYY.safetensors``."""
    d = Path(model_dir)
    single = d / name
    if single.exists():
        return [single]
    stem = name.removesuffix(".safetensors")
    shards = sorted(d.glob(f"{stem}-*-of-*.safetensors"))
    if not shards:
        raise ConfigError(f"no {name} (or shards) in {d}")
    return shards


def _names(names: Iterable[str], limit: int = 8) -> str:
    names = sorted(names)
    more = f" ... (+{len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def load_safetensors(
    module: nn.Module,
    files: Iterable[str | Path],
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
    ignore_prefixes: tuple[str, ...] = (),
    strict: bool = True,
) -> None:
    """Copy tensors from ``files`` into ``module`` (its parameters keep their names), cast to ``dtype``
    (None: the stored dtype).

    Tensors whose names start with one of ``ignore_prefixes`` belong to another component and are skipped.
    The module may live on the ``meta`` device: parameters are then materialized on ``device``.
    """
    expected: dict[str, torch.Tensor] = dict(module.named_parameters())
    expected.update({k: v for k, v in module.named_buffers() if _persistent(module, k)})
    seen: set[str] = set()
    unexpected: list[str] = []
    mismatched: list[str] = []
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                if name.startswith(ignore_prefixes):
                    continue
                target = expected.get(name)
                if target is None:
                    unexpected.append(name)
                    continue
                tensor = f.get_tensor(name)
                if tuple(tensor.shape) != tuple(target.shape):
                    mismatched.append(f"{name} {tuple(tensor.shape)} != {tuple(target.shape)}")
                    continue
                _assign(module, name, tensor.to(device=device, dtype=dtype or tensor.dtype))
                seen.add(name)
    missing = set(expected) - seen
    if mismatched:
        raise ConfigError(f"shape mismatch for {len(mismatched)} tensors: {_names(mismatched)}")
    if strict and missing:
        raise ConfigError(f"checkpoint is missing {len(missing)} tensors: {_names(missing)}")
    if strict and unexpected:
        raise ConfigError(f"checkpoint has {len(unexpected)} unexpected tensors: {_names(unexpected)}")


def _persistent(module: nn.Module, name: str) -> bool:
    owner_name, _, leaf = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    return leaf not in owner._non_persistent_buffers_set


def _assign(module: nn.Module, name: str, value: torch.Tensor) -> None:
    owner_name, _, leaf = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    if leaf in owner._parameters:
        owner._parameters[leaf] = nn.Parameter(value, requires_grad=False)
    else:
        owner._buffers[leaf] = value


def init_dummy(
    module: nn.Module,
    *,
    seed: int = 0,
    dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
    embedding_std: float = 0.02,
    norm_jitter: float = 0.0,
    bias_std: float = 0.0,
) -> None:
    """Random weights of the real sizes without reading any file (benchmarks, tests).

    Deterministic per ``seed``; scales keep activations O(1): linear weights ~ N(0, 1/fan_in), embeddings
    ~ N(0, ``embedding_std``), norm weights 1 (+ N(0, ``norm_jitter``)), biases N(0, ``bias_std``).
    Meta-device modules are materialized on ``device``.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for name, p in list(module.named_parameters()):
        shape = tuple(p.shape)
        out_dtype = dtype or (p.dtype if p.dtype.is_floating_point else torch.float32)
        leaf = name.rpartition(".")[2]
        if leaf == "bias":
            value = torch.empty(shape).normal_(0.0, bias_std, generator=gen) if bias_std else torch.zeros(shape)
        elif len(shape) == 1:
            value = torch.ones(shape)
            if norm_jitter:
                value += torch.empty(shape).normal_(0.0, norm_jitter, generator=gen)
        elif "embedding" in name:
            value = torch.empty(shape).normal_(0.0, embedding_std, generator=gen)
        else:
            fan_in = math.prod(shape[1:])
            value = torch.empty(shape).normal_(0.0, 1.0 / math.sqrt(fan_in), generator=gen)
        _assign(module, name, value.to(device=device, dtype=out_dtype))


def count_parameters(module: nn.Module, prefix: str = "") -> int:
    """Parameters whose names start with ``prefix`` (works on meta-device modules)."""
    return sum(p.numel() for n, p in module.named_parameters() if n.startswith(prefix))
