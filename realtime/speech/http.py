"""POST /v1/audio/speech: one body, a raw chunked stream, or server-sent events, chosen from the fields."""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncGenerator
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from omni_stream import codecs
from omni_stream.chunks import Audio
from omni_stream.engine import SpeechStream
from omni_stream.realtime.common.audio_out import (
    AudioOut,
    audio_headers,
    encode_whole,
    first_chunk_and_output,
    with_first,
)
from omni_stream.realtime.common.body_limit import read_json
from omni_stream.realtime.common.errors import ApiError
from omni_stream.realtime.common.route import answer
from omni_stream.realtime.common.sse import SSE_HEADERS, SSE_MEDIA_TYPE, sse_event
from omni_stream.realtime.common.stream_pacing import paced_audio
from omni_stream.realtime.common.streams import ClosingStreamingResponse, close_stream, until_disconnect
from omni_stream.realtime.speech.build import build_request
from omni_stream.realtime.speech.params import SpeechOptions, StreamMode, check_model, parse_input, parse_options
from omni_stream.realtime.state import ServerState

log = logging.getLogger("omni_stream.realtime.speech")
ROUTE = "/v1/audio/speech"


def usage_body(stream: SpeechStream) -> dict[str, Any]:
    """The ``usage`` object: input tokens split into text and audio (reference codec frames), as vLLM-Omni."""
    usage = stream.usage
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
        "input_token_details": {"text_tokens": usage.input_text_tokens, "audio_tokens": usage.input_audio_tokens},
    }


def usage_headers(stream: SpeechStream) -> dict[str, str]:
    """Usage of a whole-body response, under our names and vLLM-Omni's (with its text/audio split)."""
    usage = usage_body(stream)
    inp, out, total = (str(usage[k]) for k in ("input_tokens", "output_tokens", "total_tokens"))
    details = usage["input_token_details"]
    return {
        "x-omni-stream-input-tokens": inp,
        "x-omni-stream-output-tokens": out,
        "x-omni-stream-total-tokens": total,
        "x-vllm-omni-input-tokens": inp,
        "x-vllm-omni-output-tokens": out,
        "x-vllm-omni-total-tokens": total,
        "x-vllm-omni-input-text-tokens": str(details["text_tokens"]),
        "x-vllm-omni-input-audio-tokens": str(details["audio_tokens"]),
    }


async def create_speech(request: Request) -> Response:
    return await answer(request, ROUTE, _create_speech)


async def _create_speech(request: Request, state: ServerState) -> Response:
    body = await read_json(request, state.settings.max_speech_body_bytes)
    opts = parse_options(body, state.settings)
    check_model(opts.model, state.served_models())
    text = parse_input(body, state.settings)
    if state.engine is None:
        raise ApiError(503, "The model is still loading")
    speech_request = await build_request(state, opts, text)
    stream = state.engine.speech(speech_request)
    chunks = aiter(stream)
    if opts.stream_mode is StreamMode.NONE:
        return await _whole(request, state, opts, stream)
    rate = state.ready_engine.speech_info.sample_rate
    try:
        # The first chunk is awaited before the status line: errors up to here are plain HTTP errors.
        arrived, opened = await until_disconnect(
            request.receive, lambda: first_chunk_and_output(chunks, opts.response_format, rate, opts.sample_rate)
        )
        if not arrived or opened is None:
            await close_stream(stream)
            state.metrics.disconnects.labels("http").inc()
            return Response(status_code=499)
        first, out = opened
    except BaseException:
        await close_stream(stream)
        raise

    async def release() -> None:
        out.close()
        await close_stream(stream)

    if opts.stream_mode is StreamMode.AUDIO:
        gen = _raw_body(state, stream, paced_audio(state, with_first(first, chunks), "http"), out)
        return ClosingStreamingResponse(
            gen, on_close=release, media_type=out.mime_type, headers=audio_headers(out.sample_rate)
        )
    audio = paced_audio(state, with_first(first, chunks), "sse")
    gen = _sse_body(state, stream, audio, out)
    headers = {**SSE_HEADERS, **audio_headers(out.sample_rate)}
    return ClosingStreamingResponse(gen, on_close=release, media_type=SSE_MEDIA_TYPE, headers=headers)


async def _collect(stream: SpeechStream) -> list[np.ndarray]:
    return [audio.samples async for audio in stream]


async def _whole(request: Request, state: ServerState, opts: SpeechOptions, stream: SpeechStream) -> Response:
    try:
        finished, pieces = await until_disconnect(request.receive, lambda: _collect(stream))
    finally:
        await close_stream(stream)
    if not finished or pieces is None:
        state.metrics.disconnects.labels("http").inc()
        return Response(status_code=499)
    samples = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    src = state.ready_engine.speech_info.sample_rate
    data, rate = await anyio.to_thread.run_sync(
        encode_whole, opts.response_format, samples, src, opts.sample_rate, opts.speed
    )
    headers = {**audio_headers(rate, opts.sample_rate), **usage_headers(stream)}
    return Response(data, media_type=codecs.mime_type(opts.response_format), headers=headers)


async def _raw_body(
    state: ServerState, stream: SpeechStream, audio_chunks: AsyncGenerator[Audio], out: AudioOut
) -> AsyncGenerator[bytes]:
    gauge = state.metrics.streams.labels("http")
    gauge.inc()
    done = False
    try:
        async for audio in audio_chunks:
            data = await out.encode(audio.samples)
            if data:
                yield data
        tail = await out.finish()
        done = True
        if tail:
            yield tail
    finally:
        out.close()
        gauge.dec()
        if not done:
            state.metrics.disconnects.labels("http").inc()
        await close_stream(stream)


async def _sse_body(
    state: ServerState, stream: SpeechStream, audio_chunks: AsyncGenerator[Audio], out: AudioOut
) -> AsyncGenerator[bytes]:
    gauge = state.metrics.streams.labels("sse")
    gauge.inc()
    fmt = out.format
    terminal = False

    def delta(data: bytes) -> bytes:
        payload = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode(), "response_format": fmt}
        return sse_event("speech.audio.delta", payload)

    try:
        try:
            async for audio in audio_chunks:
                data = await out.encode(audio.samples)
                if data:
                    yield delta(data)
            tail = await out.finish()
            if tail:
                yield delta(tail)
        except Exception as exc:  # after the start: in-band error instead of done
            log.exception("speech stream failed")
            error = {"message": f"{type(exc).__name__}: {exc}", "type": "server_error", "param": None, "code": 500}
            terminal = True
            yield sse_event("speech.audio.error", {"type": "speech.audio.error", "error": error})
            return
        terminal = True
        yield sse_event("speech.audio.done", {"type": "speech.audio.done", "usage": usage_body(stream)})
    finally:
        out.close()
        gauge.dec()
        if not terminal:
            state.metrics.disconnects.labels("sse").inc()
        await close_stream(stream)
