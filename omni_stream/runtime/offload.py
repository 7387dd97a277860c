"""Short Python-bound request jobs (building and tokenizing a prompt, a realtime session's turn detection over its
latest audio) off the event loop, on few threads per kind of job (:class:`Lane`).

Preparing a prompt is ~0.1 ms of Python that holds the GIL. Through anyio's default pool up to 40 such jobs
run at once, so a burst of 128 requests first started up to 40 threads (each start blocks the event loop's
thread until the new thread runs) and then had them take turns at the GIL with the event loop and the device
worker: on the H200 a burst of 128 waited 200-270 ms for its first prefill and the event loop fell up to
250 ms behind, and a burst of 32 was split over two prefills because only part of it had been prepared
(``benchmarks/burst_probe.py``; ``benchmarks/results/tts_bench.md``, run 22). A job that holds the GIL gains
nothing from a second thread, so these jobs share :data:`PREPARE_THREADS` threads per event loop
(``Tuning.prepare_threads``, which the engine hands to :func:`preparer` when it loads, sets another number;
measured in ``tts_bench.md``, run 22). The talker's
scheduler holds a burst's first newcomers until the rest are prepared
(:func:`omni_stream.speech.admission.hold_newcomers`, run 23), so the burst still prefills in one step.

The jobs queued during one pass of the event loop go to a thread as one job, and come back with one wake-up of
the loop. Handed over one by one (anyio's ``to_thread``), each job cost the loop ~120 us of hand-off (a wake-up, a
limiter's release, the next waiter's start) and left its thread idle between jobs for 0.3-0.5 ms: a burst's
requests reach their preparation in the same pass, so on the H200 a burst of 32 spent ~17 ms from its first
request to its last prompt and a burst of 128 ~80 ms, most of it hand-offs (``benchmarks/burst_probe.py``).
In the turn-detection and judging lanes, while every thread is busy, the jobs of later passes wait together and
go as one job to the first thread that is free.

Jobs of one kind can go further (:func:`run_prepare_batched`): the items of a pass's calls with the same batch
callable reach it as one list, so a realtime server's sessions' VAD feeds of one pass are one network call.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar, TypeVarTuple, cast

T = TypeVar("T")
I = TypeVar("I")
Ts = TypeVarTuple("Ts")

# Two, not one: a prompt that is slow to build (a long text) does not hold up every other request's.
PREPARE_THREADS = 2


@dataclass(slots=True, eq=False)
class _Job:
    call: Callable[[], Any]
    future: asyncio.Future[Any]
    queued: float  # time.perf_counter() at submit
    # A job of a batch: ``batch(items)`` runs once for every job of the pass with the same ``batch`` (``call`` unused).
    batch: Callable[[list[Any]], list[Any]] | None = None
    item: Any = None


@dataclass(slots=True)
class PrepareStats:
    """What a preparer's threads did: jobs run, seconds they waited (submit -> start: the loop's pass, a free
    thread, the jobs before them in their batch), the longest wait, and seconds they ran."""

    jobs: int = 0
    wait_s: float = 0.0
    max_wait_s: float = 0.0
    run_s: float = 0.0


def _batched_only() -> None:  # a batch's job is run by its batch, never called
    raise AssertionError("a batched job was called alone")


def _settle_all(jobs: list[_Job], done: asyncio.Future[list[tuple[bool, Any]]]) -> None:
    try:
        results = done.result()
    except BaseException as exc:  # the pool is shut down (its loop is closing)
        results = [(False, exc)] * len(jobs)
    for job, (ok, value) in zip(jobs, results, strict=True):
        if job.future.done():
            continue
        if ok:
            job.future.set_result(value)
        elif value is not None:
            job.future.set_exception(value)


class Preparer:
    """One event loop's preparation threads and the jobs queued during its current pass."""

    def __init__(self, threads: int, name: str = "prepare", *, gather: bool = False) -> None:
        self.threads = threads
        self.gather = gather  # jobs queued while every thread is busy wait and go together (see _flush)
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=f"omni-stream-{name}")
        self._queued: list[_Job] = []
        self._flush_due = False  # a flush is scheduled on the loop
        self._busy = 0  # thread jobs handed over and not finished
        self.batches = 0  # thread jobs so far (each the jobs queued since the last one started)
        self.stats = PrepareStats()  # since the last take()
        self._stats_lock = threading.Lock()

    def take(self) -> PrepareStats:
        """What the threads did since the last call (benchmarks read it per level), and a fresh count."""
        with self._stats_lock:
            taken, self.stats = self.stats, PrepareStats()
            return taken

    def submit(self, loop: asyncio.AbstractEventLoop, call: Callable[[], T]) -> asyncio.Future[T]:
        future: asyncio.Future[T] = loop.create_future()
        self._queue(loop, _Job(call, future, time.perf_counter()))
        return future

    def submit_batched(
        self, loop: asyncio.AbstractEventLoop, batch: Callable[[list[I]], list[T]], item: I
    ) -> asyncio.Future[T]:
        """``batch([..., item, ...])[k]``: the items of every job of this pass with the same ``batch`` callable go to
        one call of it, which returns one result per item in order (if it raises, every item's job raises)."""
        future: asyncio.Future[T] = loop.create_future()
        self._queue(loop, _Job(_batched_only, future, time.perf_counter(), batch, item))
        return future

    def _queue(self, loop: asyncio.AbstractEventLoop, job: _Job) -> None:
        self._queued.append(job)
        if not self._flush_due and (self._busy < self.threads or not self.gather):
            self._flush_due = True
            loop.call_soon(self._flush, loop)  # after the pass's other ready tasks have queued theirs

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """Hand every queued job to a thread as one thread job. With ``gather`` (the turn-detection and judging
        lanes) and every thread busy, the jobs stay queued and the first thread to finish takes them all: jobs of
        later passes join one call of their batch instead of queuing as a thread job each. The end-of-turn model's
        one thread judged 32 sessions' pauses, which reach it over several passes, in a call per pass: the last
        pause waited ~170 ms behind calls of ~20 ms (voice_bench run 46; run 47: 19-39 ms mean waits at 16 and 32
        sessions). Prompts keep a thread job per pass (measured so by ``burst_probe``, runs 22-23)."""
        self._flush_due = False
        if not self._queued or (self.gather and self._busy >= self.threads):
            return
        jobs, self._queued = self._queued, []
        self.batches += 1
        self._busy += 1
        try:
            done = loop.run_in_executor(self._pool, self._run, jobs)
        except RuntimeError as exc:  # the pool or the loop is shutting down: nobody may wait forever
            done = loop.create_future()
            done.set_exception(exc)
        done.add_done_callback(functools.partial(self._finished, loop, jobs))

    def _finished(self, loop: asyncio.AbstractEventLoop, jobs: list[_Job], done: asyncio.Future[Any]) -> None:
        self._busy -= 1
        _settle_all(jobs, done)
        if self.gather and self._queued and not self._flush_due:
            self._flush(loop)  # what queued while every thread was busy, as one thread job

    def _run(self, jobs: list[_Job]) -> list[tuple[bool, Any]]:
        """A thread's share: every job in order (a batch's jobs together, where its first one stands), each one's
        result or exception (a cancelled one is skipped), each counted in :attr:`stats`."""
        out: list[tuple[bool, Any] | None] = [None] * len(jobs)
        batches: dict[Callable[[list[Any]], list[Any]], list[int]] = {}
        for i, job in enumerate(jobs):
            if job.batch is not None:
                batches.setdefault(job.batch, []).append(i)
        for i, job in enumerate(jobs):
            if out[i] is not None:
                continue
            if job.batch is None:
                out[i] = self._run_one(job)
            else:
                members = batches[job.batch]
                for k, outcome in zip(members, self._run_batch(job.batch, [jobs[k] for k in members]), strict=True):
                    out[k] = outcome
        return [(False, None) if o is None else o for o in out]

    def _run_one(self, job: _Job) -> tuple[bool, Any]:
        if job.future.done():  # its request gave up (a racy read: at worst the job runs and is dropped)
            return False, None
        start = time.perf_counter()
        try:
            outcome: tuple[bool, Any] = (True, job.call())
        except BaseException as exc:
            outcome = (False, exc)
        self._count([job], start, time.perf_counter() - start)
        return outcome

    def _run_batch(self, batch: Callable[[list[Any]], list[Any]], jobs: list[_Job]) -> list[tuple[bool, Any]]:
        live = [job for job in jobs if not job.future.done()]
        results: dict[int, tuple[bool, Any]] = {}
        if live:
            start = time.perf_counter()
            try:
                values = batch([job.item for job in live])
                if len(values) != len(live):
                    raise RuntimeError(f"a batch of {len(live)} items gave {len(values)} results")
                results = {id(job): (True, value) for job, value in zip(live, values, strict=True)}
            except BaseException as exc:
                results = {id(job): (False, exc) for job in live}
            self._count(live, start, time.perf_counter() - start)
        return [results.get(id(job), (False, None)) for job in jobs]

    def _count(self, jobs: list[_Job], start: float, ran: float) -> None:
        """Each job's wait and its share of ``ran`` seconds, in :attr:`stats`."""
        with self._stats_lock:
            s = self.stats
            for job in jobs:
                s.jobs += 1
                s.wait_s += start - job.queued
                s.max_wait_s = max(s.max_wait_s, start - job.queued)
                s.run_s += ran / len(jobs)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False)


