"""POST /v1/audio/speech/batch: several speech requests in one body, generated together (vLLM-Omni's shape).

Body: ``{"items": [{"input": ..., <per-item overrides>}, ...], <shared defaults>}`` with 1 to
``Settings.batch_max_items`` items; every speech field but ``stream``/``stream_format`` may stand at either
level, an item's own value winning. All items are submitted to the engine at once, so its scheduler batches
them into the same model steps. Answer: ``{id, results: [{index, status: "success", audio_data (base64),
media_type, usage} | {index, status: "error", error}], total, succeeded, failed}``: one item's problem is that
item's error, never the batch's; a malformed batch (no items, too many, not objects) is a 400.
"""

from __future__ import annotations

import base64
import logging
import uuid
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from omni_stream import codecs
from omni_stream.realtime.common.audio_out import encode_whole
from omni_stream.realtime.common.errors import ApiError, bad_request, from_exception
from omni_stream.realtime.common.json_fields import type_name
from omni_stream.realtime.common.route import answer
from omni_stream.realtime.common.streams import close_stream, until_disconnect
from omni_stream.realtime.speech.build import build_request
from omni_stream.realtime.speech.http import read_json, usage_body
from omni_stream.realtime.speech.params import HTTP_FIELDS, check_model, parse_input, parse_options
from omni_stream.realtime.state import ServerState

log = logging.getLogger("omni_stream.realtime.speech")
ROUTE = "/v1/audio/speech/batch"
NOT_SHARED = ("items", "model")  # batch-level keys that are not per-item defaults
STREAMING_KEYS = ("stream", "stream_format")


async def create_speech_batch(request: Request) -> Response:
    return await answer(request, ROUTE, _create_batch)


def merge_items(body: Any, max_items: int) -> list[dict[str, Any]]:
    """Each item's fields over the batch's shared defaults; 400 for a malformed batch (pure)."""
    if not isinstance(body, dict):
        raise bad_request("Request body must be a JSON object")
    items = body.get("items")
    if not isinstance(items, list) or not items:
        raise bad_request("'items' must be a non-empty array of speech requests", "items")
    if len(items) > max_items:
        raise bad_request(f"Batch contains {len(items)} items, exceeding the maximum of {max_items}.", "items")
    for key in STREAMING_KEYS:
        if body.get(key) not in (None, False):
            raise bad_request(f"'{key}' is not supported for batch speech: each item is returned whole", key)
    shared = {k: v for k, v in body.items() if k not in NOT_SHARED and k not in STREAMING_KEYS}
    unknown = sorted(set(shared) - HTTP_FIELDS)
    if unknown:  # the batch's own fields: the batch's 400, not one error per item
        raise bad_request(f"Unknown field '{unknown[0]}'", unknown[0])
    merged = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise bad_request(f"items[{i}] must be a JSON object", "items")
        for key in STREAMING_KEYS:
            if item.get(key) not in (None, False):
                raise bad_request(f"'{key}' is not supported for batch speech (items[{i}])", key)
        own = {k: v for k, v in item.items() if v is not None and k not in STREAMING_KEYS}
        merged.append({**shared, **own})
    return merged


async def _create_batch(request: Request, state: ServerState) -> Response:
    settings = state.settings
    # Room for one shared reference clip and the items' text.
    body = await read_json(request, settings.max_speech_body_bytes + settings.batch_max_items * 64 * 1024)
    items = merge_items(body, settings.batch_max_items)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request(f"'model' must be a string, got {type_name(model)}", "model")
    check_model(model, state.served_models())
    if state.engine is None:
        raise ApiError(503, "The model is still loading")
    results: list[dict[str, Any] | None] = [None] * len(items)

    async def run_all() -> None:
        async with anyio.create_task_group() as tg:
            for index, item in enumerate(items):
                tg.start_soon(_run_item, state, index, item, results)

    finished, _ = await until_disconnect(request.receive, run_all)
    if not finished:
        state.metrics.disconnects.labels("http").inc()
        return Response(status_code=499)
    done = [r for r in results if r is not None]
    succeeded = sum(1 for r in done if r["status"] == "success")
    return JSONResponse(
        {
            "id": f"speech-batch-{uuid.uuid4().hex}",
            "results": done,
            "total": len(done),
            "succeeded": succeeded,
            "failed": len(done) - succeeded,
        }
    )


async def _run_item(state: ServerState, index: int, item: dict[str, Any], results: list[Any]) -> None:
    """One item to its result entry; every failure becomes that item's error (internal ones logged)."""
    stream = None
    try:
        opts = parse_options(item, state.settings)
        check_model(opts.model, state.served_models())  # an item may name the model too
        text = parse_input(item)
        speech_request = await build_request(state, opts, text)
        stream = state.ready_engine.speech(speech_request)
        pieces = [audio.samples async for audio in stream]
        samples = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        rate = state.ready_engine.speech_info.sample_rate
        data, _ = await anyio.to_thread.run_sync(
            encode_whole, opts.response_format, samples, rate, opts.sample_rate, opts.speed
        )
        results[index] = {
            "index": index,
            "status": "success",
            "audio_data": base64.b64encode(data).decode(),
            "media_type": codecs.mime_type(opts.response_format),
            "usage": usage_body(stream),
        }
    except Exception as exc:
        error = from_exception(exc)  # logs internal failures
        results[index] = {"index": index, "status": "error", "error": error.message}
    finally:
        await close_stream(stream)
