"""STAND-IN for an OpenAI-compatible text server (vLLM's wire), for what ``omni-stream serve`` cannot show the
remote text backend: ``/v1/completions``, ``/tokenize`` and upstream faults (``test_text_remote_standin.py``).

A small real Starlette app on a real uvicorn server (127.0.0.1, free port, background thread) that serves an
omni-stream engine with the synthetic LM (word echo, on the real scheduler) in vLLM's exact wire shapes, as
recorded from ``vllm serve`` 0.32: the first chunk carries ``delta.role`` and an empty ``content``, then one
chunk per delta, ``finish_reason`` on the last choice chunk, a usage chunk with ``choices: []``, ``data: [DONE]``;
errors as ``{"error": {message, type, param, code}}`` (401: ``{"error": "Unauthorized"}``), in-stream errors as
a ``data:`` event of the same shape. It implements stop strings server-side, as vLLM does.

Fault injection, chosen by the request's ``model``: ``fail-500`` answers 500; ``stall`` sends one delta and then
nothing; ``drop`` sends one delta and breaks the connection; ``error-midway`` sends one delta and an in-stream
error event. ``StandIn.streams`` records how each stream ended (``done`` or ``client gone``), so a test can see
that the server noticed a client leave.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from synthetic.lm_family import write_lm_checkpoint

from omni_stream.engine import AsyncEngine
from omni_stream.errors import InvalidRequestError
from omni_stream.requests import GREEDY, ChatMessage, SamplingParams, TextRequest

MODEL = "synthetic-lm"
MAX_CONTEXT = 256


def _error(status: int, message: str, param: str | None = None, kind: str = "BadRequestError") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}}, status)


def _text_request(body: dict[str, Any], request_id: str) -> TextRequest:
    temperature = body.get("temperature")
    sampling = None if temperature is None else GREEDY if temperature == 0 else SamplingParams(temperature=temperature)
    messages = tuple(ChatMessage(m["role"], m["content"]) for m in body.get("messages", ()))
    return TextRequest(
        messages=messages,
        prompt=body.get("prompt"),
        max_tokens=body.get("max_tokens"),
        sampling=sampling,
        seed=body.get("seed"),
        ignore_eos=bool(body.get("ignore_eos", False)),
        request_id=request_id,
    )


@dataclass
class StandIn:
    """The running stand-in; ``engine`` lives on the server's loop (read its scheduler, never await it here)."""

    url: str
    api_key: str | None
    engine: AsyncEngine | None = None
    streams: dict[str, str] = field(default_factory=dict)  # request id -> "running" | "done" | "client gone"
    changed: threading.Condition = field(default_factory=threading.Condition)
    _ids: Iterator[int] = field(default_factory=lambda: iter(range(1, 1 << 30)))

    def _set(self, request_id: str, state: str) -> None:
        with self.changed:
            self.streams[request_id] = state
            self.changed.notify_all()

    def wait_streams_ended(self, timeout: float = 10.0) -> dict[str, str]:
        """Wait until no stream is running (or ``timeout`` s); returns every stream's end."""
        with self.changed:
            self.changed.wait_for(lambda: "running" not in self.streams.values(), timeout)
            return dict(self.streams)

    def live(self) -> dict[str, int]:
        assert self.engine is not None
        return self.engine.models.text().scheduler.live()  # type: ignore[attr-defined]

    # --- the app ---

    def app(self, checkpoint: Path) -> Starlette:
        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            self.engine = await AsyncEngine.from_pretrained(llm=checkpoint, progress=False, max_batch_size=128)
            try:
                yield
            finally:
                await self.engine.aclose()

        return Starlette(
            routes=[
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/chat/completions", self.complete, methods=["POST"]),
                Route("/v1/completions", self.complete, methods=["POST"]),
                Route("/tokenize", self.tokenize, methods=["POST"]),
            ],
            lifespan=lifespan,
        )

    def _unauthorized(self, request: Request) -> Response | None:
        if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return JSONResponse({"error": "Unauthorized"}, 401)
        return None

    async def models(self, request: Request) -> Response:
        if (denied := self._unauthorized(request)) is not None:
            return denied
        card = {"id": MODEL, "object": "model", "created": int(time.time()), "owned_by": "vllm"}
        return JSONResponse({"object": "list", "data": [{**card, "root": MODEL, "max_model_len": MAX_CONTEXT}]})

    async def tokenize(self, request: Request) -> Response:
        body = await request.json()
        assert self.engine is not None
        count = self.engine.count_text_tokens(body["prompt"], "text")
        return JSONResponse({"count": count, "max_model_len": MAX_CONTEXT, "tokens": list(range(count))})

    async def complete(self, request: Request) -> Response:
        if (denied := self._unauthorized(request)) is not None:
            return denied
        body = await request.json()
        chat = request.url.path.endswith("/chat/completions")
        model = body.get("model")
        if model == "fail-500":
            return _error(500, "EngineCore encountered an issue.", kind="InternalServerError")
        if model not in (MODEL, "stall", "drop", "error-midway"):
            return _error(404, f"The model `{model}` does not exist.", "model", "NotFoundError")
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{next(self._ids)}"
        assert self.engine is not None
        try:
            text_request = _text_request(body, request_id)
            stream = self.engine.chat(text_request)
        except InvalidRequestError as exc:
            return _error(400, exc.message, exc.param)
        stop = tuple(body.get("stop") or ())
        if not body.get("stream"):
            return await self._whole(stream, request_id, chat, stop)
        try:
            first = await anext(aiter(stream), None)  # errors before the first delta are a 400, as vLLM's
        except InvalidRequestError as exc:
            await stream.aclose()
            return _error(400, exc.message, exc.param)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        events = self._events(stream, first, request_id, chat, stop, include_usage, model)
        return StreamingResponse(events, media_type="text/event-stream")

    async def _whole(self, stream: Any, request_id: str, chat: bool, stop: tuple[str, ...]) -> Response:
        async with stream:
            try:
                deltas = [item.chunk async for item in stream]
            except InvalidRequestError as exc:
                return _error(400, exc.message, exc.param)
        text, reason = "".join(d.text for d in deltas), deltas[-1].finish_reason
        for s in stop:
            if s in text:
                text, reason = text[: text.index(s)], "stop"
        usage = stream.usage["text"]
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason}
        choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
        counts = {"prompt_tokens": usage.input_tokens, "completion_tokens": usage.output_tokens}
        return JSONResponse({"id": request_id, "choices": [choice], "usage": counts})

    async def _events(
        self,
        stream: Any,
        first: Any,
        request_id: str,
        chat: bool,
        stop: tuple[str, ...],
        include_usage: bool,
        fault: str,
    ) -> AsyncIterator[str]:
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(text: str | None, reason: str | None = None, role: bool = False) -> str:
            if chat:
                delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {"content": text}
                choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "stop_reason": None}
            data = {"id": request_id, "object": obj, "created": created, "model": MODEL, "choices": [choice]}
            return f"data: {json.dumps(data)}\n\n"

        self._set(request_id, "running")
        state = "client gone"
        try:
            async with stream:
                if chat:
                    yield chunk(None, role=True)
                sent, held, reason = 0, "", None
                item = first
                while item is not None:
                    delta = item.chunk
                    held += delta.text
                    cut = min((held.index(s) for s in stop if s in held), default=None)
                    if cut is not None:
                        held, reason = held[:cut], "stop"
                    elif delta.final:
                        reason = delta.finish_reason
                    keep = 0 if reason else max((len(s) - 1 for s in stop), default=0)
                    out, held = held[: len(held) - keep], held[len(held) - keep :]
                    if reason:
                        yield chunk(out, reason)
                        break
                    if out:
                        yield chunk(out)
                        sent += 1
                    if sent == 1 and fault == "stall":
                        await asyncio.Event().wait()  # until the client leaves (the response task is cancelled)
                    if sent == 1 and fault == "drop":
                        raise ConnectionResetError("stand-in: dropping the connection mid-stream")
                    if sent == 1 and fault == "error-midway":
                        error = {"message": "EngineCore encountered an issue.", "type": "InternalServerError"}
                        yield f"data: {json.dumps({'error': {**error, 'param': None, 'code': 500}})}\n\n"
                        yield "data: [DONE]\n\n"
                        state = "done"
                        return
                    item = await anext(aiter(stream), None)
                if include_usage:
                    usage = stream.usage["text"]
                    counts = {
                        "prompt_tokens": usage.input_tokens,
                        "total_tokens": usage.total_tokens,
                        "completion_tokens": usage.output_tokens,
                    }
                    data = {"id": request_id, "object": obj, "created": created, "model": MODEL, "choices": []}
                    yield f"data: {json.dumps({**data, 'usage': counts})}\n\n"
                yield "data: [DONE]\n\n"
                state = "done"
        finally:
            self._set(request_id, state)


@contextlib.contextmanager
def running_standin(directory: Path, api_key: str | None = None) -> Iterator[StandIn]:
    """Serve the stand-in on 127.0.0.1 until the block ends."""
    checkpoint = write_lm_checkpoint(directory / "synthetic-lm", max_context=MAX_CONTEXT)
    # IPPROTO_TCP named: asyncio turns Nagle's algorithm off only on sockets that say TCP (with it on, a kept-alive
    # client waits 40 ms for each response's second segment, the delayed ACK)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    standin = StandIn(f"http://127.0.0.1:{sock.getsockname()[1]}", api_key)
    config = uvicorn.Config(standin.app(checkpoint), log_level="critical", lifespan="on", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="standin-uvicorn")
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the stand-in server did not start")
        time.sleep(0.01)
    try:
        yield standin
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
