"""The one WebSocket shell every socket of the server runs in: the speech stream, the realtime agent and the video
socket are each a sans-I/O protocol core driven by a session, and this module does the rest the same way for all.

:func:`serve_websocket` accepts the handshake (echoing the key-free subprotocol a browser offered, never the API
key's: the key itself, from the ``Authorization`` header or the ``openai-insecure-api-key.KEY`` subprotocol, is
checked by :class:`~omni_stream.realtime.common.auth.ApiKeyMiddleware` before the socket is accepted), opens the
session, counts it in the server's registry of open sessions (the stream gauge; graceful shutdown waits for each
one's ``finished``), runs it until it ends, the client leaves, it fails or the server stops, and closes the socket
once with the code that says which (:class:`~omni_stream.realtime.common.close_codes.CloseCode`):

- the session ended (:meth:`SocketSession.serve` returned a code): that code (None: the client is gone);
- the server began to shut down: the session's work is cancelled, it says goodbye
  (:meth:`SocketSession.shutting_down`) and the socket closes with 1001;
- it failed: the failure is logged, the session says what it can (:meth:`SocketSession.failed`), 1011.

Goodbyes are bounded by :data:`CLOSE_GRACE` seconds: a client that stopped reading takes no more bytes, and the
session must still end. :class:`Socket` is the session's side of the connection: sends in order under one lock,
``receive`` with a timeout, ``close`` once, all quiet about a client that has gone.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

import anyio
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from omni_stream.realtime.common.auth import offered_subprotocols, select_subprotocol
from omni_stream.realtime.common.close_codes import CloseCode
from omni_stream.realtime.state import ServerState

log = logging.getLogger("omni_stream.realtime.ws")

CLOSE_GRACE = 2.0  # seconds a session's goodbye may take before the socket is closed anyway


def is_gone(exc: BaseException) -> bool:
    """Whether ``exc`` (or every exception of a group) only says that the client has left."""
    if isinstance(exc, BaseExceptionGroup):
        return all(is_gone(e) for e in exc.exceptions)
    return isinstance(exc, WebSocketDisconnect | anyio.ClosedResourceError | anyio.BrokenResourceError | OSError)


def leaf(exc: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups: what a failure message names."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


async def shutdown(state: ServerState) -> None:
    """Return once the server begins to shut down (never, for a state without a lifespan)."""
    await (state.stopping.wait() if state.stopping is not None else anyio.sleep_forever())


class Socket:
    """One accepted WebSocket as a session sees it (see the module docstring)."""

    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        self.closed = False
        self._send_lock = anyio.Lock()

    @property
    def query_params(self) -> Mapping[str, str]:
        return self.websocket.query_params

    async def send_text(self, text: str) -> None:
        """Send one text message after those already sent (raises when the client has gone: see :func:`is_gone`)."""
        await self.send((text,))

    async def send_bytes(self, data: bytes) -> None:
        """Send one binary message after those already sent."""
        await self.send((data,))

    async def send(self, messages: Sequence[str | bytes]) -> None:
        """Send ``messages`` back to back (text or binary each), nothing of another sender between them."""
        async with self._send_lock:
            for message in messages:
                if isinstance(message, str):
                    await self.websocket.send_text(message)
                else:
                    await self.websocket.send_bytes(message)

    async def receive(self, within: float | None = None) -> dict[str, Any] | None:
        """The next ASGI message (``websocket.receive`` or ``websocket.disconnect``); None after ``within`` seconds
        without one (None: wait as long as it takes)."""
        with anyio.move_on_after(math.inf if within is None else max(0.0, within)):
            return dict(await self.websocket.receive())
        return None

    async def close(self, code: int) -> None:
        """Close with ``code``, once; nothing is raised when the client has already gone."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.websocket.application_state is not WebSocketState.DISCONNECTED:
                await self.websocket.close(code)
        except Exception as exc:
            if not is_gone(exc) and not isinstance(exc, RuntimeError):  # RuntimeError: closed meanwhile
                raise


class SocketSession(Protocol):
    """What a socket runs: its protocol core and the engine work the core's actions start."""

    finished: anyio.Event  # set by the shell once the session has ended (graceful shutdown waits on it)

    async def serve(self, socket: Socket) -> int | None:
        """Run until the session ends; the close code to end with (None: the client has gone, nothing to close)."""
        ...

    async def shutting_down(self, socket: Socket) -> None:
        """The server is stopping (:meth:`serve` was cancelled and its work released): say goodbye, if anything."""
        ...

    async def failed(self, socket: Socket, exc: BaseException) -> None:
        """:meth:`serve` failed with ``exc`` (logged already): tell the client, if anything."""
        ...


@asynccontextmanager
async def registered(state: ServerState, session: SocketSession, label: str) -> AsyncIterator[None]:
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


SessionOpener = Callable[[Socket, ServerState], Awaitable[SocketSession | None]]
"""Opens a session on an accepted socket; None when it refused the connection (having sent why and closed it)."""


async def serve_websocket(websocket: WebSocket, label: str, open_session: SessionOpener) -> None:
    """Serve one WebSocket connection with the session ``open_session`` opens (see the module docstring);
    ``label``: the transport the stream gauge counts it under."""
    state: ServerState = websocket.app.state.omni
    await websocket.accept(subprotocol=select_subprotocol(offered_subprotocols(websocket.headers)))
    socket = Socket(websocket)
    session = await open_session(socket, state)
    if session is None:
        return
    async with registered(state, session, label):
        code = await _run(state, socket, session, label)
    if code is not None:
        await socket.close(code)


async def _run(state: ServerState, socket: Socket, session: SocketSession, label: str) -> int | None:
    stopping = False
    code: int | None = None
    try:
        async with anyio.create_task_group() as tg:

            async def serve() -> None:
                nonlocal code
                code = await session.serve(socket)
                tg.cancel_scope.cancel()

            async def watch() -> None:
                nonlocal stopping
                await shutdown(state)
                stopping = True
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            tg.start_soon(serve)
    except Exception as exc:
        if is_gone(exc):
            return None
        log.exception("%s session failed", label)
        with anyio.move_on_after(CLOSE_GRACE):
            await _quietly(session.failed(socket, leaf(exc)))
        return CloseCode.INTERNAL
    if stopping:
        with anyio.move_on_after(CLOSE_GRACE):
            await _quietly(session.shutting_down(socket))
        return CloseCode.GOING_AWAY
    return code


async def _quietly(goodbye: Awaitable[None]) -> None:
    """A goodbye to a client that may have gone: only that it has gone is not an error."""
    try:
        await goodbye
    except Exception as exc:
        if not is_gone(exc) and not isinstance(exc, RuntimeError):
            raise
