"""Work on a side stream, read back by the device worker itself: events watched as a step source.

Codec windows run on their own CUDA stream so that the talker's steps need not wait for them. Who then
reads their audio back? Not another Python thread: on the H200 a second thread that needs the GIL while
the worker runs back-to-back decode steps got it about once per step, so each of its hand-offs cost up to a
step (a codec job with ~25 of them took 181 ms for 3.6 ms of GPU work; ``benchmarks/results/tts_bench.md``).
So the worker that issued the work also collects it: :meth:`Completions.deliver_ready` runs right after each
talker step (the family hooks it there) and hands over every job whose event has completed, and as a step
source the worker calls it when nothing else is runnable, blocking on the oldest event then (GIL released).
Events are collected in the order they were handed over, the order of their stream. (The Qwen3-TTS family
uses this unless ``OMNI_STREAM_CODEC_STREAM=off``: measured, it pays since its codec windows got cheaper, run 24.)
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Protocol

from omni_stream.errors import EngineClosed
from omni_stream.worker import DeviceWorker

log = logging.getLogger(__name__)


class Waitable(Protocol):
    """What :meth:`Completions.watch` takes: a ``torch.cuda.Event`` (or anything with the same two methods)."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


Then = Callable[[BaseException | None], None]
"""Runs on the worker after its event: ``None`` when the work completed, else what waiting for it raised."""


class Completions:
    """Events the device worker collects (a :class:`~omni_stream.worker.StepSource`; attached on creation).

    ``busy()`` (called under the worker's lock) says whether other step work is waiting, in which case the
    worker does not block on an unfinished event but collects it after that work.
    """

    def __init__(self, worker: DeviceWorker, busy: Callable[[], bool] | None = None) -> None:
        self.worker = worker
        self._busy = busy
        self._pending: deque[tuple[Waitable, Then]] = deque()
        worker.attach(self)

    def watch(self, event: Waitable, then: Then) -> None:
        """Run ``then`` on the worker once ``event`` has completed (in hand-over order). Any thread."""
        with self.worker.cond:
            self._pending.append((event, then))
            self.worker.cond.notify()

    @property
    def pending(self) -> int:
        with self.worker.cond:
            return len(self._pending)

    def deliver_ready(self) -> int:
        """Run the callbacks of the completed events at the head of the line (never blocks); returns how many."""
        done = 0
        while True:
            with self.worker.cond:
                if not self._pending:
                    return done
                event, then = self._pending[0]
            try:
                ready = event.query()
            except BaseException as exc:  # a device fault: fail this one, go on with the rest
                self._pop_and_run(then, exc)
                done += 1
                continue
            if not ready:
                return done
            self._pop_and_run(then, None)
            done += 1

    def _pop_and_run(self, then: Then, error: BaseException | None) -> None:
        with self.worker.cond:
            self._pending.popleft()
        try:
            then(error)
        except Exception:  # a callback bug must not stop the worker that every later request waits on
            log.exception("a completion callback failed")

    # -- StepSource ----------------------------------------------------------------------------------------------

    def has_work(self) -> bool:
        return bool(self._pending)

    def next_deadline(self) -> float | None:
        return None  # pending events make it runnable at once

    def run_step(self) -> None:
        """Collect what is done; with nothing done and nothing else to step, wait for the oldest event."""
        if self.deliver_ready():
            return
        with self.worker.cond:
            if not self._pending or (self._busy is not None and self._busy()):
                return
            event, then = self._pending[0]
        error: BaseException | None = None
        try:
            event.synchronize()  # the GIL is released while it waits
        except BaseException as exc:
            error = exc
        self._pop_and_run(then, error)

    def shutdown(self) -> None:
        with self.worker.cond:
            pending, self._pending = list(self._pending), deque()
        closed = EngineClosed("device worker closed while device work was in flight")
        for _, then in pending:
            try:
                then(closed)
            except Exception:
                log.exception("a completion callback failed")
