"""POST /v1/chat/completions: OpenAI's chat shape over the engine's ``chat`` and ``chat+speech`` pipelines.

Text only: ``stream=true`` sends ``chat.completion.chunk`` objects as ``data:`` lines ending in ``data: [DONE]``
(``stream_options.include_usage`` adds a usage chunk), otherwise one ``chat.completion`` object. With
``modalities=["text","audio"]`` the text model's reply is also spoken, sentence by sentence (the next sentence
is synthesized while the current one streams), and arrives in the same stream as OpenAI's audio-output deltas:
``choices[0].delta.audio {id, transcript}`` when a sentence starts and ``{id, data}`` (base64 PCM16 LE mono at the
speech model's rate, 24 kHz) for its audio, interleaved with the text deltas; non-streamed, ``message.audio {id,
data, transcript, expires_at}`` in ``audio.format``. Extension: ``audio.max_sentence_chars`` cuts spoken units at
that many characters (at a sentence end, else a space), so a long first sentence does not hold back the first
audio. Tools (``tools``, ``tool_choice``, ``parallel_tool_calls``): the reply's calls arrive as ``delta.tool_calls``
pieces (streamed) or ``message.tool_calls``, with ``finish_reason: "tool_calls"``; a spoken reply speaks its text
and never its calls. The first output is awaited before the status line, so a
request the model refuses (a prompt longer than its context) is a 400, not a broken stream; a failure after that
is an in-band ``{"error": ...}`` chunk then ``[DONE]``. A client that leaves cancels every model's request.
User turns may show images to a text model that sees (``image_url`` parts with data URLs; :mod:`.pictures`); a
model that does not see refuses them with a 400 naming ``messages``.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread
import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from omni_stream.chunks import Audio, StageOutput, TextDelta
from omni_stream.engine import RequestStream
from omni_stream.family import ModelKind
from omni_stream.realtime.chat.params import ChatOptions, parse_chat
from omni_stream.realtime.chat.pictures import show
from omni_stream.realtime.common.audio_out import AudioOut, encode_whole
from omni_stream.realtime.common.body_limit import read_json
from omni_stream.realtime.common.errors import ApiError, from_exception
from omni_stream.realtime.common.route import answer
from omni_stream.realtime.common.sse import SSE_HEADERS, SSE_MEDIA_TYPE, sse_data
from omni_stream.realtime.common.streams import ClosingStreamingResponse, close_stream, until_disconnect
from omni_stream.realtime.speech.build import refresh_voice
from omni_stream.realtime.speech.params import check_model
from omni_stream.realtime.state import ServerState
from omni_stream.requests import ChatRequest, SpokenReply, TextRequest
from omni_stream.text.tools import ToolCallDelta, assemble

log = logging.getLogger("omni_stream.realtime.chat.http")
ROUTE = "/v1/chat/completions"
AUDIO_TTL = 3600  # seconds an audio id is said to stay valid (we keep nothing: replies are not stored)


async def create_chat_completion(request: Request) -> Response:
    return await answer(request, ROUTE, _create)


async def _chat_request(state: ServerState, opts: ChatOptions) -> ChatRequest:
    messages = opts.messages
    if opts.pictures:  # image decodes, off the event loop
        messages = await anyio.to_thread.run_sync(show, messages, opts.pictures, state.settings.frame_limits)
    text = TextRequest(
        messages=messages,
        max_tokens=opts.max_tokens,
        sampling=opts.sampling,
        stop=opts.stop,
        seed=opts.seed,
        ignore_eos=opts.ignore_eos,
        tools=opts.tools,
        tool_choice=opts.tool_choice,
        parallel_tool_calls=opts.parallel_tool_calls,
        response_format=opts.response_format,
        presence_penalty=opts.presence_penalty,
        frequency_penalty=opts.frequency_penalty,
        logit_bias=opts.logit_bias,
        logprobs=opts.logprobs,
    )
    if not opts.speaks:
        return ChatRequest(text)
    if not state.ready_engine.has_speech:
        raise ApiError(400, "Audio output needs a speech model, and this server has none loaded", "modalities")
    if opts.voice is not None:
        await refresh_voice(state, opts.voice)
    return ChatRequest(text, speech=SpokenReply(voice=opts.voice, max_unit_chars=opts.max_sentence_chars))


@dataclass(slots=True)
class _Reply:
    """One reply's identity and what has been said so far."""

    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))
    finish_reason: str | None = None

    @property
    def audio_id(self) -> str:
        return f"audio_{self.id.removeprefix('chatcmpl-')}"

    def chunk(
        self, delta: dict[str, Any], finish_reason: str | None = None, logprobs: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        if logprobs is not None:
            choice["logprobs"] = {"content": logprobs, "refusal": None}
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }


