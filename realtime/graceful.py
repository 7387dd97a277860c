"""A uvicorn server whose shutdown first lets WebSocket sessions say goodbye (close 1001) before connections drop."""

from __future__ import annotations

import socket

import uvicorn

from omni_stream.realtime.state import ServerState

SESSION_GRACE = 2.0  # seconds sessions get to send their close frame before uvicorn closes what is left (1012)


class GracefulServer(uvicorn.Server):
    """``uvicorn.Server`` for an app from :func:`omni_stream.realtime.app.create_app`.

    uvicorn closes open WebSockets with 1012 and lets HTTP responses run for ``timeout_graceful_shutdown``
    seconds; sessions here are told first and close with 1001 (going away), stopping their generation.
    """

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self._state = state

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self._state.begin_shutdown(SESSION_GRACE)
        await super().shutdown(sockets)
