"""The remote text family (``openai``): any OpenAI-compatible server (``vllm serve``, SGLang, ...) over SSE.

```python
engine = await AsyncEngine.from_pretrained(tts_dir, llm_endpoint="http://10.0.0.5:8000",
                                           backend_args={"model": "Qwen/Qwen3-8B", "api_key": "..."})
```

Each request is one streaming ``POST {endpoint}/v1/chat/completions`` (``/v1/completions`` for a raw prompt) with
``stream_options.include_usage``; the stage yields a :class:`~omni_stream.chunks.TextDelta` per content chunk as
it arrives (with its pieces of tool calls and log-probabilities: tools, ``tool_choice``, ``response_format``,
penalties, ``logit_bias`` and ``logprobs`` pass through to the server, which enforces them) and the last one,
marked ``final`` with the upstream ``finish_reason``, once the usage chunk has been
read (so ``ctx.tokens("text")`` holds the server's counts when the stage ends). ``TextDelta.index`` counts
deltas (the wire has no token ids). A server that sends no usage chunk leaves the counts at zero.

Cancellation. Closing the stage (the consumer left, an abort, a deadline) closes the upstream response before
the stage ends: the connection is dropped mid-body, which vLLM and SGLang take as a disconnect and abort the
request. The close is shielded from the cancellation that caused it and bounded by :data:`CLOSE_TIMEOUT`.

Deadlines. Connecting and every read of the stream are bounded by ``ctx`` (the request's deadline and wait
budget: DeadlineExceeded past it); opening a connection also by ``connect_timeout``.

Errors (:mod:`.wire`): an upstream 4xx about the request is InvalidRequestError with the upstream message and
param, raised before any delta; 5xx, refused credentials, unknown model names, overload, a refused or dropped
connection and a stream that ends early are UpstreamError.

Loading reads ``GET {endpoint}/v1/models`` when the model name or the context length is not given, so a wrong
endpoint or model name fails at start-up. ``TextInfo.max_context`` is the server's ``max_model_len`` (vLLM
reports it), else ``max_context`` from the backend args; with neither, 2048 is reported and ``max_tokens`` is
left for the server to check.

A user turn's images go as OpenAI's ``image_url`` parts (PNG data URLs, encoded in the stage off the event loop):
whether the model sees them is the server's to say (a server that refuses them answers 400, which the client gets).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
from httpx_sse import EventSource, SSEError

from omni_stream.chunks import TextDelta
from omni_stream.context import RequestContext, TokenCount
from omni_stream.errors import ConfigError, UpstreamError
from omni_stream.family import LoadContext, ModelKind, TextInfo
from omni_stream.models.openai_text.wire import (
    MODELS_PATH,
    TOKENIZE_PATH,
    RemoteOptions,
    error_from_response,
    parse_chunk,
    request_body,
    served_model,
)
from omni_stream.pipeline import Stage
from omni_stream.requests import TextRequest
from omni_stream.text.logprobs import TokenLogprob
from omni_stream.text.tools import ToolCallDelta

MODEL_TYPE = "openai"
CLOSE_TIMEOUT = 5.0  # seconds closing an upstream response may take (it only drops a connection)
DEFAULT_CONTEXT = 2048  # reported when neither the server nor the backend args give a context length


def base_url(endpoint: str) -> str:
    """The server's root: ``http://h:8000``, ``http://h:8000/`` and ``http://h:8000/v1`` all name the same one."""
    url = endpoint.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"the endpoint must be an http(s) URL, got {endpoint!r}")
    return url


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class OpenAITextFamily:
    """A text model behind an OpenAI-compatible server (see module docstring)."""

    def __init__(self, endpoint: str, options: RemoteOptions, model: str, max_context: int | None) -> None:
        self.endpoint = base_url(endpoint)
        self.options = options
        self.model = model
        self.info = TextInfo(
            model,
            MODEL_TYPE,
            ModelKind.TEXT,
            max_context=max_context or DEFAULT_CONTEXT,
            context_known=max_context is not None,
            sees_images=True,  # passed through as image_url parts: whether the model sees is the server's to say
        )
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        # Made on first use, on the event loop that serves the requests (the loader runs in a thread).
        if self._client is None:
            self._client = httpx.AsyncClient(
                base_url=self.endpoint,
                headers=_headers(self.options.api_key),
                timeout=httpx.Timeout(None, connect=self.options.connect_timeout),
                # One connection per streaming request: httpx's default cap of 100 would queue the 101st
                # concurrent request inside the client; admission is the upstream server's job.
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=20),
            )
        return self._client

    def text_stage(self, request: TextRequest, ctx: RequestContext) -> Stage[object, TextDelta]:
        """The stage of ``request``; the prompt's fit is the server's to check (its tokenizer is there)."""
        pictures = any(m.images for m in request.messages)
        built = None if pictures else request_body(request, self.model)  # images are encoded in the stage

        async def text(ctx: RequestContext, upstream: AsyncIterator[object]) -> AsyncIterator[TextDelta]:
            path, body = (
                built if built is not None else await anyio.to_thread.run_sync(request_body, request, self.model)
            )
            client = self._http()
            usage = ctx.tokens(ModelKind.TEXT)
            call = client.build_request("POST", path, json=body, headers={"Accept": "text/event-stream"})
            response: httpx.Response | None = None
            try:
                try:
                    with ctx.fail_after(f"connecting to {self.endpoint}"):
                        response = await client.send(call, stream=True)
                    if response.status_code >= 400:
                        with ctx.fail_after("reading the upstream error"):
                            error = await response.aread()
                        raise error_from_response(response.status_code, error)
                except httpx.HTTPError as exc:
                    raise UpstreamError(f"cannot reach the text model at {self.endpoint}: {exc!r}") from exc
                async for delta in _deltas(ctx, response, usage, self.endpoint):
                    yield delta
            finally:
                if response is not None:
                    await _close(response)

        text.__name__ = "text"
        return text

    def count_text_tokens(self, text: str) -> int:
        """Tokens of ``text`` by the server's ``/tokenize`` (vLLM, SGLang); blocking: call it off the loop."""
        try:
            with httpx.Client(base_url=self.endpoint, headers=_headers(self.options.api_key), timeout=30.0) as http:
                response = http.post(
                    TOKENIZE_PATH, json={"model": self.model, "prompt": text, "add_special_tokens": False}
                )
        except httpx.HTTPError as exc:
            raise UpstreamError(f"cannot reach the text model at {self.endpoint}: {exc!r}") from exc
        if response.status_code >= 400:
            raise error_from_response(response.status_code, response.content)
        count = response.json().get("count")
        if not isinstance(count, int):
            raise UpstreamError(f"{TOKENIZE_PATH} of {self.endpoint} sent no token count")
        return count

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


