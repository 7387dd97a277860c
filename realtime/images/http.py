"""POST /v1/images/edits (multipart) and /v1/images/generations (JSON): one JSON body, or SSE in one of two
dialects (:mod:`omni_stream.realtime.images.params` has the rule, :mod:`omni_stream.realtime.images.sse` the events).

Every validation problem is a 400 before any work: the body is read within its limits (an oversized upload is
refused as it arrives), images are decoded off the loop within a pixel limit, and the engine checks the request
against the model before anything streams. With ``stream=true`` the first output is awaited before the status
line, so a failure up to there is a plain HTTP error and a failure after it an in-band error event. A client that
leaves cancels the request: its job is not stepped again after the step in progress. A rewriting text model is
stopped at the image model's prompt limit (:mod:`omni_stream.images.prompt_bound`): every response names the limit
in ``x-omni-stream-image-prompt-limit``, and OpenAI's ``usage`` carries ``image_prompt {tokens, max_tokens,
rewrite_stopped}``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import anyio
import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from omni_stream.chunks import Image, StageOutput, TextDelta
from omni_stream.engine import RequestStream
from omni_stream.errors import StageError
from omni_stream.family import ModelKind
from omni_stream.images.prompt_bound import PROMPT_LIMIT
from omni_stream.images.spec import ImageRequest, image_family, output_size, uses_text
from omni_stream.realtime.common.body_limit import parse_json, read_body
from omni_stream.realtime.common.errors import ApiError, bad_request
from omni_stream.realtime.common.form_stream import FormLimits, read_form
from omni_stream.realtime.common.json_fields import FieldError
from omni_stream.realtime.common.route import answer
from omni_stream.realtime.common.sse import SSE_HEADERS, SSE_MEDIA_TYPE
from omni_stream.realtime.common.streams import ClosingStreamingResponse, close_stream, until_disconnect
from omni_stream.realtime.images.files import decode_image, decode_mask, encode_b64
from omni_stream.realtime.images.params import (
    EDIT_FIELDS,
    EDIT_FILES,
    GENERATION_FIELDS,
    Dialect,
    ImageParams,
    choose_dialect,
    form_values,
    from_openai_sdk,
    parse_params,
)
from omni_stream.realtime.images.sse import ImageEvents, usage_body
from omni_stream.realtime.speech.params import check_model
from omni_stream.realtime.state import ServerState

log = logging.getLogger("omni_stream.realtime.images.http")
EDITS_ROUTE = "/v1/images/edits"
GENERATIONS_ROUTE = "/v1/images/generations"
MAX_JSON_BYTES = 1024 * 1024  # a generation request is a prompt and a few fields
PROMPT_LIMIT_HEADER = "x-omni-stream-image-prompt-limit"  # the image model's prompt limit, in its encoder's tokens


async def create_edit(request: Request) -> Response:
    return await answer(request, EDITS_ROUTE, _edit)


async def create_generation(request: Request) -> Response:
    return await answer(request, GENERATIONS_ROUTE, _generation)


def _check_engine(state: ServerState, params: ImageParams) -> None:
    if state.engine is None:
        raise ApiError(503, "The model is still loading")
    check_model(params.model, state.served_models(ModelKind.IMAGE))
    state.engine.models.get(ModelKind.IMAGE)  # 400 naming "model" when no image model is loaded


def _decode_uploads(images: list[bytes], mask: bytes | None, max_pixels: int) -> tuple[tuple[Any, ...], Any | None]:
    """Uploads -> arrays (blocking: off the loop)."""
    decoded = tuple(decode_image(data, "image", max_pixels) for data in images)
    if mask is None:
        return decoded, None
    h, w = decoded[0].shape[:2]
    return decoded, decode_mask(mask, (w, h), max_pixels)


async def _edit(request: Request, state: ServerState) -> Response:
    settings = state.settings
    form = await read_form(
        request, FormLimits(max_file_bytes=settings.max_image_bytes, max_files=settings.max_image_files)
    )
    for part in form.files:
        if part.field not in EDIT_FILES:
            raise bad_request(f"Unknown file field '{part.field}' (image, image[] or mask)", part.field)
    for field, _ in form.fields:  # a text part where a file goes: say what is wrong with it, not that it is unknown
        if field in EDIT_FILES:
            raise bad_request(f"'{field}' must be an uploaded file (a multipart file part), not a text field", field)
    params = parse_params(form_values(form.fields), EDIT_FIELDS, form=True)
    uploads = form.files_of("image", "image[]")
    if not uploads:
        raise bad_request("'image' is required: the image (PNG, JPEG or WebP) to edit", "image")
    masks = form.files_of("mask")
    if len(masks) > 1:
        raise bad_request("Only one 'mask' may be sent", "mask")
    _check_engine(state, params)
    images, mask = await anyio.to_thread.run_sync(
        _decode_uploads, [u.data for u in uploads], masks[0].data if masks else None, settings.max_image_pixels
    )
    del form, uploads, masks  # the bytes are no longer needed while the request runs
    return await _serve(request, state, params, images, mask, "edit")


async def _generation(request: Request, state: ServerState) -> Response:
    if request.headers.get("content-type", "").lower().startswith("multipart/"):
        raise bad_request("Image generations take a JSON body (application/json); edits take multipart/form-data")
    body = await read_body(request, MAX_JSON_BYTES)
    try:
        values = parse_json(body) if body else None
    except FieldError as exc:  # a string no UTF-8 text holds, named by its path
        raise bad_request(exc.message, exc.param) from None
    except (ValueError, RecursionError) as exc:
        raise bad_request(f"Request body is not valid JSON: {exc}") from exc
    if not isinstance(values, dict):
        raise bad_request("Request body must be a JSON object")
    params = parse_params(values, GENERATION_FIELDS, form=False)
    _check_engine(state, params)
    return await _serve(request, state, params, (), None, "generation")


def _image_request(params: ImageParams, images: tuple[Any, ...], mask: Any | None) -> ImageRequest:
    streamed = params.stream
    return ImageRequest(
        prompt=params.prompt,
        images=images,
        mask=mask,
        size=params.size,
        n=params.n,
        steps=params.steps,
        guidance_scale=params.guidance_scale,
        seed=params.seed,
        partial_images=(params.partial_images or 0) if streamed else 0,
        rewrite=params.rewrite,
    )


async def _serve(
    request: Request,
    state: ServerState,
    params: ImageParams,
    images: tuple[Any, ...],
    mask: Any | None,
    surface: str,
) -> Response:
    engine = state.ready_engine
    image_request = _image_request(params, images, mask)
    dialect = choose_dialect(params, uses_text(image_request, engine.models), from_openai_sdk(request.headers))
    info = image_family(engine.models).info
    width, height = output_size(info, image_request)
    events = ImageEvents(
        dialect or Dialect.OPENAI,
        surface,
        params.model or state.served_models(ModelKind.IMAGE)[0],
        int(time.time()),
        params.output_format,
        f"{width}x{height}",
        quality=params.quality,
        prompt_limit=info.max_prompt_tokens,
    )
    stream = engine.generate(image_request)  # invalid for the model: a 400 here, before anything runs
    if dialect is None:
        return await _whole(request, state, stream, params, events)
    outputs = aiter(stream)
    try:
        arrived, first = await until_disconnect(request.receive, lambda: anext(outputs, None))
        if not arrived:
            await close_stream(stream)
            state.metrics.disconnects.labels("http").inc()
            return Response(status_code=499)
    except BaseException:
        await close_stream(stream)
        raise

    async def release() -> None:
        await close_stream(stream)

    body = _events(state, stream, _chain(first, outputs), params, events)
    headers = {**SSE_HEADERS, **_limit_header(events)}
    return ClosingStreamingResponse(body, on_close=release, media_type=SSE_MEDIA_TYPE, headers=headers)


def _limit_header(events: ImageEvents) -> dict[str, str]:
    """The image model's prompt limit, known before the stream starts (the vLLM-Omni dialect carries no usage)."""
    return {} if events.prompt_limit is None else {PROMPT_LIMIT_HEADER: str(events.prompt_limit)}


