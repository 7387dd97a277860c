"""The OpenAI-compatible wire format, as pure functions: request bodies, stream chunks, upstream errors.

Requests with ``messages`` go to ``POST /v1/chat/completions`` (text in ``choices[0].delta.content``); a raw
``prompt`` goes to ``POST /v1/completions`` (text in ``choices[0].text``). Both stream (``stream: true``) with
``stream_options.include_usage``, so the server sends one last chunk with empty ``choices`` and the ``usage``.
Extensions that vLLM and SGLang accept (``top_k``, ``repetition_penalty``, ``ignore_eos``) are only sent when they
differ from the OpenAI defaults, so plain OpenAI-compatible servers see a plain body.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from omni_stream.errors import ConfigError, InvalidRequestError, OmniStreamError, UpstreamError
from omni_stream.requests import ChatMessage, TextRequest
from omni_stream.text.logprobs import TokenLogprob
from omni_stream.text.tools import ToolCallDelta, ToolMode
from omni_stream.validation.sampling import openai_sampling
from omni_stream.vision.encode import png_data_url

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
MODELS_PATH = "/v1/models"
TOKENIZE_PATH = "/tokenize"  # vLLM's (and SGLang's) extension

# Upstream statuses that say our configuration is wrong (credentials, model name) or that the server is
# overloaded, not that the client's request is: the client gets a server error for these, never a 400.
_NOT_THE_CLIENTS = frozenset({401, 403, 404, 408, 429})


@dataclass(slots=True, frozen=True)
class RemoteOptions:
    """The remote backend's settings (from ``LoadOptions.backend_args``).

    ``model``: the id the server serves (None: the first of ``GET /v1/models``); ``api_key``: sent as
    ``Authorization: Bearer``; ``max_context``: tokens of context (None: the server's ``max_model_len`` when it
    reports one, else no local check); ``connect_timeout``: seconds to open a connection (each read is bounded by
    the request's own deadline and wait budget).
    """

    model: str | None = None
    api_key: str | None = None
    max_context: int | None = None
    connect_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.max_context is not None and self.max_context < 2:
            raise ConfigError(f"max_context must be >= 2, got {self.max_context}")
        if self.connect_timeout <= 0:
            raise ConfigError(f"connect_timeout must be > 0 s, got {self.connect_timeout}")

    @classmethod
    def from_backend_args(cls, args: tuple[tuple[str, Any], ...]) -> RemoteOptions:
        known = {f.name for f in fields(cls)}
        given = dict(args)
        unknown = sorted(set(given) - known)
        if unknown:
            raise ConfigError(
                f"unknown options for the OpenAI-compatible backend: {', '.join(unknown)} "
                f"(known: {', '.join(sorted(known))})"
            )
        return cls(**given)


def request_body(request: TextRequest, model: str) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) of the streaming request for ``request``. With images it encodes them (PNG): then call it
    off the event loop."""
    body: dict[str, Any] = {"model": model}
    if request.prompt is not None:
        path = COMPLETIONS_PATH
        body["prompt"] = request.prompt
    else:
        path = CHAT_PATH
        body["messages"] = [_wire_message(m) for m in request.messages]
        if request.tools:
            body["tools"] = [t.template() for t in request.tools]
            if request.tool_choice.mode is not ToolMode.AUTO:
                body["tool_choice"] = request.tool_choice.wire()
            if not request.parallel_tool_calls:
                body["parallel_tool_calls"] = False
        if request.response_format.constrains:
            body["response_format"] = request.response_format.wire()
    if request.max_tokens is not None:
        body["max_tokens"] = request.max_tokens
    if request.sampling is not None:
        body.update(openai_sampling(request.sampling))
    if request.seed is not None:
        body["seed"] = request.seed
    if request.stop:
        body["stop"] = list(request.stop)
    if request.ignore_eos:
        body["ignore_eos"] = True
    if request.presence_penalty:
        body["presence_penalty"] = request.presence_penalty
    if request.frequency_penalty:
        body["frequency_penalty"] = request.frequency_penalty
    if request.logit_bias:
        body["logit_bias"] = {str(token): bias for token, bias in request.logit_bias}
    if request.logprobs is not None:
        body["logprobs"] = True
        body["top_logprobs"] = request.logprobs
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    return path, body


def _wire_message(message: ChatMessage) -> dict[str, Any]:
    content: str | list[dict[str, Any]] = message.content
    if message.images:  # OpenAI's parts: the pictures as PNG data URLs (the pixels exactly), then the text
        content = [{"type": "image_url", "image_url": {"url": png_data_url(image)}} for image in message.images]
        content.append({"type": "text", "text": message.content})
    out: dict[str, Any] = {"role": message.role.value, "content": content}
    if message.tool_calls:
        out["tool_calls"] = [c.wire() for c in message.tool_calls]
        out["content"] = message.content or None
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


@dataclass(slots=True, frozen=True)
class StreamChunk:
    """What one ``data:`` event says: new ``text``, the ``finish_reason`` (on the choice's last chunk), ``usage``
    as (prompt tokens, completion tokens) on the usage chunk, pieces of tool calls and log-probabilities."""

    text: str = ""
    finish_reason: str | None = None
    usage: tuple[int, int] | None = None
    tool_calls: tuple[ToolCallDelta, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()


def _tool_call_pieces(delta: Any) -> tuple[ToolCallDelta, ...]:
    pieces = delta.get("tool_calls") if isinstance(delta, dict) else None
    out = []
    for piece in pieces if isinstance(pieces, list) else []:
        if not isinstance(piece, dict) or not isinstance(piece.get("index"), int):
            continue
        fn = piece.get("function")
        fn = fn if isinstance(fn, dict) else {}
        call_id, name, args = piece.get("id"), fn.get("name"), fn.get("arguments")
        out.append(
            ToolCallDelta(
                piece["index"],
                call_id if isinstance(call_id, str) else None,
                name if isinstance(name, str) else None,
                args if isinstance(args, str) else "",
            )
        )
    return tuple(out)


def _raw(entry: dict[str, Any]) -> bytes | None:
    """An entry's ``bytes`` as the remote server sent them (None when absent or not a list of bytes)."""
    value = entry.get("bytes")
    if isinstance(value, list) and all(isinstance(b, int) and 0 <= b < 256 for b in value):
        return bytes(value)
    return None


def _logprobs(choice: dict[str, Any]) -> tuple[TokenLogprob, ...]:
    """The logprob entries, their ``bytes`` kept as sent (a token inside a character has bytes but no text)."""
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    out = []
    for entry in content if isinstance(content, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("token"), str):
            alternatives = [t for t in entry.get("top_logprobs") or [] if isinstance(t, dict)]
            top = tuple((t["token"], float(t["logprob"])) for t in alternatives)
            top_raw = tuple(_raw(t) for t in alternatives)
            out.append(TokenLogprob(entry["token"], float(entry.get("logprob", 0.0)), top, _raw(entry), top_raw))
    return tuple(out)


def parse_chunk(data: str) -> StreamChunk:
    """One SSE ``data`` payload (not ``[DONE]``) of a chat or completions stream; errors sent in-stream raise."""
    try:
        payload = json.loads(data)
    except ValueError:
        raise UpstreamError(f"the upstream server sent a stream event that is not JSON: {data[:200]!r}") from None
    if not isinstance(payload, dict):
        raise UpstreamError(f"the upstream server sent a stream event that is not an object: {data[:200]!r}")
    if "error" in payload or payload.get("object") == "error":
        raise error_from_body(_status_of(payload), payload)
    text, finish = "", None
    calls: tuple[ToolCallDelta, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()
    choices = payload.get("choices") or []
    if choices:
        choice = choices[0]
        delta = choice.get("delta")
        piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        text = piece if isinstance(piece, str) else ""
        finish = choice.get("finish_reason")
        calls = _tool_call_pieces(delta)
        logprobs = _logprobs(choice)
    usage = payload.get("usage")
    counts = None
    if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
        counts = (usage["prompt_tokens"], int(usage.get("completion_tokens") or 0))
    return StreamChunk(text, finish if isinstance(finish, str) else None, counts, calls, logprobs)


def _status_of(payload: dict[str, Any]) -> int:
    error = payload.get("error")
    code = error.get("code") if isinstance(error, dict) else payload.get("code")
    return code if isinstance(code, int) else 500


def upstream_message(payload: object) -> tuple[str, str | None]:
    """(message, param) of an error body in OpenAI's shape (``{"error": {...}}``) or vLLM's flat one."""
    if isinstance(payload, dict):
        error = payload.get("error", payload)
        if isinstance(error, dict):
            message, param = error.get("message"), error.get("param")
            if isinstance(message, str):
                return message, param if isinstance(param, str) else None
        elif isinstance(error, str):
            return error, None
    return str(payload)[:500], None


def error_from_body(status: int, payload: object) -> OmniStreamError:
    """The typed error for an upstream error ``status`` and its body.

    A 4xx about the request itself is the client's: InvalidRequestError with the upstream's message and param.
    401/403/404 (our credentials, our model name), 408/429 (the server is busy) and 5xx are UpstreamError.
    """
    message, param = upstream_message(payload)
    if 400 <= status < 500 and status not in _NOT_THE_CLIENTS:
        return InvalidRequestError(message, param)
    return UpstreamError(f"the upstream server answered {status}: {message}", status=status)


def error_from_response(status: int, body: bytes) -> OmniStreamError:
    """:func:`error_from_body` of a raw response body (JSON or not)."""
    try:
        payload: object = json.loads(body)
    except ValueError:
        payload = body.decode("utf-8", "replace").strip() or f"HTTP {status}"
    return error_from_body(status, payload)


def served_model(models: object) -> tuple[str, int | None]:
    """(id, max_model_len or None) of the first model a ``GET /v1/models`` body lists; where the list says each
    model's ``kind`` (an omni-stream server serving speech and text), the first of kind ``text``."""
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list):
        data = [m for m in data if isinstance(m, dict) and m.get("kind") == "text"] or data
    if not isinstance(data, list) or not data or not isinstance(data[0], dict) or "id" not in data[0]:
        raise ConfigError(f"the upstream server lists no model at {MODELS_PATH}: {str(models)[:200]}")
    first = data[0]
    max_len = first.get("max_model_len")
    return str(first["id"]), max_len if isinstance(max_len, int) else None
