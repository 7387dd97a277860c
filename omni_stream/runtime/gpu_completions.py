"""Wait for device work without holding the thread that issued it: one waiter thread per watched stream.

Work issued on a side stream (codec windows) should neither wait behind the device worker's next step nor
make that worker wait for it. The worker issues the work and an event after it and hands the event here; this
thread blocks in ``event.synchronize()`` (the GIL released meanwhile) and then runs the event's callback, which
reads the results back and settles the waiting requests' futures (thread-safe futures: the event loop reads
them through ``asyncio.wrap_future``). Events are waited for in the order they were handed over, which is the
order of their stream; the callback does a little Python only, so this thread hardly competes for the GIL.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

CLOSE_TIMEOUT = 30.0  # seconds close() waits for the events still pending (device work takes milliseconds)


class Waitable(Protocol):
    """What :meth:`Completions.watch` waits on: a ``torch.cuda.Event`` (or anything that blocks until done)."""

    def synchronize(self) -> None: ...


Then = Callable[[BaseException | None], None]
"""Runs after its event: ``None`` when the work completed, else what waiting for it raised."""


class Completions:
    """A daemon thread that waits for events in order and runs each one's callback; ``close()`` to stop it."""

    def __init__(self, name: str = "omni-stream-completions") -> None:
        self.name = name
        self._queue: queue.SimpleQueue[tuple[Waitable, Then] | None] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        return self._closed

    def watch(self, event: Waitable, then: Then) -> None:
        """Run ``then`` on this thread once ``event`` has completed (in hand-over order)."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name} is closed")
            self._queue.put((event, then))

    def close(self, timeout: float = CLOSE_TIMEOUT) -> bool:
        """Run the callbacks still pending, then stop; False when the thread is still busy after ``timeout``."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(None)
        if self._thread is threading.current_thread():
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _main(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            event, then = item
            error: BaseException | None = None
            try:
                event.synchronize()
            except BaseException as exc:  # a device error: the callback fails its requests with it
                error = exc
            try:
                then(error)
            except Exception:  # a callback bug must not stop the thread that every later request waits on
                log.exception("%s: a completion callback failed", self.name)