def usage_body(stream: RequestStream[TextDelta | Audio], speaks: bool) -> dict[str, Any]:
    usage = stream.usage
    text = usage.get(ModelKind.TEXT)
    prompt, completion = (text.input_tokens, text.output_tokens) if text is not None else (0, 0)
    body: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if speaks:
        speech = usage.get(ModelKind.SPEECH)
        body["completion_tokens_details"] = {"audio_tokens": speech.output_tokens if speech is not None else 0}
    return body


async def _create(request: Request, state: ServerState) -> Response:
    body = await read_json(request, state.settings.max_speech_body_bytes)
    opts = parse_chat(body, state.settings)
    check_model(opts.model, state.served_models(ModelKind.TEXT))
    engine = state.ready_engine
    chat_request = await _chat_request(state, opts)
    stream = engine.generate(chat_request)
    reply = _Reply(f"chatcmpl-{chat_request.request_id}", opts.model or state.served_models(ModelKind.TEXT)[0])
    outputs = aiter(stream)
    try:
        arrived, first = await until_disconnect(request.receive, lambda: anext(outputs, None))
    except BaseException:
        await close_stream(stream)
        raise
    if not arrived:
        await close_stream(stream)
        state.metrics.disconnects.labels("http").inc()
        return Response(status_code=499)
    if not opts.stream:
        return await _whole(request, state, opts, stream, reply, first)
    rate = engine.speech_info.sample_rate if opts.speaks else 0
    out = await AudioOut.open("pcm", rate) if opts.speaks else None

    async def release() -> None:
        if out is not None:
            out.close()
        await close_stream(stream)

    gen = _sse(state, opts, stream, reply, first, out)
    return ClosingStreamingResponse(gen, on_close=release, media_type=SSE_MEDIA_TYPE, headers=SSE_HEADERS)


async def _then(
    first: StageOutput[TextDelta | Audio] | None, stream: RequestStream[TextDelta | Audio]
) -> AsyncGenerator[StageOutput[TextDelta | Audio]]:
    if first is None:
        return
    yield first
    async for item in stream:
        yield item


