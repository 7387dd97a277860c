"""What every WebSocket endpoint does around its session: the handshake, the server's registry of open sessions
(graceful shutdown waits for each one's ``finished``), the per-endpoint stream gauge, and closing quietly."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

import anyio
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from omni_stream.realtime.common.auth import offered_subprotocols, select_subprotocol
from omni_stream.realtime.state import ServerState


class Session(Protocol):
    finished: anyio.Event  # set once the session has ended


async def shutdown(state: ServerState) -> None:
    """Return once the server begins to shut down (never, for a state without a lifespan)."""
    await (state.stopping.wait() if state.stopping is not None else anyio.sleep_forever())


def is_gone(exc: BaseException) -> bool:
    """Whether ``exc`` (or every exception of a group) only says that the client has left."""
    if isinstance(exc, BaseExceptionGroup):
        return all(is_gone(e) for e in exc.exceptions)
    return isinstance(exc, WebSocketDisconnect | anyio.ClosedResourceError | anyio.BrokenResourceError | OSError)


async def accept(websocket: WebSocket) -> None:
    """Accept the handshake, echoing the key-free subprotocol a browser offered (never the API key's)."""
    await websocket.accept(subprotocol=select_subprotocol(offered_subprotocols(websocket.headers)))


@asynccontextmanager
async def registered(state: ServerState, session: Session, label: str) -> AsyncIterator[None]:
    """``session`` counts in the ``label`` stream gauge and the server's open sessions until the block ends."""
    gauge = state.metrics.streams.labels(label)
    gauge.inc()
    state.sessions.add(session)
    try:
        yield
    finally:
        state.sessions.discard(session)
        session.finished.set()
        gauge.dec()


async def close_quietly(websocket: WebSocket, code: int) -> None:
    """Close with ``code`` unless the client has already gone (then nothing is raised)."""
    try:
        if websocket.application_state is not WebSocketState.DISCONNECTED:
            await websocket.close(code)
    except Exception as exc:
        if not is_gone(exc) and not isinstance(exc, RuntimeError):  # RuntimeError: closed meanwhile
            raise
