"""What we hand vLLM, as pure functions (no vLLM import): engine arguments and sampling arguments."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omni_stream.errors import ConfigError
from omni_stream.requests import TextRequest
from omni_stream.validation.sampling import openai_sampling


def engine_args(checkpoint: Path, backend_args: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of ``AsyncEngineArgs``: ``model`` is the checkpoint, everything else passes unchanged.

    ``tensor_parallel_size``, ``pipeline_parallel_size``, ``distributed_executor_backend``,
    ``gpu_memory_utilization``, ``max_model_len``, ``enforce_eager``, ... are vLLM's own; vLLM checks them.
    """
    if "model" in backend_args:
        raise ConfigError(
            f"the vLLM backend serves the checkpoint it was given ({checkpoint}); "
            "drop the 'model' engine argument (use served_model_name to rename it)"
        )
    return {"model": str(checkpoint), **backend_args}


def sampling_args(request: TextRequest, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of vLLM's ``SamplingParams`` for ``request`` (``output_kind`` is the caller's).

    ``defaults``: the model's own sampling defaults (vLLM's ``model_config.get_diff_sampling_param()``, read
    from ``generation_config.json``), used when ``request.sampling`` is None. ``max_tokens`` None lets vLLM
    fill the rest of the context, as our other backends do.
    """
    args: dict[str, Any] = dict(defaults) if request.sampling is None else openai_sampling(request.sampling)
    args["max_tokens"] = request.max_tokens
    if request.seed is not None:
        args["seed"] = request.seed
    if request.stop:
        args["stop"] = list(request.stop)
    if request.ignore_eos:
        args["ignore_eos"] = True
    return args
