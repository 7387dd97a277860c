"""Continuous-batching scheduler, one per model instance, stepped by the device worker.

The life of a step (``run_step``, on the worker thread) fits on one screen: release the sequences that
left, ``schedule()`` a batch (admit newcomers into free slots for prefill, decode every running sequence
that is not paused), ``model.step(batch)``, ``postprocess()`` the outputs into per-sequence buffers, wake
the consumers. Queues and buffers change only under the worker's lock.

Backpressure, websockets style: a sequence whose buffer holds ``high_watermark`` items is PAUSED (skipped
by ``schedule()``, slot kept); when its consumer drains the buffer to ``low_watermark`` it resumes. So a
slow consumer slows only itself, and at most ``high_watermark`` items wait per sequence. The queue gauges
(running / waiting / paused) are set from the states after each step's ``postprocess`` and whenever a
sequence is queued, leaves, or resumes between steps, so a paused request never shows as running.

Work class. A scheduler is ``REALTIME`` (default: speech, text, transcription) or ``THROUGHPUT`` (denoising, video
chunks) on the shared device worker (:mod:`omni_stream.device_policy`). A realtime scheduler reports its urgency,
the time its most urgent live sequence runs dry; a throughput scheduler admits newcomers by capacity (they wait,
counted in the waiting gauge, while one more request's share of a step would not fit in the realtime streams'
slack; :func:`~omni_stream.device_policy.capacity_budget`), a continuing request (``open(..., continuing=True)``)
ahead of new ones. Within a scheduler, bulk requests (``open(..., bulk=True)``: a recording's transcript, which no
conversation waits on turn by turn) queue behind every other request and hold at most ``bulk_slots`` slots.

Lifetime by scope: ``async with scheduler.session(payload) as stream`` owns the sequence. Leaving the
scope any way releases it synchronously (no ``await``, so it survives a cancelled ``finally``): the
sequence is marked ABORTED under the lock and the worker calls ``model.release(seq)`` and frees the slot
before its next step.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from collections.abc import Sequence as PySequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

from omni_stream.batch_model import Batch, BatchModel, PipelinedModel, SeqOutput, Sequence
from omni_stream.context import RequestContext
from omni_stream.device_policy import Standing, WorkClass, capacity_budget
from omni_stream.errors import EngineClosed
from omni_stream.metrics import SchedulerMetrics
from omni_stream.requests import RequestState, Timings
from omni_stream.speech.admission import DEFAULT_HOLD_S, AdmissionRule, hold_newcomers
from omni_stream.worker import DeviceWorker

log = logging.getLogger(__name__)

_DONE = (RequestState.FINISHED, RequestState.ABORTED)
DEFAULT_MAX_DEFER_S = 10.0  # a throughput newcomer waits for capacity at most this long
_COST_EMA = 0.3

P = TypeVar("P")  # the payload the model admits
O = TypeVar("O")  # the item one step makes for one sequence


@dataclass(slots=True)
class SchedulerStats:
    """Counters the worker keeps (read them for benchmarks; seconds are ``perf_counter`` time)."""

    steps: int = 0
    items: int = 0
    model_seconds: float = 0.0  # inside model.step
    overhead_seconds: float = 0.0  # schedule + postprocess + release + wakeups
    max_batch: int = 0


class _Session(Generic[P, O]):
    """Delivery state of one sequence; fields change under the scheduler's lock."""

    __slots__ = ("buffer", "bulk", "continuing", "ctx", "done", "error", "loop", "queued", "seq", "waiter")

    def __init__(self, seq: Sequence[P], ctx: RequestContext, loop: asyncio.AbstractEventLoop | None) -> None:
        self.seq = seq
        self.ctx = ctx
        self.loop = loop
        self.queued = time.perf_counter()
        self.buffer: deque[O] = deque()
        self.done = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None  # created and resolved on the loop only
        self.continuing = False  # a throughput request's next part: admitted ahead of new requests
        self.bulk = False  # a recording's, not a conversation's: queued behind the others, within bulk_slots


