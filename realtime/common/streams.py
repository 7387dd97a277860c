"""Lifetimes of engine streams inside responses: release on every exit, cancellation included."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from omni_stream.engine import EngineStream

T = TypeVar("T")


async def close_stream(stream: EngineStream[object] | None) -> None:
    """Release an engine stream's batch slots now, even from a cancelled ``finally``.

    A client disconnect cancels the response task, and every ``await`` in a ``finally`` is then cancelled
    again before it runs, so the synchronous release comes first and the awaited close is shielded.
    """
    if stream is None:
        return
    stream.abort()
    with anyio.CancelScope(shield=True):
        await stream.aclose()


async def wait_disconnect(receive: Receive) -> None:
    """Return when the HTTP client has gone (call only after the request body was read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class ClosingStreamingResponse(StreamingResponse):
    """A streaming response that closes its body generator on every exit, so the generator's ``finally`` runs.

    Starlette cancels the send loop on disconnect and leaves a generator suspended at ``yield`` to the
    garbage collector; here it is closed at once, shielded from the cancellation. A generator that never
    started has no ``finally`` to run, so ``on_close`` (when given) runs after it in every case.
    """

    def __init__(
        self,
        content: AsyncGenerator[bytes, None],
        *,
        on_close: Callable[[], Awaitable[None]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(content, **kwargs)
        self._generator = content
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._generator.aclose()
                if self._on_close is not None:
                    await self._on_close()


async def until_disconnect(receive: Receive, func: Callable[[], Awaitable[T]]) -> tuple[bool, T | None]:
    """Run ``func()`` unless the client leaves first: ``(True, result)``, or ``(False, None)`` on disconnect.

    Exceptions from ``func`` propagate as themselves (not wrapped in an exception group).
    """
    outcome: dict[str, Any] = {}
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            await wait_disconnect(receive)
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        try:
            outcome["value"] = await func()
        except Exception as exc:
            outcome["error"] = exc
        tg.cancel_scope.cancel()
    if "error" in outcome:
        raise outcome["error"]
    if "value" in outcome:
        return True, outcome["value"]
    return False, None