class Lane(StrEnum):
    """A loop's preparation threads by the work they take: a request's prompt (``PROMPTS``), a realtime session's
    turn detection over its latest audio (``TURNS``), or the end-of-turn model's batched judgement of the pauses of
    one pass (``JUDGE``, on the GPU). Turn detection has threads of its own: queued behind a burst of prompts (the
    agents' replies, built when their turns end), the sessions' audio feeds waited up to 0.24-0.47 s on the H200 host
    (voice_bench run 32), and every such wait is added to the time a turn takes to end. The judgements have one
    more: queued behind the feeds of 32 sessions they waited 84-213 ms on average for a 5-14 ms call (runs 34-37)."""

    PROMPTS = "prompts"
    TURNS = "turns"
    JUDGE = "judge"


TURN_THREADS = 2  # a pass's feeds are one network call (run_prepare_batched); a second thread takes the next pass
_LANE_THREADS = {Lane.PROMPTS: PREPARE_THREADS, Lane.TURNS: TURN_THREADS, Lane.JUDGE: 1}  # a judgement: one GPU call
_PREPARERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Lane, Preparer]] = weakref.WeakKeyDictionary()


def preparer(threads: int | None = None, lane: Lane = Lane.PROMPTS) -> Preparer:
    """The running event loop's preparer for ``lane``, made on first use with ``threads`` threads (None:
    :data:`PREPARE_THREADS` for prompts, :data:`TURN_THREADS` for turns, one for judgements; its threads end when the
    loop is gone).
    Given another number than the one it has, it is replaced: jobs already handed to the old one finish there."""
    loop = asyncio.get_running_loop()
    lanes = _PREPARERS.setdefault(loop, {})
    found = lanes.get(lane)
    if found is not None and threads is not None and found.threads != threads:
        found.shutdown()
        found = None
    if found is None:
        default = _LANE_THREADS[lane]
        prompts = lane is Lane.PROMPTS
        found = lanes[lane] = Preparer(
            default if threads is None else threads, "prepare" if prompts else lane.value, gather=not prompts
        )
        weakref.finalize(loop, found.shutdown)
    return found


async def run_prepare_batched(batch: Callable[[list[I]], list[T]], item: I, lane: Lane = Lane.PROMPTS) -> T:
    """``batch(items)[k]`` on one of the loop's threads of ``lane``, where ``items`` are those of every call with
    the same ``batch`` in this pass of the loop (a realtime server's sessions' appends of one pass: one network call
    of their VADs), ``item`` the k-th."""
    future = preparer(lane=lane).submit_batched(asyncio.get_running_loop(), batch, item)
    return await future


async def run_prepare(fn: Callable[[*Ts], T], *args: *Ts) -> T:
    """``fn(*args)`` on one of the loop's preparation threads, with the other jobs queued in the same pass."""
    future = preparer().submit(asyncio.get_running_loop(), functools.partial(fn, *args))
    return cast(T, await future)
