"""GET /health, /metrics and /v1/models: answered from memory only, so they stay fast while the model is busy."""

from __future__ import annotations

import time

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from omni_stream.family import SpeechInfo, TextInfo
from omni_stream.realtime.common.errors import ApiError
from omni_stream.realtime.replica import ReplicaLabelled
from omni_stream.realtime.state import ServerState
from omni_stream.transcription.spec import TranscriptionInfo
from omni_stream.validation.voices import voice_names

_STARTED = int(time.time())


async def health(request: Request) -> Response:
    state: ServerState = request.app.state.omni
    if state.engine is None or not state.ready:
        return JSONResponse({"status": "loading"}, status_code=503)
    if getattr(state.engine, "closed", False):
        return JSONResponse({"status": "closed"}, status_code=503)
    return JSONResponse({"status": "ok", "model": state.model_id})


async def metrics(request: Request) -> Response:
    state: ServerState = request.app.state.omni
    registries = (
        [state.metrics.registry] if state.engine is None else [state.engine.metrics.registry, state.metrics.registry]
    )
    replica = state.settings.replica_id
    body = b"".join(generate_latest(r if replica is None else ReplicaLabelled(r, replica)) for r in registries)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


async def list_models(request: Request) -> Response:
    state: ServerState = request.app.state.omni
    state.metrics.requests.labels("/v1/models", "200").inc()
    return JSONResponse({"object": "list", "data": _models(state)})


async def get_model(request: Request) -> Response:
    """``GET /v1/models/{id}``: one entry of the list; 404 naming ``model`` for an id not served."""
    state: ServerState = request.app.state.omni
    wanted = request.path_params["model"]
    for entry in _models(state):
        if entry["id"] == wanted:
            return JSONResponse(entry)
    served = ", ".join(str(e["id"]) for e in _models(state)) or "none"
    return ApiError(404, f"The model '{wanted}' does not exist (served: {served})", "model").response()


def _models(state: ServerState) -> list[dict[str, object]]:
    data = []
    if state.engine is not None:
        ids = state.model_ids()
        for family in state.engine.models:
            info = family.info
            entry: dict[str, object] = {
                "id": ids[info.kind],
                "object": "model",
                "created": _STARTED,
                "owned_by": "omni-stream",
                "model_type": info.model_type,
                "kind": info.kind,
            }
            if isinstance(info, SpeechInfo):
                entry.update(task_types=[t.value for t in info.task_types], sample_rate=info.sample_rate)
                entry["voices"] = voice_names(info, state.voices)  # built-in and uploaded, as GET /v1/audio/voices
            if isinstance(info, TranscriptionInfo):
                entry.update(sample_rate=info.sample_rate, languages=list(info.languages))
            if isinstance(info, TextInfo):
                entry["max_context"] = info.max_context
                entry["max_model_len"] = info.max_context  # vLLM's name, which OpenAI-compatible clients read
            data.append(entry)
    return data