def _wake(sessions: list[_Session[P, O]]) -> None:
    for sess in sessions:
        if sess.waiter is not None and not sess.waiter.done():
            sess.waiter.set_result(None)


class Arrival(Generic[P, O]):
    """A request being prepared for a scheduler (:meth:`Scheduler.arriving`): newcomers already waiting may wait
    for it (:func:`~omni_stream.speech.admission.hold_newcomers`). It stops counting once its session opens or its
    preparation ends any other way."""

    __slots__ = ("_live", "_sched")

    def __init__(self, scheduler: Scheduler[P, O]) -> None:
        self._sched: Scheduler[P, O] = scheduler
        self._live = True

    def _end_locked(self) -> None:
        if self._live:
            self._live = False
            self._sched._arriving -= 1
            self._sched.lock.notify()

    def end(self) -> None:
        with self._sched.lock:
            self._end_locked()


class Scheduler(Generic[P, O]):
    """Batches ``model`` across requests; at most ``high_watermark`` undelivered items per sequence (default 32).

    A ``Scheduler[P, O]`` batches a ``BatchModel[P, O]``: its sessions take ``P`` payloads and stream ``O`` items."""

    def __init__(
        self,
        model: BatchModel[P, O],
        worker: DeviceWorker,
        *,
        high_watermark: int = 32,
        low_watermark: int | None = None,
        metrics: SchedulerMetrics | None = None,
        name: str = "model",
        admission: AdmissionRule | None = None,
        hold: float = DEFAULT_HOLD_S,
        settle: bool = False,
        due_wait: float = 0.0,
        work_class: WorkClass = WorkClass.REALTIME,
        max_defer: float = DEFAULT_MAX_DEFER_S,
        bulk_slots: int | None = None,
    ) -> None:
        """``admission``: how many waiting sequences each step admits (:mod:`omni_stream.speech.admission`; None: all
        that fit in the free slots). ``hold``: the longest newcomers wait for requests still being prepared
        (:meth:`arriving`; 0: never). For a :class:`~omni_stream.batch_model.PipelinedModel` only: ``settle``, call
        its ``settle()`` before each batch is picked; ``due_wait``, the longest the worker waits after a step for
        the jobs its outputs make due (seconds; 0: never). ``work_class``: realtime or throughput (the module
        docstring); ``max_defer``: the longest a throughput newcomer waits for capacity (seconds, default 10).
        ``bulk_slots``: the most batch slots bulk sequences (``open(..., bulk=True)``) hold at once (None: any)."""
        if hold < 0 or due_wait < 0:
            raise ValueError(f"hold and due_wait must be >= 0 s, got {hold}, {due_wait}")
        if bulk_slots is not None and bulk_slots < 1:
            raise ValueError(f"bulk_slots must be at least 1, got {bulk_slots}")
        self.bulk_slots = bulk_slots
        low = high_watermark // 4 if low_watermark is None else low_watermark
        if high_watermark < 1 or not 0 <= low < high_watermark:
            raise ValueError(f"need 0 <= low_watermark < high_watermark, got {low}, {high_watermark}")
        self.model = model
        self.worker = worker
        self.lock = worker.cond
        self.high = high_watermark
        self.low = low
        self.metrics = metrics
        self.name = name
        self.admission = admission
        self.hold = hold
        self._settle: Callable[[], None] | None = None
        self._jobs_due: Callable[[], int] | None = None
        self.due_wait = 0.0
        self.pipelining(settle, due_wait)
        self._work_class = work_class
        self.max_defer = max_defer
        self._row_cost: float | None = None  # throughput: seconds of a decode step per sequence (EMA)
        self._step_cost: float | None = None  # seconds of a step without newcomers (EMA): the virtual-time quantum
        self._arriving = 0  # requests being prepared (Arrival), under the lock
        self.stats = SchedulerStats()
        self.waiting: deque[Sequence[P]] = deque()
        self.running: dict[int, Sequence[P]] = {}
        # A heap: the lowest free slot goes out first, so the rows a step computes (0..max slot) follow the
        # live batch; last-freed-first would leave a lone request after a burst in a high slot for good.
        self.free_slots = list(range(model.max_batch_size))
        self._sessions: dict[int, _Session[P, O]] = {}
        self._released: list[Sequence[P]] = []  # left the batch; model.release pending on the worker
        self._ids = itertools.count()
        self._closed = False
        worker.attach(self)

    def pipelining(self, settle: bool, due_wait: float) -> None:
        """Set ``settle`` and ``due_wait`` (see the constructor); for a model that is not a
        :class:`~omni_stream.batch_model.PipelinedModel` both stay off. Takes effect from the next step."""
        if due_wait < 0:
            raise ValueError(f"due_wait must be >= 0 s, got {due_wait}")
        pipelined = self.model if isinstance(self.model, PipelinedModel) else None
        self._settle = pipelined.settle if pipelined is not None and settle else None
        self._jobs_due = pipelined.jobs_due if pipelined is not None and due_wait > 0 else None
        self.due_wait = due_wait

    @property
    def settles(self) -> bool:
        """Whether the model's ``settle()`` runs before each batch is picked (:meth:`pipelining`)."""
        return self._settle is not None

    # --- event loop side ---

    @contextmanager
    def arriving(self) -> Iterator[Arrival[P, O]]:
        """Count a request as being prepared for this scheduler until its session opens (pass the arrival to
        :meth:`session`) or the block ends, whichever comes first."""
        with self.lock:
            self._arriving += 1
        arrival: Arrival[P, O] = Arrival(self)
        try:
            yield arrival
        finally:
            arrival.end()

    @asynccontextmanager
    async def session(
        self,
        payload: P,
        ctx: RequestContext | None = None,
        arrival: Arrival[P, O] | None = None,
        continuing: bool = False,
        bulk: bool = False,
    ) -> AsyncIterator[SeqStream[P, O]]:
        """Queue a sequence for ``payload``; yield the stream of its items; release it on exit, any exit.

        ``arrival``: this request's :meth:`arriving` count, ended as the sequence queues (in one step, so a
        burst's last newcomer is never between the two). ``continuing``, ``bulk``: see :meth:`open`."""
        sess = self.open(payload, ctx, arrival=arrival, continuing=continuing, bulk=bulk)
        unregister = sess.ctx.add_release(lambda: self.release(sess))  # lets the consumer release it at once
        try:
            yield SeqStream(self, sess)
        finally:
            unregister()
            self.release(sess)

    def open(
        self,
        payload: P,
        ctx: RequestContext | None = None,
        *,
        offline: bool = False,
        arrival: Arrival[P, O] | None = None,
        continuing: bool = False,
        bulk: bool = False,
    ) -> _Session[P, O]:
        """Queue a sequence (pair with :meth:`release`; prefer :meth:`session`).

        ``offline``: no event loop waits for it (:func:`run_offline` steps the scheduler and reads the buffers).
        ``continuing``: the next part of a request already served (a video's next chunk): it queues ahead of new
        requests and is never held back for capacity. ``bulk``: work no one is waiting on turn by turn (a recording's
        transcript, not a conversation's): it queues behind every other request, and bulk sequences hold at most
        ``bulk_slots`` slots, so a burst of them never keeps a conversation's turn out of the batch.
        """
        if continuing and bulk:
            raise ValueError("a sequence is continuing or bulk, not both")
        ctx = ctx if ctx is not None else RequestContext()
        with self.lock:
            if self._closed:
                raise EngineClosed(f"scheduler {self.name} is closed")
            seq = Sequence(seq_id=next(self._ids), payload=payload, request_id=ctx.request_id)
            sess: _Session[P, O] = _Session(seq, ctx, None if offline else asyncio.get_running_loop())
            sess.continuing, sess.bulk = continuing, bulk
            self._sessions[seq.seq_id] = sess
            if continuing:  # behind the other continuing ones, ahead of every new request
                ahead = sum(1 for _ in itertools.takewhile(lambda w: self._sessions[w.seq_id].continuing, self.waiting))
                self.waiting.insert(ahead, seq)
            elif bulk:
                self.waiting.append(seq)
            else:  # ahead of the bulk ones, which are the queue's tail
                self.waiting.insert(len(self.waiting) - self._bulk_waiting(), seq)
            if arrival is not None:
                arrival._end_locked()
            self._observe_queues()
            self.lock.notify()
        return sess

    def release(self, sess: _Session[P, O]) -> None:
        """Synchronous: drop the sequence's buffer and hand its slot back before the next step."""
        with self.lock:
            seq = sess.seq
            self._sessions.pop(seq.seq_id, None)
            sess.buffer.clear()
            sess.done = True
            if seq.state in _DONE:
                return  # finished or failed: already queued for release
            seq.abort_requested = True
            if seq.state is RequestState.WAITING:
                self.waiting.remove(seq)  # never admitted: the model never saw it
                seq.state = RequestState.ABORTED
                self._observe_queues()
                return
            seq.state = RequestState.ABORTED
            self._released.append(seq)
            self.lock.notify()

    def live(self) -> dict[str, int]:
        """Per-request state still held (all zero once every session has ended and the worker caught up)."""
        with self.lock:
            return {
                "waiting": len(self.waiting),
                "arriving": self._arriving,
                "running": len(self.running),
                "sessions": len(self._sessions),
                "release_pending": len(self._released),
                "slots_in_use": self.model.max_batch_size - len(self.free_slots),
            }

    # --- worker thread side ---

    @property
    def declared_class(self) -> WorkClass:
        """The class this scheduler was made with (its steps' class whenever they run a model)."""
        return self._work_class

    @property
    def work_class(self) -> WorkClass:
        """The class of this scheduler's next step (lock held): a throughput scheduler whose step would only hand
        released sequences back to the model steps as realtime work (it frees memory and takes no model time)."""
        if self._work_class is WorkClass.THROUGHPUT and self._released and not (self.waiting or self._runnable()):
            return WorkClass.REALTIME
        return self._work_class

    def _runnable(self) -> bool:
        return any(seq.state is RequestState.RUNNING for seq in self.running.values())

    def has_work(self) -> bool:
        if self._closed:
            return False
        if self._released or self._runnable():
            return True
        if not (self.waiting and self.free_slots) or self._holding(time.perf_counter()) or self._bulk_full():
            return False
        return self._work_class is not WorkClass.THROUGHPUT or self._admission_budget() > 0

    def _bulk_waiting(self) -> int:
        """Waiting bulk sequences: the queue's tail (lock held)."""
        return sum(1 for _ in itertools.takewhile(lambda w: self._sessions[w.seq_id].bulk, reversed(self.waiting)))

    def _bulk_room(self) -> bool:
        """Whether bulk sequences hold fewer than ``bulk_slots`` slots (lock held)."""
        if self.bulk_slots is None:
            return True
        held = 0
        for seq in self.running.values():
            sess = self._sessions.get(seq.seq_id)
            held += seq.state not in _DONE and sess is not None and sess.bulk
        return held < self.bulk_slots

    def _bulk_full(self) -> bool:
        """The next waiting sequence is bulk and bulk sequences hold their ``bulk_slots`` (lock held)."""
        if self.bulk_slots is None or not self.waiting or not self._sessions[self.waiting[0].seq_id].bulk:
            return False
        return not self._bulk_room()

    def _holding(self, now: float) -> bool:
        """Newcomers wait for requests still being prepared (lock held; see ``admission.hold_newcomers``)."""
        if not self._arriving or not self.waiting:
            return False
        # Bulk sequences are left out: they never keep a turn's newcomers from waiting for the rest of their burst
        ordinary = len(self.waiting) - self._bulk_waiting()
        if not ordinary:
            return False
        waited = now - self._sessions[self.waiting[0].seq_id].queued
        return hold_newcomers(self._arriving, ordinary, len(self.free_slots), waited, self.hold)

    def next_deadline(self) -> float | None:
        """When held newcomers stop waiting, or a throughput newcomer's capacity wait ends (``perf_counter``
        time; lock held), else None."""
        deadlines = []
        if self._work_class is WorkClass.THROUGHPUT and self.waiting and self.free_slots and not self._bulk_full():
            deadlines.append(self._sessions[self.waiting[0].seq_id].ctx.timings.created + self.max_defer)
        if self._holding(time.perf_counter()):  # the sooner of the two: a throughput model's newcomers are held too
            deadlines.append(self._sessions[self.waiting[0].seq_id].queued + self.hold)
        return min(deadlines, default=None)

    def urgency(self, now: float) -> float | None:
        """When this scheduler's most urgent live sequence runs dry (``perf_counter`` s; lock held; None: none).

        A newcomer (waiting or being prepared) and a running sequence with no audio out yet (its first chunk, or
        text a listener waits for) are due now; a sequence whose audio plays is due when its listener's audio runs
        out (``first_chunk + audio_seconds``); a paused sequence with no audio is waiting for its consumer, not
        for the device. A throughput scheduler has no urgency. (Called every round of the worker: it stops at the
        first sequence due now.)
        """
        if self._work_class is not WorkClass.REALTIME or self._closed:
            return None
        if (self.waiting and not self._bulk_full()) or self._arriving:
            return now
        due: float | None = None
        for seq, timings in self._live():
            if timings.first_chunk is not None:
                deadline = timings.first_chunk + timings.audio_seconds
                due = deadline if due is None else min(due, deadline)
            elif seq.state is RequestState.RUNNING:
                return now
        return due

    def standing(self, now: float) -> Standing | None:
        """Where this scheduler's live sequences stand (lock held; None: a throughput or closed scheduler), for the
        worker's virtual-time rule (asked only while it is on; it reads every sequence).

        ``playback``: when its most urgent playing stream runs dry. ``virtual``: the virtual time of its most
        behind sequence that no listener plays yet, ``created + steps * quantum``, the quantum this model's own
        step time (an average of its steps without newcomers; the worker's policy's quantum until one is measured),
        so a sequence stepped every round stays at or behind the clock; a newcomer's is its creation.
        :mod:`omni_stream.device_policy` lets the models furthest behind catch up first. ``due``: something is due
        now (as :meth:`urgency` says). With the policy's ``handoff_yield``, a running sequence whose request handed
        its first output downstream (``Timings.handed_off``) and has no audio out yet waits on that model: it is
        neither due nor behind, and ``handed`` says such a sequence exists while nothing is due.
        """
        if self._work_class is not WorkClass.REALTIME or self._closed:
            return None
        quantum = self._step_cost if self._step_cost is not None else self.worker.policy.quantum
        virtual: float | None = None
        admissible = bool(self.waiting) and not self._bulk_full()
        bulk_room = self._bulk_room()
        for seq in self.waiting if admissible else ():
            sess = self._sessions.get(seq.seq_id)
            if sess is not None and (bulk_room or not sess.bulk):  # bulk ones past their share are not behind
                created = sess.ctx.timings.created
                virtual = created if virtual is None else min(virtual, created)
        due = admissible or bool(self._arriving)
        handoff = self.worker.policy.handoff_yield
        handed = False
        playback: float | None = None
        for seq, timings in self._live():
            if timings.first_chunk is not None:
                deadline = timings.first_chunk + timings.audio_seconds
                playback = deadline if playback is None else min(playback, deadline)
            elif seq.state is RequestState.RUNNING:
                if handoff and timings.handed_off is not None:
                    handed = True
                    continue
                due = True
                behind = timings.created + seq.num_steps * quantum
                virtual = behind if virtual is None else min(virtual, behind)
        return Standing(playback, virtual, due, handed and not due)

    @property
    def step_cost(self) -> float | None:
        """Seconds of this model's steps without newcomers (an average; None before one ran): its requests'
        virtual-time quantum (:meth:`standing`)."""
        return self._step_cost

    def _live(self) -> Iterator[tuple[Sequence[P], Timings]]:
        """The running sequences that have not ended, with their requests' timings (lock held)."""
        for seq in self.running.values():
            sess = self._sessions.get(seq.seq_id)
            if sess is not None and seq.state not in _DONE:
                yield seq, sess.ctx.timings

    def run_step(self) -> None:
        t0 = time.perf_counter()
        self._release_done()
        settled = 0.0
        if self._settle is not None:
            # What the model left running finishes before the batch is picked: newcomers queued meanwhile join it.
            ts = time.perf_counter()
            try:
                self._settle()
            except Exception:  # a device fault: the step below meets it again and fails its batch
                log.warning("%s: settle failed", self.name, exc_info=True)
            settled = time.perf_counter() - ts
        with self.lock:
            batch, _ = self.schedule()
        if not batch:
            return
        self.worker.note_rows(len(batch.prefill), len(batch.decode))
        t1 = time.perf_counter()
        try:
            outputs, error = self.model.step(batch), None
        except Exception as exc:  # fails this batch's sequences only
            log.warning("%s: step of %d sequences failed", self.name, batch.size, exc_info=True)
            outputs, error = [], exc
        t2 = time.perf_counter()
        with self.lock:
            woken = self.postprocess(batch, outputs, error)
            # After postprocess, and under the lock that a resume also takes: a sequence this step paused
            # counts as paused, and a resume on the loop can never be overwritten by this step's counts.
            self._observe_queues()
        self._wake(woken)
        if self._jobs_due is not None and (due := self._jobs_due()):
            # The event loop turns this step's outputs into those jobs (first audio windows) while the device runs
            # the step launched ahead; starting the next step first would queue them behind it.
            self.worker.wait_for_urgent(due, self.due_wait)
        t3 = time.perf_counter()
        self._account(batch, t1 - t0 - settled + t3 - t2, t2 - t1 + settled, len(outputs))

    def schedule(self) -> tuple[Batch[P], int]:
        """Admit waiting sequences into free slots (prefill) and decode the running ones that are not paused."""
        prefill: list[Sequence[P]] = []
        budget = 0 if self._holding(time.perf_counter()) else self._admission_budget()
        while self.waiting and self.free_slots and len(prefill) < budget and not self._bulk_full():
            seq = self.waiting.popleft()
            seq.slot = heapq.heappop(self.free_slots)
            seq.state = RequestState.RUNNING
            self.running[seq.seq_id] = seq
            prefill.append(seq)
            timings = self._sessions[seq.seq_id].ctx.timings
            timings.admitted = time.perf_counter()
            if self.metrics is not None:
                self.metrics.observe_admission(timings.admitted - timings.created)
        decode: list[Sequence[P]] = []
        n_paused = 0
        for seq in self.running.values():
            if seq.state is RequestState.RUNNING and seq.num_steps > 0:
                decode.append(seq)
            elif seq.state is RequestState.PAUSED:
                n_paused += 1
        return Batch(tuple(prefill), tuple(decode)), n_paused

    def _admission_budget(self) -> int:
        """Newcomers the admission rule lets in now, from the playing streams' slack (lock held)."""
        if self._work_class is WorkClass.THROUGHPUT and self.waiting:
            now = time.perf_counter()
            waiting = [
                (self._sessions[s.seq_id].ctx.timings.created, self._sessions[s.seq_id].continuing)
                for s in self.waiting
            ]
            return capacity_budget(
                now,
                free=len(self.free_slots),
                waiting=waiting,
                running=sum(1 for seq in self.running.values() if seq.state not in _DONE),
                cost_per_request=self._row_cost if self._row_cost is not None else self.worker.policy.default_cost,
                demand=self.worker.realtime_demand(now),
                policy=self.worker.policy,
                max_defer=self.max_defer,
            )
        if self.admission is None or not self.waiting:
            return len(self.free_slots)
        now = time.perf_counter()
        slacks = []
        for seq in self.running.values():
            sess = self._sessions.get(seq.seq_id)
            first = sess.ctx.timings.first_chunk if sess is not None else None
            if seq.state is RequestState.RUNNING and sess is not None and first is not None:
                slacks.append(first + sess.ctx.timings.audio_seconds - now)
        ages = [now - self._sessions[seq.seq_id].ctx.timings.created for seq in self.waiting]
        return self.admission.budget(len(self.free_slots), ages, slacks)

    def postprocess(
        self, batch: Batch[P], outputs: list[SeqOutput[O]], error: BaseException | None
    ) -> list[_Session[P, O]]:
        """Buffer each sequence's item; pause those at the high watermark; end finished and failed ones."""
        by_id = {out.seq_id: out for out in outputs}
        touched = []
        for seq in itertools.chain(batch.prefill, batch.decode):
            seq.num_steps += 1
            sess = self._sessions.get(seq.seq_id)
            if sess is None or seq.abort_requested:
                continue  # its consumer left; the release is queued already
            out = by_id.get(seq.seq_id)
            failed = error if error is not None else out.error if out is not None else None
            if failed is not None:
                self._end(seq, sess, failed)
            elif out is not None:
                if out.item is not None:
                    sess.buffer.append(out.item)
                if out.finished:
                    self._end(seq, sess, None)
                elif len(sess.buffer) >= self.high:
                    seq.state = RequestState.PAUSED
            else:
                continue
            touched.append(sess)
        return touched

    def _end(self, seq: Sequence[P], sess: _Session[P, O], error: BaseException | None) -> None:
        seq.state = RequestState.FINISHED if error is None else RequestState.ABORTED
        sess.done = True
        sess.error = error
        self._released.append(seq)

    def _release_done(self) -> None:
        with self.lock:
            if not self._released:
                return
            gone, self._released = self._released, []
            for seq in gone:
                self.running.pop(seq.seq_id, None)
        for seq in gone:
            try:
                self.model.release(seq)
            except Exception:
                log.exception("%s: model.release failed for sequence %d", self.name, seq.seq_id)
        with self.lock:
            for seq in gone:
                heapq.heappush(self.free_slots, seq.slot)
                seq.slot = -1
            self._observe_queues()

    def _queue_counts(self) -> tuple[int, int, int]:
        """(running, waiting, paused) by state; finished and aborted sequences awaiting release are neither."""
        running = paused = 0
        for seq in self.running.values():
            if seq.state is RequestState.RUNNING:
                running += 1
            elif seq.state is RequestState.PAUSED:
                paused += 1
        return running, len(self.waiting), paused

    def _observe_queues(self) -> None:
        """Set the queue gauges from the current states (lock held)."""
        if self.metrics is not None:
            self.metrics.observe_queues(*self._queue_counts())

    def _wake(self, sessions: list[_Session[P, O]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[_Session[P, O]]] = {}
        for sess in sessions:
            if sess.loop is not None:
                by_loop.setdefault(sess.loop, []).append(sess)
        for loop, group in by_loop.items():
            try:
                loop.call_soon_threadsafe(_wake, group)
            except RuntimeError:  # loop closed: nobody waits
                pass

    def _account(self, batch: Batch[P], overhead: float, model_time: float, n_items: int) -> None:
        stats = self.stats
        stats.steps += 1
        stats.items += n_items
        stats.model_seconds += model_time
        stats.overhead_seconds += overhead
        stats.max_batch = max(stats.max_batch, batch.size)
        if batch.decode and not batch.prefill:  # a step's cost per running sequence (throughput admission)
            per = model_time / len(batch.decode)
            self._row_cost = per if self._row_cost is None else self._row_cost + _COST_EMA * (per - self._row_cost)
            cost = self._step_cost
            self._step_cost = model_time if cost is None else cost + _COST_EMA * (model_time - cost)
        if self.metrics is not None:
            self.metrics.observe_batch(batch.size, model_time)

    def shutdown(self) -> None:
        """Fail every open session with EngineClosed and release every admitted sequence (worker thread)."""
        with self.lock:
            self._closed = True
            gone = {seq.seq_id: seq for seq in self._released}
            gone.update(self.running)
            self._released, self.running = [], {}
            for seq in self.waiting:
                seq.state = RequestState.ABORTED
            self.waiting.clear()
            sessions = list(self._sessions.values())
            for sess in sessions:
                if not sess.done:
                    sess.done = True
                    sess.error = EngineClosed(f"scheduler {self.name} closed while request was running")
                if sess.seq.state not in _DONE:
                    sess.seq.state = RequestState.ABORTED
            self._observe_queues()
        for seq in gone.values():
            try:
                self.model.release(seq)
            except Exception:
                log.exception("%s: model.release failed for sequence %d", self.name, seq.seq_id)
            if seq.slot >= 0:
                heapq.heappush(self.free_slots, seq.slot)
            seq.slot = -1
        self._wake(sessions)


@dataclass(slots=True)
class OfflineResult(Generic[O]):
    """One payload's items, in order, and what failed it (None: it finished)."""

    items: list[O]
    error: BaseException | None = None


def run_offline(
    model: BatchModel[P, O],
    payloads: PySequence[P],
    join_steps: PySequence[int] | None = None,
    *,
    name: str = "offline",
) -> list[OfflineResult[O]]:
    """Run ``payloads`` to completion through a :class:`Scheduler` on this thread (tests, offline use).

    The same admission, batching and release code as serving, stepped here without a worker thread or an event
    loop; ``join_steps[i]`` holds payload ``i`` back until that many steps have run (newcomers joining a running
    batch); payloads beyond the free slots wait for one. Nothing is paused: buffers are read after every step.
    """
    join = list(join_steps) if join_steps is not None else [0] * len(payloads)
    if len(join) != len(payloads):
        raise ValueError("join_steps must match payloads one to one")
    sched = Scheduler(model, DeviceWorker(name=name), high_watermark=1 << 30, name=name)  # the worker never starts
    results: list[OfflineResult[O]] = [OfflineResult([]) for _ in payloads]
    sessions: dict[int, _Session[P, O]] = {}
    pending = list(range(len(payloads)))
    step = 0
    try:
        while pending or any(not sess.done or sess.buffer for sess in sessions.values()):
            for i in [i for i in pending if join[i] <= step]:
                sessions[i] = sched.open(payloads[i], offline=True)
                pending.remove(i)
            with sched.lock:
                runnable = sched.has_work()
            if runnable:
                sched.run_step()
            step += 1
            with sched.lock:
                for i, sess in sessions.items():
                    results[i].items.extend(sess.buffer)
                    sess.buffer.clear()
                    if sess.error is not None:
                        results[i].error, sess.error = sess.error, None
    finally:
        for sess in sessions.values():
            sched.release(sess)
        sched.run_step()  # hands every sequence back to the model
    return results


class SeqStream(Generic[P, O]):
    """The ``O`` items of one sequence, in order; ends when the model finishes it, raises what failed it."""

    __slots__ = ("_sched", "_sess")

    def __init__(self, scheduler: Scheduler[P, O], sess: _Session[P, O]) -> None:
        self._sched = scheduler
        self._sess = sess

    @property
    def seq(self) -> Sequence[P]:
        return self._sess.seq

    @property
    def buffered(self) -> int:
        """Items produced and not yet taken."""
        return len(self._sess.buffer)

    def __aiter__(self) -> SeqStream[P, O]:
        return self

    async def __anext__(self) -> O:
        sched, sess = self._sched, self._sess
        while True:
            with sched.lock:
                if sess.buffer:
                    item = sess.buffer.popleft()
                    seq = sess.seq
                    if seq.state is RequestState.PAUSED and len(sess.buffer) <= sched.low:
                        seq.state = RequestState.RUNNING
                        sched._observe_queues()
                        sched.lock.notify()
                    return item
                if sess.done:
                    error, sess.error = sess.error, None
                    if error is None:
                        raise StopAsyncIteration
                else:
                    error = None
                    assert sess.loop is not None, "an offline session is read by run_offline, not awaited"
                    sess.waiter = waiter = sess.loop.create_future()
            if error is not None:
                raise error
            await sess.ctx.wait(waiter, sched.name)
