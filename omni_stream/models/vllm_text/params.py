"""What we hand vLLM, as pure functions (no vLLM import): engine arguments and sampling arguments."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omni_stream.errors import ConfigError, InvalidRequestError
from omni_stream.requests import TextRequest
from omni_stream.text.grammar import request_grammar
from omni_stream.text.logprobs import TokenLogprob
from omni_stream.text.tool_parsers import ToolFormat
from omni_stream.text.tools import FormatKind
from omni_stream.validation.sampling import openai_sampling

# How the chat templates of vLLM's model types ask for tool calls (others: calls stay in the text).
TOOL_FORMATS = {"qwen3": ToolFormat.HERMES, "qwen2": ToolFormat.HERMES, "llama": ToolFormat.LLAMA_JSON}


def engine_args(checkpoint: Path, backend_args: Mapping[str, object]) -> dict[str, object]:
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
    if request.presence_penalty:
        args["presence_penalty"] = request.presence_penalty
    if request.frequency_penalty:
        args["frequency_penalty"] = request.frequency_penalty
    if request.logit_bias:
        args["logit_bias"] = dict(request.logit_bias)
    if request.logprobs is not None:
        args["logprobs"] = request.logprobs
    return args


def structured_args(request: TextRequest, tool_format: ToolFormat | None) -> dict[str, Any]:
    """Keyword arguments of vLLM's ``StructuredOutputsParams`` (empty: a free reply): JSON output as vLLM's own
    ``json`` / ``json_object``; a forced tool call as our Lark grammar in the model's format (``%json`` inside
    Lark: vLLM's guidance backend, llguidance, runs it)."""
    fmt = request.response_format
    if request.tool_choice.forces_call and request.offered_tools:
        if tool_format is None:
            raise InvalidRequestError(
                "this model's tool-call format is unknown, so a call cannot be forced: use tool_choice 'auto'",
                "tool_choice",
            )
        grammar = request_grammar(
            request.offered_tools, request.tool_choice, fmt, tool_format, request.parallel_tool_calls
        )
        return {"grammar": grammar}
    if fmt.kind is FormatKind.JSON_SCHEMA:
        return {"json": json.loads(fmt.schema or "{}")}
    if fmt.kind is FormatKind.JSON_OBJECT:
        return {"json_object": True}
    return {}


def token_logprobs(
    token_ids: Sequence[int], logprobs: Sequence[Mapping[int, Any]] | None, k: int
) -> tuple[TokenLogprob, ...]:
    """vLLM's per-token ``{id: Logprob(logprob, rank, decoded_token)}`` of the new tokens as ours (the ``k`` best)."""
    out = []
    for token, entries in zip(token_ids, logprobs or (), strict=False):
        chosen = entries.get(token)
        best = sorted((e for e in entries.values() if e.rank is not None and e.rank <= k), key=lambda e: e.rank)
        top = tuple((e.decoded_token or "", float(e.logprob)) for e in best[:k])
        text = chosen.decoded_token or "" if chosen is not None else ""
        out.append(TokenLogprob(text, float(chosen.logprob) if chosen is not None else float("-inf"), top))
    return tuple(out)
