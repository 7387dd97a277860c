"""POST /v1/audio/transcriptions and /v1/audio/translations (multipart): the transcript (or its English
translation, Whisper's other task) as JSON or text, or streamed as OpenAI's SSE events.

Every validation problem is a 400 before any work: the form is read within its limits (a file past
``max_transcription_bytes`` is refused as it arrives), the audio is decoded off the loop at the model's rate within
``max_transcription_seconds``, and the engine checks every window's request (language, prompt) before any runs. A
recording longer than the model's window is transcribed window by window
(:mod:`omni_stream.transcription.long_form`), as bulk work: behind a voice agent's turns on the same model, in at
most half its batch slots (``TranscriptionRequest.bulk``). With ``stream=true`` the first text is awaited before
the status line, so a failure up to there is a plain HTTP error and one after it an in-band ``error`` event. A
client that leaves cancels every window: none is stepped again after the step in progress.

Bodies, as OpenAI's: JSON ``{"text", "usage": {"type": "tokens", input_tokens, output_tokens, total_tokens,
input_token_details {audio_tokens, text_tokens}}}``; ``text``: the transcript alone (``text/plain``); SSE: ``data:``
lines of ``{"type": "transcript.text.delta", "delta"}`` then one ``{"type": "transcript.text.done", "text",
"usage"}`` (the openai SDK's ``TranscriptionTextDeltaEvent`` / ``TranscriptionTextDoneEvent``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from functools import partial
from typing import Any

import anyio.to_thread
import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from omni_stream import codecs
from omni_stream.family import ModelKind
from omni_stream.realtime.common.errors import ApiError, bad_request, from_exception
from omni_stream.realtime.common.form_stream import FormLimits, read_form
from omni_stream.realtime.common.route import answer
from omni_stream.realtime.common.sse import SSE_HEADERS, SSE_MEDIA_TYPE, sse_data
from omni_stream.realtime.common.streams import ClosingStreamingResponse, until_disconnect
from omni_stream.realtime.speech.params import check_model
from omni_stream.realtime.state import ServerState
from omni_stream.realtime.transcription.params import (
    FILES,
    ResponseFormat,
    TranscriptionParams,
    parse_params,
    split_lists,
)
from omni_stream.request_streams import Usage
from omni_stream.transcription.long_form import LongTranscript, transcribe_windows, window_requests
from omni_stream.transcription.spec import Task, TranscriptionRequest, transcription_family

log = logging.getLogger("omni_stream.realtime.transcription.http")
ROUTE = "/v1/audio/transcriptions"
TRANSLATIONS_ROUTE = "/v1/audio/translations"


async def create_transcription(request: Request) -> Response:
    return await answer(request, ROUTE, partial(_transcribe, task=Task.TRANSCRIBE))


async def create_translation(request: Request) -> Response:
    """The same route, with English text of speech in any language (Whisper's translate task)."""
    return await answer(request, TRANSLATIONS_ROUTE, partial(_transcribe, task=Task.TRANSLATE))


def usage_body(usage: Usage) -> dict[str, Any]:
    """OpenAI's token usage of a transcription: audio (and prompt text) in, text out."""
    return {
        "type": "tokens",
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
        "input_token_details": {"audio_tokens": usage.input_audio_tokens, "text_tokens": usage.input_text_tokens},
    }


def _prepare(
    data: bytes, rate: int, max_seconds: float, params: TranscriptionParams, task: Task, window: float | None
) -> tuple[tuple[tuple[int, int], ...], tuple[TranscriptionRequest, ...]]:
    """The upload decoded, and its request cut into the model's windows (blocking: off the loop, as every scan of
    a recording of up to ``max_seconds`` is)."""
    samples = _decode(data, rate, max_seconds)
    request = TranscriptionRequest(samples, rate, language=params.language, prompt=params.prompt, task=task, bulk=True)
    return window_requests(request, window)


def _decode(data: bytes, rate: int, max_seconds: float) -> np.ndarray:
    """The uploaded file as float32 mono at ``rate`` Hz (blocking: off the loop); a 400 naming ``file``."""
    try:
        samples, _ = codecs.decode_audio(data, rate, max_seconds=max_seconds)
    except codecs.AudioDecodeError as exc:
        if "longer than" in str(exc):
            message = f"'file' lasts more than {max_seconds:g} s, the most this server transcribes"
            raise bad_request(message, "file") from None
        raise bad_request(f"Could not decode 'file': {exc}", "file") from exc
    if samples.size == 0:
        raise bad_request("'file' holds no audio", "file")
    return samples


async def _transcribe(request: Request, state: ServerState, *, task: Task) -> Response:
    settings = state.settings
    form = await read_form(request, FormLimits(max_file_bytes=settings.max_transcription_bytes, max_files=1))
    for part in form.files:
        if part.field not in FILES:
            raise bad_request(f"Unknown file field '{part.field}' (the audio goes in 'file')", part.field)
    params = parse_params(*split_lists(form.fields))
    uploads = form.files_of("file")
    if not uploads:
        raise bad_request("'file' is required: the audio to transcribe (wav, mp3, flac, ogg, webm, m4a, ...)", "file")
    if state.engine is None:
        raise ApiError(503, "The model is still loading")
    check_model(params.model, state.served_models(ModelKind.TRANSCRIPTION))
    engine = state.engine
    engine.models.get(ModelKind.TRANSCRIPTION)  # 400 naming "model" when no transcription model is loaded
    info = transcription_family(engine.models).info
    data = uploads[0].data
    del form, uploads  # the decoded samples replace the upload's bytes
    windows, parts = await anyio.to_thread.run_sync(
        _prepare, data, info.sample_rate, settings.max_transcription_seconds, params, task, info.max_seconds
    )
    del data
    transcript = transcribe_windows(engine, windows, parts)  # a bad language: a 400 here, before anything runs
    if params.stream:
        return await _stream(request, state, transcript)
    return await _whole(request, state, transcript, params.response_format)


async def _read_all(transcript: LongTranscript) -> str:
    return "".join([piece async for piece in transcript])


async def _whole(request: Request, state: ServerState, transcript: LongTranscript, fmt: ResponseFormat) -> Response:
    async with transcript:
        finished, text = await until_disconnect(request.receive, lambda: _read_all(transcript))
    if not finished or text is None:
        state.metrics.disconnects.labels("http").inc()
        return Response(status_code=499)
    if fmt is ResponseFormat.TEXT:
        return PlainTextResponse(text)
    return JSONResponse({"text": text, "usage": usage_body(transcript.usage)})


async def _stream(request: Request, state: ServerState, transcript: LongTranscript) -> Response:
    pieces = aiter(transcript)
    try:
        arrived, first = await until_disconnect(request.receive, lambda: anext(pieces, None))
    except BaseException:
        await transcript.aclose()
        raise
    if not arrived:
        await transcript.aclose()
        state.metrics.disconnects.labels("http").inc()
        return Response(status_code=499)
    body = _events(state, transcript, first, pieces)
    return ClosingStreamingResponse(body, on_close=transcript.aclose, media_type=SSE_MEDIA_TYPE, headers=SSE_HEADERS)


async def _events(
    state: ServerState, transcript: LongTranscript, first: str | None, rest: AsyncIterator[str]
) -> AsyncGenerator[bytes]:
    gauge = state.metrics.streams.labels("sse")
    gauge.inc()
    terminal = False
    text: list[str] = []
    try:
        try:
            if first is not None:
                text.append(first)
                yield sse_data({"type": "transcript.text.delta", "delta": first})
                async for piece in rest:
                    text.append(piece)
                    yield sse_data({"type": "transcript.text.delta", "delta": piece})
        except Exception as exc:  # after the start: an in-band error, then the end
            log.exception("transcription stream failed")
            terminal = True
            yield sse_data({"type": "error", **from_exception(exc).body()})
            return
        terminal = True
        usage = usage_body(transcript.usage)
        yield sse_data({"type": "transcript.text.done", "text": "".join(text), "usage": usage})
    finally:
        gauge.dec()
        if not terminal:
            state.metrics.disconnects.labels("sse").inc()
        await transcript.aclose()
