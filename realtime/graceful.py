"""A uvicorn server whose shutdown first lets WebSocket sessions say goodbye (close 1001) before connections drop."""

from __future__ import annotations

import socket
import sys
from types import FrameType

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

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """SIGINT/SIGTERM: uvicorn's, and while the models still load, a word and a stop between models (uvicorn
        waits for the lifespan's start-up whatever it is asked; a model's weights already loading are waited for)."""
        loading = not self.started and not self.should_exit and self._state.stopping is not None
        super().handle_exit(sig, frame)
        if loading:
            print("omni-stream: stopping once the model loading now is in memory", file=sys.stderr, flush=True)
            assert self._state.stopping is not None
            self._state.stopping.set()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self._state.begin_shutdown(SESSION_GRACE)
        await super().shutdown(sockets)
