"""The device worker: one thread per device runs every piece of model work, never the event loop.

Work reaches it three ways: one-off jobs (:meth:`DeviceWorker.submit`), batchable jobs that share a key
(:meth:`DeviceWorker.submit_batched`: all jobs of one key pending when the worker looks are run as one
call), and step sources (schedulers) polled under the worker's lock. Results go back to the loop through
``loop.call_soon_threadsafe`` only. When nothing is runnable the thread blocks on a condition.

Several models share the device, so each round the worker orders what runs by class and deadline
(:mod:`omni_stream.device_policy`): a step source is ``REALTIME`` (speech, text, transcription: a listener waits)
or ``THROUGHPUT`` (denoising steps, video chunks), and a realtime source says by when its most urgent stream runs
dry (``urgency``). Jobs are realtime. No piece of work is longer than one step of its model, so a realtime step
waits at most one throughput step; a throughput source waits at most the policy's ``max_wait`` (never starved).
Inside a throughput step, the model's blocks call :meth:`DeviceWorker.yield_point` (the throughput families hook
it before every block of their denoiser and VAE): realtime work that falls due meanwhile runs there, nested in
the step, so on CPU, where one step of a large model is hundreds of milliseconds of host time, a speech frame
waits for one block rather than for the whole step.
With ``record=True`` the worker logs every job, batch and step it runs (:attr:`DeviceWorker.log`, tests).

A job whose future is already done when the worker picks it up (its waiter was cancelled or ran past its
deadline) never runs, alone or in a batch: its request may have handed the state the job names (a codec
slot, a buffer) to another request meanwhile. A job cancelled while it runs finishes; its result is dropped.

Schedulers share the worker's lock (:attr:`DeviceWorker.cond`): they change their queues under it and call
``notify()`` when work appears, so the worker can never miss a wakeup.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import math
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, TypeVarTuple

import anyio

from omni_stream.device_policy import JOBS, DevicePolicy, Ready, Standing, WorkClass, plan_round
from omni_stream.errors import EngineClosed

log = logging.getLogger(__name__)

R = TypeVar("R")  # what a job returns
I = TypeVar("I")  # one item of a batched job
Ts = TypeVarTuple("Ts")  # a job's arguments

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
    """Something the worker steps (a scheduler). ``has_work`` runs under the worker's lock.

    Optional, read with defaults: ``work_class`` (:class:`WorkClass`; default realtime), ``name`` (the log's),
    and ``urgency(now)`` (under the lock: the ``perf_counter`` time its most urgent live stream runs dry, None
    when it holds no live stream; default: now while it has work).
    """

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


class Fence(Protocol):
    """The end of a throughput step's device work (a ``torch.cuda.Event`` recorded after it on its stream)."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class _FenceWatcher:
    """One thread that waits for fences (the GIL released, in ``synchronize``) and wakes the worker after each, so
    a throughput source held by its fence becomes runnable without the worker blocking or polling for it."""

    def __init__(self, name: str, cond: threading.Condition) -> None:
        self._cond = cond
        self._queue: queue.SimpleQueue[Fence | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"{name}-fences", daemon=True)
        self._thread.start()

    def watch(self, fence: Fence) -> None:
        self._queue.put(fence)

    def stop(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        while (fence := self._queue.get()) is not None:
            try:
                fence.synchronize()
            except Exception:  # a device fault: the worker's next query sees it as done and goes on
                log.exception("waiting for a throughput step's device work failed")
            with self._cond:
                self._cond.notify()


@dataclass(slots=True, frozen=True)
class WorkRecord:
    """One entry of the worker's log: ``kind`` is ``job``, ``batch`` or ``step`` (a step source's), or what a
    source notes itself (:meth:`DeviceWorker.note`); ``name`` the job's function, batch key or source name;
    ``at`` its ``perf_counter`` time. A throughput step's ``detail`` says why it ran: ``spare`` (the realtime
    streams could spare it), ``overdue`` (it had waited the policy's ``max_wait``) or ``round`` (plain rounds).
    A scheduler's step also records its batch in ``rows``: (newcomers prefilled, running rows decoded).

    The worker does one thing at a time, so an entry's work lasts until the next entry: ``idle`` marks the worker
    waiting for work, ``yield`` realtime work run at a throughput step's yield point (each piece with its own
    entry), ``hold`` a yield point waiting for a stream's next job, and ``resume`` the throughput step going on
    after them (:mod:`omni_stream.runtime.work_profile` sums the log that way)."""

    seq: int
    kind: str
    name: str
    work_class: WorkClass
    detail: tuple[object, ...] = ()
    at: float = 0.0
    rows: tuple[int, int] | None = None


LOG_SIZE = 50_000
COST_EMA = 0.3  # weight of the newest throughput step in its source's cost estimate
YIELD_CHECK_S = 0.002  # a throughput step's yield points look for due realtime work at most this often
HOLD_S = 0.02  # a held yield point looks again at least this often (a submission wakes it sooner)


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


def _deliver(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any, error: BaseException | None
) -> None:
    with contextlib.suppress(RuntimeError):  # loop closed: nobody is waiting any more
        loop.call_soon_threadsafe(_settle, future, result, error)


class DeviceWorker:
    """One thread for one device. ``start()`` it, ``close()`` (blocking) or ``await aclose()`` to stop."""

    def __init__(
        self,
        name: str = "omni-stream-device",
        init: Callable[[], None] | None = None,
        *,
        threads: int | None = None,
        policy: DevicePolicy | None = None,
        throughput_context: Callable[[], AbstractContextManager[object]] | None = None,
        realtime_context: Callable[[], AbstractContextManager[object]] | None = None,
        source_context: Callable[[StepSource], AbstractContextManager[object]] | None = None,
        throughput_fence: Callable[[], Fence] | None = None,
        record: bool = False,
    ) -> None:
        """``init`` runs first on the worker thread (thread-local device state, e.g. its own CUDA stream).

        ``threads``: torch intra-op threads, set when the thread starts (None: :func:`intra_op_threads` of the
        usable cores; the engine passes ``Tuning.threads``).
        ``policy``: how work of several models is ordered (default :class:`DevicePolicy`).
        ``throughput_context``: entered around every throughput step on the worker thread (a side CUDA stream);
        ``realtime_context``: around realtime work run at a yield point inside one (the default stream again).
        ``source_context``: entered around every realtime step, given its source (a CUDA stream of the source's own).
        ``throughput_fence``: called at the end of every throughput step, inside ``throughput_context``; no
        throughput step starts until the last one's fence is done (on CUDA an event on the side stream: the host
        never runs more than one throughput step ahead of the device, so a step that reads its results back waits
        for its own device work only, not for a queue of earlier steps).
        ``record``: keep :attr:`log` (the last ``LOG_SIZE`` pieces of work run; tests).
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
        self.policy = policy if policy is not None else DevicePolicy()
        self._throughput_context = throughput_context
        self._realtime_context = realtime_context
        self._source_context = source_context
        self._throughput_fence = throughput_fence
        self._fence: Fence | None = None  # the last throughput step's, until done (worker thread, lock held)
        self._watched: Fence | None = None  # the fence handed to the watcher last
        self._watcher: _FenceWatcher | None = None
        self._in_throughput = False  # a throughput step runs (worker thread only)
        self._stepping: StepSource | None = None  # the throughput source whose step runs
        self._next_yield_check = 0.0
        self.record = record
        self.log: deque[WorkRecord] = deque(maxlen=LOG_SIZE)
        self._log_seq = itertools.count()
        self._since: dict[int, float] = {}  # id(throughput source) -> when it last ran or became runnable
        self._ran: dict[int, float] = {}  # id(realtime source) -> likewise (the policy's max_skip)
        # id(throughput source) -> the longest its step keeps the device without a yield point (seconds, an EMA):
        # what a realtime stream must be able to spare for it to run (its whole step where it has none)
        self._cost: dict[int, float] = {}
        self._last_yield = 0.0  # the step's start or its last live yield point (worker thread only)
        self._max_gap = 0.0

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
            self._since.pop(id(source), None)
            self._ran.pop(id(source), None)
            self._cost.pop(id(source), None)

    def note(self, kind: str, name: str, work_class: WorkClass, *detail: object) -> None:
        """Add an entry to :attr:`log` when recording (a source's finer steps: which requests a denoising step ran)."""
        if self.record:
            self.log.append(WorkRecord(next(self._log_seq), kind, name, work_class, detail, time.perf_counter()))

    def note_rows(self, prefill: int, decode: int) -> None:
        """The running step's batch, on its log entry (worker thread, while the step runs): which step of a model
        held the others shows in the log, e.g. one that prefilled 32 newcomers at once."""
        if self.record and self.log and self.log[-1].kind == "step":
            self.log[-1] = dataclasses.replace(self.log[-1], rows=(prefill, decode))

    def realtime_demand(self, now: float | None = None) -> float | None:
        """The earliest deadline of every live realtime stream (``perf_counter`` s; None: none is live)."""
        now = time.perf_counter() if now is None else now
        with self.cond:
            realtime = [s for s in self._sources if _class_of(s) is WorkClass.REALTIME]
            deadlines = [d for d in (_urgency(s, now) for s in realtime) if d is not None]
        return min(deadlines) if deadlines else None

    def notify(self) -> None:
        """Wake the worker: call after making a step source runnable (the lock may be held or not)."""
        with self.cond:
            self.cond.notify()

    def on_worker_thread(self) -> bool:
        return threading.get_ident() == self.thread_id

    def submit(self, fn: Callable[[*Ts], R], *args: *Ts) -> asyncio.Future[R]:
        """Run ``fn(*args)`` on the worker thread; await the returned future for its result or exception."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        with self.cond:
            if self._closed:
                raise EngineClosed(f"device worker {self.name} is closed")
            self._jobs.append(_Job(fn, args, loop, future))
            self.cond.notify()
        return future

    def submit_batched(
        self, key: Hashable, item: I, batch_fn: Callable[[list[I]], Sequence[R]], *, urgent: bool = False
    ) -> asyncio.Future[R]:
        """Queue ``item``; every item of ``key`` pending at pickup goes to one ``batch_fn(items) -> results`` call.

        Jobs of one key must share ``batch_fn``. If it raises, every item of that call gets the exception.
        ``urgent``: counted for :meth:`wait_for_urgent` (a request's first output waits on it).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
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

    def _plan(self, now: float) -> tuple[list[Any], float | None]:
        """What runs this round, in order (lock held): ``JOBS`` and ``(source, why)``; else the seconds to wait."""
        realtime, throughput, demand = [], [], None
        fenced = self._fenced()
        for index, source in enumerate(self._sources):
            work_class = _class_of(source)
            runnable = source.has_work()
            if work_class is WorkClass.THROUGHPUT:
                key = id(source)
                if not runnable:
                    self._since.pop(key, None)
                    continue
                since = self._since.setdefault(key, now)
                if fenced:  # the last throughput step is still on the device; the watcher wakes us after it
                    continue
                cost = self._cost.get(key, self.policy.default_cost)
                throughput.append(Ready(index, since=since, cost=cost))
                continue
            # the virtual-time and hand-off rules' inputs only while one is on: they read every sequence, each round
            standing = _standing(source, now) if self.policy.reads_standing else None
            deadline = _urgency(source, now) if standing is None else now if standing.due else standing.playback
            if deadline is not None:
                demand = deadline if demand is None else min(demand, deadline)
            if not runnable:
                self._ran.pop(id(source), None)
                continue
            since = self._ran.setdefault(id(source), now)
            if standing is None:
                realtime.append(Ready(index, deadline=deadline, since=since))
            else:
                virtual, playback, handed = standing.virtual, standing.playback, standing.handed
                realtime.append(Ready(index, deadline, since, virtual=virtual, playback=playback, handed=handed))
        plan = plan_round(
            now,
            jobs=bool(self._jobs or self._groups),
            realtime=realtime,
            throughput=throughput,
            demand=demand,
            policy=self.policy,
        )
        waited = {r.key: now - r.since for r in throughput}
        order: list[Any] = []
        for pick in plan.order:
            if not isinstance(pick, int):
                order.append(JOBS)
            elif pick not in waited:
                order.append((self._sources[pick], ""))
            elif not self.policy.deadlines:
                order.append((self._sources[pick], "round"))
            else:
                why = "overdue" if waited[pick] >= self.policy.max_wait else "spare"
                order.append((self._sources[pick], why))
        wait = plan.wait
        source_wait = self._until_deadline()
        if source_wait is not None:
            wait = source_wait if wait is None else min(wait, source_wait)
        return order, wait

    def _fenced(self) -> bool:
        """Whether the last throughput step's device work is still running (lock held); hands its fence to the
        watcher the first time it is found running."""
        fence = self._fence
        if fence is None:
            return False
        try:
            done = fence.query()
        except Exception:  # a device fault surfaces in the requests' own work; do not hold throughput on it
            log.exception("querying a throughput step's device work failed")
            done = True
        if done:
            self._fence = None
            return False
        if self._watched is not fence:
            if self._watcher is None:
                self._watcher = _FenceWatcher(self.name, self.cond)
            self._watcher.watch(fence)
            self._watched = fence
        return True

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
                while True:
                    if self._closed:
                        break
                    order, wait = self._plan(time.perf_counter())
                    if order:
                        break
                    self.note("idle", "", WorkClass.REALTIME)  # the log's pieces last until the next entry
                    self.cond.wait(wait)
                if self._closed:
                    break
                jobs: list[_Job] = []
                groups: list[tuple[Hashable, _Group]] = []
                if JOBS in order:
                    jobs = list(self._jobs)
                    self._jobs.clear()
                    groups = list(self._groups.items())
                    self._groups.clear()
                    self._urgent = 0
            for piece in order:
                if piece is JOBS:
                    for job in jobs:
                        self._run_job(job)
                    for key, group in groups:
                        self._run_group(key, group)
                else:
                    self._step(*piece)
        self._shutdown()

    def _step(self, source: StepSource, why: str) -> None:
        work_class = _class_of(source)
        self.note("step", _name_of(source), work_class, *((why,) if why else ()))
        t0 = time.perf_counter()
        throughput = work_class is WorkClass.THROUGHPUT
        if throughput:
            self._in_throughput, self._stepping = True, source
            self._last_yield, self._max_gap, self._next_yield_check = t0, 0.0, 0.0
        try:
            if throughput and self._throughput_context is not None:
                with self._throughput_context():
                    try:
                        source.run_step()
                    finally:
                        self._end_throughput_step()
            elif not throughput and self._source_context is not None:
                with self._source_context(source):
                    source.run_step()
            else:
                try:
                    source.run_step()
                finally:
                    if throughput:
                        self._end_throughput_step()
        except Exception:  # a scheduler bug; keep the device alive for the other requests
            log.exception("step source %r failed", source)
        finally:
            if throughput:
                self._in_throughput = False
        if not throughput and self.policy.lead <= 0:
            return  # when a realtime source last ran matters only to the virtual-time rule
        now = time.perf_counter()
        key = id(source)
        with self.cond:
            if not throughput:
                self._ran[key] = now
                return
            previous = self._cost.get(key)
            held = max(self._max_gap, now - self._last_yield)
            self._cost[key] = held if previous is None else previous + COST_EMA * (held - previous)
            self._since[key] = now

    def _end_throughput_step(self) -> None:
        """Mark the end of a throughput step's device work (its stream current), when the worker has a fence."""
        if self._throughput_fence is not None:
            fence = self._throughput_fence()
            with self.cond:
                self._fence = fence

    def yield_point(self) -> None:
        """Called by a throughput model between its blocks (worker thread): run the realtime work that is due now.

        Outside a throughput step, under plain rounds, more often than every ``YIELD_CHECK_S``, and nested, it
        returns at once. Due: any pending job, and each runnable realtime source under the policy's
        ``yield_slack`` (the ones the worker's rounds put before throughput work). With none runnable while a live
        stream is within ``margin`` of running dry (a request whose first audio is being made: its next job is on
        the event loop), the step waits here for it, woken by its submission, as the worker would between steps.
        The fairness bound holds inside a step too: once realtime work has held it ``max_wait`` at one yield point,
        the step runs at least ``min_progress`` before its next one (under a full realtime load it still gets
        ``min_progress`` in every ``max_wait + min_progress``).
        """
        if not (self._in_throughput and self.policy.deadlines) or threading.get_ident() != self.thread_id:
            return  # plain rounds (comparisons) run a step to its end
        t0 = time.perf_counter()
        self._max_gap = max(self._max_gap, t0 - self._last_yield)
        self._last_yield = t0
        if t0 < self._next_yield_check:
            return
        self._next_yield_check = t0 + YIELD_CHECK_S
        self._in_throughput = False  # no yield point inside what runs here
        noted = False  # the log has an entry of this yield point: the step's own work resumes after it
        try:
            while True:
                with self.cond:
                    if self._closed:
                        return
                    now = time.perf_counter()
                    due, demand = self._due_realtime(now)
                    jobs, groups = list(self._jobs), list(self._groups.items())
                    held = now - t0
                    if held >= self.policy.max_wait:  # the fairness bound: the step goes on for a while first
                        self._next_yield_check = now + self.policy.min_progress
                        return
                    if not (due or jobs or groups):
                        if demand is None or demand - now >= self.policy.margin:
                            return
                        self.note("hold", "", WorkClass.REALTIME)
                        noted = True
                        self.cond.wait(min(self.policy.max_wait - held, HOLD_S))
                        continue
                    self._jobs.clear()
                    self._groups.clear()
                    self._urgent = 0
                context = self._realtime_context() if self._realtime_context is not None else contextlib.nullcontext()
                with context:
                    self.note("yield", "", WorkClass.REALTIME)
                    noted = True
                    for job in jobs:
                        self._run_job(job)
                    for key, group in groups:
                        self._run_group(key, group)
                    for source in due:
                        self._step(source, "")
        finally:
            if noted and self._stepping is not None:
                self.note("resume", _name_of(self._stepping), WorkClass.THROUGHPUT)
            self._last_yield = time.perf_counter()
            self._in_throughput = True

    def _due_realtime(self, now: float) -> tuple[list[StepSource], float | None]:
        """Runnable realtime sources under ``yield_slack``, earliest deadline first, and the live streams' earliest
        deadline (lock held; inside a throughput step)."""
        due: list[tuple[float, StepSource]] = []
        demand: float | None = None
        for source in self._sources:
            # Never a throughput model's step, not even one that only releases (it may end greenlets, and this may
            # run inside one of a step's): realtime models only.
            if getattr(source, "declared_class", WorkClass.REALTIME) is not WorkClass.REALTIME:
                continue
            if source is self._stepping or _class_of(source) is not WorkClass.REALTIME:
                continue
            deadline = _urgency(source, now)
            if deadline is not None:
                demand = deadline if demand is None else min(demand, deadline)
            slack = -math.inf if deadline is None else deadline - now
            if slack < self.policy.yield_slack and source.has_work():
                due.append((slack, source))
        return [s for _, s in sorted(due, key=lambda d: d[0])], demand

    def _run_job(self, job: _Job) -> None:
        if job.future.done():  # cancelled or expired before pickup: its request has moved on
            return
        self.note("job", getattr(job.fn, "__qualname__", repr(job.fn)), WorkClass.REALTIME)
        try:
            result = job.fn(*job.args)
        except BaseException as exc:
            _deliver(job.loop, job.future, None, exc)
        else:
            _deliver(job.loop, job.future, result, None)

    def _run_group(self, key: Hashable, group: _Group) -> None:
        live = [i for i, (_, future) in enumerate(group.waiters) if not future.done()]
        if not live:
            return
        self.note("batch", repr(key), WorkClass.REALTIME, len(live))
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
            watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.stop()
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


def _class_of(source: StepSource) -> WorkClass:
    return getattr(source, "work_class", WorkClass.REALTIME)


def _name_of(source: StepSource) -> str:
    return str(getattr(source, "name", type(source).__name__))


def _standing(source: StepSource, now: float) -> Standing | None:
    """A realtime source's :class:`~omni_stream.device_policy.Standing` where it tells it (schedulers), else None."""
    standing = getattr(source, "standing", None)
    return None if standing is None else standing(now)


def _urgency(source: StepSource, now: float) -> float | None:
    urgency = getattr(source, "urgency", None)
    if urgency is not None:
        deadline: float | None = urgency(now)
        return deadline
    return now if source.has_work() else None