def _stopped(chunk: TextDelta) -> bool:
    return chunk.finish_reason == PROMPT_LIMIT


async def _chain(
    first: StageOutput[TextDelta | Image] | None, rest: AsyncIterator[StageOutput[TextDelta | Image]]
) -> AsyncIterator[StageOutput[TextDelta | Image]]:
    if first is None:
        return
    yield first
    async for out in rest:
        yield out


async def _events(
    state: ServerState,
    stream: RequestStream[TextDelta | Image],
    outputs: AsyncIterator[StageOutput[TextDelta | Image]],
    params: ImageParams,
    events: ImageEvents,
) -> AsyncGenerator[bytes]:
    gauge = state.metrics.streams.labels("sse")
    gauge.inc()
    terminal = False
    try:
        finals: list[str] = []
        stopped = False
        try:
            previews = 0
            async for out in outputs:
                chunk = out.chunk
                if isinstance(chunk, TextDelta):
                    stopped |= _stopped(chunk)
                    if chunk.text:
                        yield events.text(chunk.text)
                elif isinstance(chunk, Image):
                    b64 = await anyio.to_thread.run_sync(
                        encode_b64, chunk.pixels, params.output_format, params.output_compression
                    )
                    if chunk.partial:
                        yield events.partial(b64, previews)
                        previews += 1
                    else:
                        finals.append(b64)
            if len(finals) != params.n:
                raise StageError(f"the image stage ended with {len(finals)} of {params.n} images")
        except Exception as exc:  # after the start: an in-band error, then the end
            log.exception("image stream failed")
            terminal = True
            for event in events.error(f"{type(exc).__name__}: {exc}"):
                yield event
            return
        terminal = True
        for event in events.completed(finals, stream.usage, stopped):
            yield event
    finally:
        gauge.dec()
        if not terminal:
            state.metrics.disconnects.labels("sse").inc()
        await close_stream(stream)


