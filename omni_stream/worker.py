"""The device worker: one thread per device runs every piece of model work, never the event loop.

Work reaches it three ways: one-off jobs (:meth:`DeviceWorker.submit`), batchable jobs that share a key
(:meth:`DeviceWorker.submit_batched`: all jobs of one key pending when the worker looks are run as one
call), and step sources (schedulers) polled under the worker's lock. Results go back to the loop through
``loop.call_soon_threadsafe`` only. When nothing is runnable the thread blocks on a condition.

A job whose future is already done when the worker picks it up (its waiter was cancelled or ran past its
deadline) never runs, alone or in a batch: its request may have handed the state the job names (a codec
slot, a buffer) to another request meanwhile. A job cancelled while it runs finishes; its result is dropped.

Schedulers share the worker's lock (:attr:`DeviceWorker.cond`): they change their queues under it and call
``notify()`` when work appears, so the worker can never miss a wakeup.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from omni_stream.errors import EngineClosed

log = logging.getLogger(__name__)

CLOSE_TIMEOUT = 60.0  # seconds aclose() waits for the step in progress (model steps take milliseconds)


def intra_op_threads(cpus: int) -> int:
    """Torch intra-op threads for a machine of ``cpus`` usable cores: all but one, which the event loop keeps.

    Torch's own default (every core) makes many concurrent streams slower than one thread on small machines:
    the loop, the encoders and the worker's kernels then fight for the same cores.
    """
    return max(1, cpus - 1)


def usable_cpus() -> int:
    """Cores this process may run on (its CPU affinity where the platform tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


class StepSource(Protocol):
    """Something the worker steps (a scheduler). ``has_work`` runs under the worker's lock."""

    def has_work(self) -> bool: ...

    def next_deadline(self) -> float | None:
        """A ``time.perf_counter`` time at which ``has_work`` turns true with nothing notifying (None: never)."""
        ...

    def run_step(self) -> None:
        """One step on the worker thread, lock not held; must not raise (failures go to its requests)."""
        ...

    def shutdown(self) -> None:
        """Release everything on the worker thread when the worker stops."""
        ...


@dataclass(slots=True)
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


@dataclass(slots=True)
class _Group:
    batch_fn: Callable[[list[Any]], Sequence[Any]]
    items: list[Any] = field(default_factory=list)
    waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]]] = field(default_factory=list)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the awaiting task gave up (cancelled, deadline)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _deliver(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any, error: BaseException | None):
    with contextlib.suppress(RuntimeError):  # loop closed: nobody is waiting any more
        loop.call_soon_threadsafe(_settle, future, result, error)