async def _sse(
    state: ServerState,
    opts: ChatOptions,
    stream: RequestStream[TextDelta | Audio],
    reply: _Reply,
    first: StageOutput[TextDelta | Audio] | None,
    out: AudioOut | None,
) -> AsyncGenerator[bytes]:
    gauge = state.metrics.streams.labels("chat")
    gauge.inc()
    done = False
    spoken = called = False  # an answer that only calls tools says nothing: no audio object for it
    try:
        yield sse_data(reply.chunk({"role": "assistant", "content": ""}))
        try:
            async for item in _then(first, stream):
                chunk = item.chunk
                if item.stage == "text" and isinstance(chunk, TextDelta):
                    reply.finish_reason = chunk.finish_reason or reply.finish_reason
                    lps = [e.wire() for e in chunk.logprobs] if opts.logprobs is not None else None
                    if chunk.text or chunk.cut_call or lps:
                        yield sse_data(reply.chunk({"content": chunk.text + chunk.cut_call}, logprobs=lps))
                    if chunk.tool_calls:
                        called = True
                        yield sse_data(reply.chunk({"tool_calls": [c.wire() for c in chunk.tool_calls]}))
                elif isinstance(chunk, TextDelta) and chunk.text:  # a spoken sentence's transcript
                    spoken = True
                    yield sse_data(reply.chunk({"audio": {"id": reply.audio_id, "transcript": chunk.text}}))
                elif isinstance(chunk, Audio) and out is not None:
                    data = await out.encode(chunk.samples)
                    if data:
                        spoken = True
                        audio = {"id": reply.audio_id, "data": base64.b64encode(data).decode()}
                        yield sse_data(reply.chunk({"audio": audio}))
            if out is not None and (spoken or not called):
                yield sse_data(reply.chunk({"audio": {"id": reply.audio_id, "expires_at": reply.created + AUDIO_TTL}}))
            yield sse_data(reply.chunk({}, reply.finish_reason or "stop"))
            if opts.include_usage:
                yield sse_data({**reply.chunk({}), "choices": [], "usage": usage_body(stream, opts.speaks)})
        except Exception as exc:  # after the start: in-band error, then the end of the stream
            log.exception("chat stream failed")
            error = from_exception(exc).body()["error"]
            if error["code"] >= 500:
                error["type"] = "server_error"
            yield sse_data({"error": error})
        yield sse_data("[DONE]")
        done = True
    finally:
        gauge.dec()
        if not done:
            state.metrics.disconnects.labels("chat").inc()
        await close_stream(stream)


async def _whole(
    request: Request,
    state: ServerState,
    opts: ChatOptions,
    stream: RequestStream[TextDelta | Audio],
    reply: _Reply,
    first: StageOutput[TextDelta | Audio] | None,
) -> Response:
    text: list[str] = []
    calls: list[ToolCallDelta] = []
    logprobs: list[dict[str, Any]] = []
    transcript: list[str] = []
    audio: list[np.ndarray] = []

    async def collect() -> None:
        async for item in _then(first, stream):
            chunk = item.chunk
            if item.stage == "text" and isinstance(chunk, TextDelta):
                text.append(chunk.text + chunk.cut_call)
                calls.extend(chunk.tool_calls)
                logprobs.extend(e.wire() for e in chunk.logprobs)
                reply.finish_reason = chunk.finish_reason or reply.finish_reason
            elif isinstance(chunk, TextDelta):
                transcript.append(chunk.text)
            elif isinstance(chunk, Audio):
                audio.append(chunk.samples)

    try:
        finished, _ = await until_disconnect(request.receive, collect)
    finally:
        await close_stream(stream)
    if not finished:
        state.metrics.disconnects.labels("http").inc()
        return Response(status_code=499)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if calls:
        message["tool_calls"] = [c.wire() for c in assemble(calls)]
        message["content"] = message["content"] or None
    if opts.speaks and calls and not audio and not transcript:
        message["audio"] = None  # the answer only calls tools: nothing was spoken (OpenAI's null)
    elif opts.speaks:
        assert opts.audio_format is not None
        samples = np.concatenate(audio) if audio else np.zeros(0, np.float32)
        fmt = "pcm" if opts.audio_format == "pcm16" else opts.audio_format
        rate = state.ready_engine.speech_info.sample_rate
        data, _ = await anyio.to_thread.run_sync(encode_whole, fmt, samples, rate)
        message["audio"] = {
            "id": reply.audio_id,
            "data": base64.b64encode(data).decode(),
            "transcript": "".join(transcript),
            "expires_at": reply.created + AUDIO_TTL,
        }
    body = {
        "id": reply.id,
        "object": "chat.completion",
        "created": reply.created,
        "model": reply.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": reply.finish_reason or "stop",
                "logprobs": {"content": logprobs, "refusal": None} if opts.logprobs is not None else None,
            }
        ],
        "usage": usage_body(stream, opts.speaks),
    }
    return JSONResponse(body)
