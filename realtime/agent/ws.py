"""WS /v1/realtime: the OpenAI Realtime GA subset over a WebSocket, a thin shell around the voice agent.

The handshake accepts what the official SDK sends (``Authorization`` header, ``?model=``: the text model's name, or
none; any other name gets an ``error`` event with code ``model_not_found`` and a 1008 close) and what browsers
send (subprotocols ``realtime`` and ``openai-insecure-api-key.KEY``: the key-free one is echoed; the key is
checked by the API-key middleware like on every ``/v1`` route). The connection runs in the one WebSocket shell
(:mod:`omni_stream.realtime.common.ws_shell`: accept, the registry of open sessions, shutdown with 1001, close
codes). Then one task reads client messages into the session while another writes the session's events out; either
side ending ends both, and leaving the session frees everything it held (:mod:`omni_stream.realtime.agent.session`).
``?intent=transcription`` starts a transcription session.
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
from omni_stream.realtime.common.ws_shell import Socket, is_gone, serve_websocket
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


def refusal(code: str, message: str, param: str) -> str:
    """The ``error`` event of a connection refused before its session opens (then the socket closes with 1008)."""
    error = {"type": "invalid_request_error", "code": code, "message": message, "param": param, "event_id": None}
    return json.dumps({"type": "error", "event_id": f"event_{secrets.token_hex(8)}", "error": error})


def model_not_found(model: str, served: tuple[str, ...]) -> str:
    """The ``error`` event for a ``?model=`` this server does not serve (then the socket closes with 1008)."""
    known = f"this server's realtime model: {', '.join(served)}" if served else "this server has no text model"
    return refusal("model_not_found", f"The model `{model}` does not exist ({known})", "model")


def working(session: RealtimeSession) -> bool:
    """Whether ``session`` has a response, a transcription or an engine request in progress (read before leaving
    the session, which cancels them)."""
    live = session.live()
    return bool(live["engine_requests"] or live["responses"] or live["transcriptions"])


async def realtime_endpoint(websocket: WebSocket) -> None:
    await serve_websocket(websocket, "realtime", _open)


async def _open(socket: Socket, state: ServerState) -> RealtimeSocket | None:
    """The session ``?intent=`` and ``?model=`` ask for; a model this server does not serve is refused (1008)."""
    intent = socket.query_params.get("intent") or None
    kind = SessionType.TRANSCRIPTION if intent == "transcription" else SessionType.REALTIME
    model = socket.query_params.get("model") or None  # ?model= with nothing after it: not named
    served = served_models(state, kind)
    refused = None
    if intent not in (None, "transcription"):  # a misspelt intent would open a session of the other kind
        refused = refusal("invalid_intent", f"intent must be 'transcription' (or left out), got {intent!r}", "intent")
    elif model is not None and model not in served:
        refused = model_not_found(model, served)
    if refused is not None:
        try:
            await socket.send_text(refused)
        except Exception as exc:
            if not is_gone(exc):
                raise
        await socket.close(CloseCode.POLICY)
        return None
    session = RealtimeSession(state.ready_engine, state.settings, session_type=kind, model=model, metrics=state.metrics)
    return RealtimeSocket(state, session)


class RealtimeSocket:
    """The voice agent's session on one WebSocket: client messages in, the session's server events out."""

    def __init__(self, state: ServerState, session: RealtimeSession) -> None:
        self.state = state
        self.session = session
        self.finished = anyio.Event()  # set once the session has ended (server shutdown waits on it)

    async def serve(self, socket: Socket) -> int | None:
        """Until either side ends: the session's close code, or None when the client left."""
        session = self.session
        close_code: int | None = None
        abandoned = False  # the client left while the session had model work in progress
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
                            await socket.send_text(text)
                        except Exception as exc:
                            abandoned = is_gone(exc) and working(session)
                            raise
                    tg.cancel_scope.cancel()

                tg.start_soon(send_events)
                while True:
                    message = await socket.receive()
                    assert message is not None  # no timeout: the session keeps its own deadlines
                    if message["type"] == "websocket.disconnect":
                        abandoned = working(session)
                        break
                    text = message.get("text")
                    await session.client_message(text if text is not None else message.get("bytes"))
                tg.cancel_scope.cancel()
        except Exception as exc:
            if not is_gone(exc):
                raise
        finally:
            if abandoned:
                self.state.metrics.disconnects.labels("realtime").inc()
        return close_code

    async def shutting_down(self, socket: Socket) -> None:
        """The running response's end (failed: ``server_shutdown``) and an ``error``; the shell closes with 1001."""
        for event in self.session.goodbye.events:
            await socket.send_text(to_json(event))

    async def failed(self, socket: Socket, exc: BaseException) -> None:
        """Nothing to say: the shell closes with 1011."""
