"""WS /v1/realtime: the OpenAI Realtime GA subset over a WebSocket, a thin shell around the voice agent.

The handshake accepts what the official SDK sends (``Authorization`` header, ``?model=``: the text model's name, or
none; any other name gets an ``error`` event with code ``model_not_found`` and a 1008 close) and what browsers
send (subprotocols ``realtime`` and ``openai-insecure-api-key.KEY``: the key-free one is echoed; the key is
checked by the API-key middleware like on every ``/v1`` route). Then one task reads client messages into the
session while another writes the session's events out; either side ending ends both, and leaving the session
frees everything it held (:mod:`omni_stream.realtime.agent.session`). ``?intent=transcription`` starts a
transcription session.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets

import anyio
from starlette.websockets import WebSocket

from omni_stream.family import ModelKind
from omni_stream.realtime.agent.events import SessionType
from omni_stream.realtime.agent.outputs import ServerEvent
from omni_stream.realtime.agent.session import RealtimeSession, SessionClose
from omni_stream.realtime.common.close_codes import CloseCode
from omni_stream.realtime.common.ws_sessions import accept, close_quietly, is_gone, registered, shutdown
from omni_stream.realtime.state import ServerState

log = logging.getLogger("omni_stream.realtime.ws")

ENCODE_OFF_LOOP_BYTES = 64 * 1024  # audio deltas larger than this are base64-encoded in a worker thread


def to_json(event: ServerEvent) -> str:
    """The event's wire text (an audio delta's bytes as base64 ``delta``)."""
    body = event.wire()
    if event.audio is not None:
        body["delta"] = base64.b64encode(event.audio).decode("ascii")
    return json.dumps(body, ensure_ascii=False)


def served_models(state: ServerState, kind: SessionType) -> tuple[str, ...]:
    """The names ``?model=`` may carry: the text model's (a transcription session: the transcription model's too)."""
    names = state.served_models(ModelKind.TEXT)
    return state.served_models(ModelKind.TRANSCRIPTION) + names if kind is SessionType.TRANSCRIPTION else names


def model_not_found(model: str, served: tuple[str, ...]) -> str:
    """The ``error`` event for a ``?model=`` this server does not serve (then the socket closes with 1008)."""
    known = f"this server's realtime model: {', '.join(served)}" if served else "this server has no text model"
    error = {
        "type": "invalid_request_error",
        "code": "model_not_found",
        "message": f"The model `{model}` does not exist ({known})",
        "param": "model",
        "event_id": None,
    }
    return json.dumps({"type": "error", "event_id": f"event_{secrets.token_hex(8)}", "error": error})


def working(session: RealtimeSession) -> bool:
    """Whether ``session`` has a response, a transcription or an engine request in progress (read before leaving
    the session, which cancels them)."""
    live = session.live()
    return bool(live["engine_requests"] or live["responses"] or live["transcriptions"])


async def realtime_endpoint(websocket: WebSocket) -> None:
    state: ServerState = websocket.app.state.omni
    await accept(websocket)
    intent = websocket.query_params.get("intent")
    kind = SessionType.TRANSCRIPTION if intent == "transcription" else SessionType.REALTIME
    model = websocket.query_params.get("model") or None  # ?model= with nothing after it: not named
    served = served_models(state, kind)
    if model is not None and model not in served:
        try:
            await websocket.send_text(model_not_found(model, served))
        except Exception as exc:
            if not is_gone(exc):
                raise
        await close_quietly(websocket, CloseCode.POLICY)
        return
    session = RealtimeSession(state.ready_engine, state.settings, session_type=kind, model=model)
    close_code: int | None = None
    abandoned = False  # the client left while the session had model work in progress
    async with registered(state, session, "realtime"):
        try:
            async with session, anyio.create_task_group() as tg:

                async def send_events() -> None:
                    nonlocal close_code, abandoned
                    async for item in session.outgoing:
                        if isinstance(item, SessionClose):
                            close_code = item.code
                            break
                        big = item.audio is not None and len(item.audio) > ENCODE_OFF_LOOP_BYTES
                        text = await anyio.to_thread.run_sync(to_json, item) if big else to_json(item)
                        try:
                            await websocket.send_text(text)
                        except Exception as exc:
                            abandoned = is_gone(exc) and working(session)
                            raise
                    tg.cancel_scope.cancel()

                async def until_shutdown() -> None:
                    nonlocal close_code
                    await shutdown(state)
                    close_code = CloseCode.GOING_AWAY
                    tg.cancel_scope.cancel()

                tg.start_soon(send_events)
                tg.start_soon(until_shutdown)
                while True:
                    message = await websocket.receive()
                    if message["type"] == "websocket.disconnect":
                        abandoned = working(session)
                        break
                    text = message.get("text")
                    await session.client_message(text if text is not None else message.get("bytes"))
                tg.cancel_scope.cancel()
        except Exception as exc:
            if not is_gone(exc):
                log.exception("realtime session failed")
                close_code = CloseCode.INTERNAL
    if abandoned:
        state.metrics.disconnects.labels("realtime").inc()
    if close_code is not None:
        await close_quietly(websocket, close_code)