class DeviceWorker:
    """One thread for one device. ``start()`` it, ``close()`` (blocking) or ``await aclose()`` to stop."""

    def __init__(
        self, name: str = "omni-stream-device", init: Callable[[], None] | None = None, *, threads: int | None = None
    ) -> None:
        """``init`` runs first on the worker thread (thread-local device state, e.g. its own CUDA stream).

        ``threads``: torch intra-op threads, set when the thread starts (None: :func:`intra_op_threads` of the
        usable cores; the engine passes ``Tuning.threads``).
        """
        self.name = name
        self._init = init
        self.threads = intra_op_threads(usable_cpus()) if threads is None else threads
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        self.cond = threading.Condition()
        self.thread_id: int | None = None
        self._jobs: deque[_Job] = deque()
        self._groups: dict[Hashable, _Group] = {}
        self._urgent = 0  # items submitted with urgent=True since the worker last took the queued jobs
        self._sources: list[StepSource] = []
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    def start(self) -> DeviceWorker:
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
            self._thread.start()
        return self

    def attach(self, source: StepSource) -> None:
        """Step ``source`` whenever its ``has_work()`` is true."""
        with self.cond:
            self._sources.append(source)
            self.cond.notify()

    def detach(self, source: StepSource) -> None:
        with self.cond:
            if source in self._sources:
                self._sources.remove(source)

    def notify(self) -> None:
        """Wake the worker: call after making a step source runnable (the lock may be held or not)."""
        with self.cond:
            self.cond.notify()

    def on_worker_thread(self) -> bool:
        return threading.get_ident() == self.thread_id

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` on the worker thread; await the returned future for its result or exception."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self.cond:
            if self._closed:
                raise EngineClosed(f"device worker {self.name} is closed")
            self._jobs.append(_Job(fn, args, loop, future))
            self.cond.notify()
        return future

    def submit_batched(
        self, key: Hashable, item: Any, batch_fn: Callable[[list[Any]], Sequence[Any]], *, urgent: bool = False
    ) -> asyncio.Future[Any]:
        """Queue ``item``; every item of ``key`` pending at pickup goes to one ``batch_fn(items) -> results`` call.

        Jobs of one key must share ``batch_fn``. If it raises, every item of that call gets the exception.
        ``urgent``: counted for :meth:`wait_for_urgent` (a request's first output waits on it).
        """
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self.cond:
            if self._closed:
                raise EngineClosed(f"device worker {self.name} is closed")
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = _Group(batch_fn)
            group.items.append(item)
            group.waiters.append((loop, future))
            self._urgent += urgent
            self.cond.notify()
        return future

    def wait_for_urgent(self, count: int, timeout: float) -> int:
        """On the worker thread, between two steps: wait until ``count`` urgent items are queued, at most
        ``timeout`` seconds (woken by each submission, no polling); returns how many are queued."""
        with self.cond:
            self.cond.wait_for(lambda: self._closed or self._urgent >= count, timeout)
            return self._urgent

    def close(self, timeout: float | None = None) -> bool:
        """Stop the thread after its current piece of work; pending jobs fail with EngineClosed. Blocking.

        Returns False when the thread is still running after ``timeout`` seconds (a step that never returns).
        """
        with self.cond:
            self._closed = True
            self.cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    async def aclose(self, grace: float = CLOSE_TIMEOUT) -> None:
        """Stop the thread without blocking the event loop; stop waiting for it after ``grace`` seconds."""
        if not await anyio.to_thread.run_sync(self.close, grace):
            # A daemon thread: it cannot keep the process alive, and its results go nowhere.
            log.warning("device worker %s still busy %.0f s after close; not waiting for it", self.name, grace)

    # --- worker thread ---

    def _until_deadline(self) -> float | None:
        """Seconds to the nearest step source's deadline (None: none): a timed wait, woken earlier by notify."""
        deadlines = [d for d in (s.next_deadline() for s in self._sources) if d is not None]
        return max(0.0, min(deadlines) - time.perf_counter()) if deadlines else None

    def _idle(self) -> bool:
        return not self._jobs and not self._groups and not any(s.has_work() for s in self._sources)

    def _main(self) -> None:
        self.thread_id = threading.get_ident()
        try:
            import torch

            torch.set_num_threads(self.threads)
        except Exception:  # no torch: model work brings its own threading
            log.debug("device worker %s: torch threads not set", self.name, exc_info=True)
        if self._init is not None:
            try:
                self._init()
            except Exception:
                log.exception("device worker %s: init failed; running without it", self.name)
        while True:
            with self.cond:
                while not self._closed and self._idle():
                    self.cond.wait(self._until_deadline())
                if self._closed:
                    break
                jobs = list(self._jobs)
                self._jobs.clear()
                groups = list(self._groups.values())
                self._groups.clear()
                self._urgent = 0
                sources = [s for s in self._sources if s.has_work()]
            for job in jobs:
                self._run_job(job)
            for group in groups:
                self._run_group(group)
            for source in sources:
                try:
                    source.run_step()
                except Exception:  # a scheduler bug; keep the device alive for the other requests
                    log.exception("step source %r failed", source)
        self._shutdown()

    @staticmethod
    def _run_job(job: _Job) -> None:
        if job.future.done():  # cancelled or expired before pickup: its request has moved on
            return
        try:
            result = job.fn(*job.args)
        except BaseException as exc:
            _deliver(job.loop, job.future, None, exc)
        else:
            _deliver(job.loop, job.future, result, None)

    @staticmethod
    def _run_group(group: _Group) -> None:
        live = [i for i, (_, future) in enumerate(group.waiters) if not future.done()]
        if not live:
            return
        items = [group.items[i] for i in live]
        waiters = [group.waiters[i] for i in live]
        try:
            results = list(group.batch_fn(items))
            if len(results) != len(items):
                raise ValueError(f"batch_fn returned {len(results)} results for {len(items)} items")
        except BaseException as exc:
            for loop, future in waiters:
                _deliver(loop, future, None, exc)
            return
        for (loop, future), result in zip(waiters, results, strict=True):
            _deliver(loop, future, result, None)

    def _shutdown(self) -> None:
        with self.cond:
            jobs = list(self._jobs)
            self._jobs.clear()
            groups = list(self._groups.values())
            self._groups.clear()
            sources = list(self._sources)
        closed = EngineClosed(f"device worker {self.name} is closed")
        for job in jobs:
            _deliver(job.loop, job.future, None, closed)
        for group in groups:
            for loop, future in group.waiters:
                _deliver(loop, future, None, closed)
        for source in sources:
            try:
                source.shutdown()
            except Exception:
                log.exception("step source %r failed to shut down", source)