async def _collect(stream: RequestStream[TextDelta | Image]) -> list[StageOutput[TextDelta | Image]]:
    return [out async for out in stream]


def _encode_all(pictures: list[Image], params: ImageParams) -> list[str]:
    return [encode_b64(p.pixels, params.output_format, params.output_compression) for p in pictures]


async def _whole(
    request: Request,
    state: ServerState,
    stream: RequestStream[TextDelta | Image],
    params: ImageParams,
    events: ImageEvents,
) -> Response:
    try:
        finished, outputs = await until_disconnect(request.receive, lambda: _collect(stream))
    finally:
        await close_stream(stream)
    if not finished or outputs is None:
        state.metrics.disconnects.labels("http").inc()
        return Response(status_code=499)
    pictures = [o.chunk for o in outputs if isinstance(o.chunk, Image) and not o.chunk.partial]
    revised = "".join(o.chunk.text for o in outputs if isinstance(o.chunk, TextDelta)).strip() or None
    b64s = await anyio.to_thread.run_sync(_encode_all, pictures, params)
    body = {
        "created": events.created,
        "data": [{"b64_json": b64, "revised_prompt": revised} for b64 in b64s],
        "background": events.background,
        "output_format": params.output_format,
        "quality": events.quality,
        "size": events.size,
        "usage": usage_body(
            stream.usage, events.prompt_limit, any(_stopped(o.chunk) for o in outputs if isinstance(o.chunk, TextDelta))
        ),
    }
    return JSONResponse(body, headers=_limit_header(events))