async def _deltas(
    ctx: RequestContext, response: httpx.Response, usage: TokenCount, endpoint: str
) -> AsyncIterator[TextDelta]:
    """The deltas of one SSE response; the last one (``final``) after the usage chunk and ``[DONE]``."""
    events = EventSource(response).aiter_sse()
    index = 0
    final_text: list[str] = []
    final_calls: list[ToolCallDelta] = []
    final_logprobs: list[TokenLogprob] = []
    finish: str | None = None
    try:
        while True:
            try:
                with ctx.fail_after(f"the next chunk from {endpoint}"):
                    event = await anext(events, None)
            except (httpx.HTTPError, SSEError) as exc:
                raise UpstreamError(f"the stream from {endpoint} broke off: {exc!r}") from exc
            if event is None or event.data == "[DONE]":
                break
            if not event.data:
                continue
            chunk = parse_chunk(event.data)
            if chunk.usage is not None:
                usage.input_tokens, usage.output_tokens = chunk.usage
            if finish is not None or chunk.finish_reason is not None:
                # The last piece waits for the usage chunk that follows it, so the stage ends with usage counted.
                final_text.append(chunk.text)
                final_calls.extend(chunk.tool_calls)
                final_logprobs.extend(chunk.logprobs)
                finish = finish or chunk.finish_reason
            elif chunk.text or chunk.tool_calls or chunk.logprobs:
                yield TextDelta(chunk.text, index, tool_calls=chunk.tool_calls, logprobs=chunk.logprobs)
                index += 1
    finally:
        await events.aclose()
    if finish is None:
        raise UpstreamError(f"the stream from {endpoint} ended before its last chunk (no finish_reason)")
    yield TextDelta(
        "".join(final_text),
        index,
        final=True,
        finish_reason=finish,
        tool_calls=tuple(final_calls),
        logprobs=tuple(final_logprobs),
    )


async def _close(response: httpx.Response) -> None:
    """Close ``response`` even inside a cancelled scope (dropping an unfinished body drops its connection)."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT):
        await response.aclose()


def load_family(load: LoadContext) -> OpenAITextFamily:
    """Family loader for ``--llm-endpoint`` (runs off the event loop; may call ``GET /v1/models``)."""
    if load.endpoint is None:
        raise ConfigError("the openai text backend serves from an endpoint: give one (--llm-endpoint URL)")
    options = RemoteOptions.from_backend_args(load.options.backend_args)
    endpoint = base_url(load.endpoint)
    model, max_context = options.model, options.max_context
    if model is None or max_context is None:
        listed = _list_models(endpoint, options)
        ids = [str(m.get("id")) for m in listed.get("data", []) if isinstance(m, dict)]
        if model is None:
            model, served_len = served_model(listed)
        elif model in ids:
            served_len = served_model({"data": [m for m in listed["data"] if m.get("id") == model]})[1]
        else:
            raise ConfigError(f"{endpoint} does not serve model {model!r} (it serves: {', '.join(ids) or 'none'})")
        max_context = max_context or served_len
    return OpenAITextFamily(endpoint, options, model, max_context)


def _list_models(endpoint: str, options: RemoteOptions) -> dict[str, Any]:
    try:
        with httpx.Client(base_url=endpoint, headers=_headers(options.api_key), timeout=options.connect_timeout) as c:
            response = c.get(MODELS_PATH)
    except httpx.HTTPError as exc:
        raise ConfigError(f"cannot reach the text model server at {endpoint}: {exc!r}") from exc
    if response.status_code >= 400:
        raise ConfigError(f"{endpoint}{MODELS_PATH} answered {response.status_code}: {response.text[:300]}")
    try:
        listed = response.json()
    except ValueError:
        raise ConfigError(f"{endpoint}{MODELS_PATH} did not answer JSON: {response.text[:200]!r}") from None
    if not isinstance(listed, dict):
        raise ConfigError(f"{endpoint}{MODELS_PATH} did not answer a model list")
    return listed
