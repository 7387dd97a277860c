"""Video test helpers: a live server for a Helios checkpoint, waits, step-log queries (fixtures: video_fixtures.py).

``video_server`` is ``serving_helpers.running_server`` with one addition: ``sndbuf`` sets the kernel send buffer of
the listening socket (accepted connections inherit it), so that a client which stops reading blocks the server's
sends after a few chunks instead of after the megabytes loopback autotuning would buffer.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn
from serving_helpers import LiveServer

from omni_stream.engine import AsyncEngine
from omni_stream.realtime.app import create_app
from omni_stream.realtime.graceful import GracefulServer
from omni_stream.realtime.settings import Settings


@contextlib.contextmanager
def video_server(checkpoint: Path, settings: Settings | None = None, sndbuf: int | None = None) -> Iterator[LiveServer]:
    async def load() -> Any:
        return await AsyncEngine.from_pretrained(checkpoint, progress=False)

    app = create_app(load, settings or Settings())
    # IPPROTO_TCP named: asyncio turns Nagle's algorithm off only on sockets that say TCP (with it on, a kept-alive
    # client waits 40 ms for each response's second segment, the delayed ACK)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if sndbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    server = GracefulServer(config, app.state.omni)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="test-uvicorn-video")
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield LiveServer(app, server, thread, sock.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def wait_until(condition: Any, timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll ``condition()`` until it is truthy (tests only: the server runs in another thread)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def wait_quiet(probe: Any, quiet: float = 1.0, timeout: float = 30.0) -> Any:
    """Poll ``probe()`` until its value has not changed for ``quiet`` seconds; returns that value."""
    deadline = time.monotonic() + timeout
    value, since = probe(), time.monotonic()
    while time.monotonic() - since < quiet:
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the value to settle")
        time.sleep(0.01)
        now = probe()
        if now != value:
            value, since = now, time.monotonic()
    return value


def chunks_begun(log: Any, request_id: str) -> int:
    """Chunk jobs of ``request_id`` that began, from the family's step log."""
    return sum(1 for e in log.of(request_id) if e.kind == "chunk")


def steps_after_release(log: Any, request_id: str) -> list[Any]:
    """Model steps of ``request_id`` logged after it was released (none is the invariant; a request that never
    reached the device has no events at all)."""
    events = log.of(request_id)
    if not events:
        return []
    released = [i for i, e in enumerate(events) if e.kind == "release"]
    assert released, f"request {request_id} was never released"
    return [e for e in events[released[0] + 1 :] if e.kind != "release"]


async def settled(family: Any) -> None:
    """Until the video family holds no per-request state (releases take effect at the worker's next step; 20 s)."""
    import asyncio

    deadline = time.monotonic() + 20.0
    while any(family.live().values()):
        if time.monotonic() > deadline:
            raise AssertionError(f"the video family still holds {family.live()}")
        await asyncio.sleep(0.005)
