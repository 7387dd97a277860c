"""Device worker: jobs run on its thread, results come back to the loop, same-key jobs batch together."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

import anyio
import pytest

from omni_stream.device_policy import DevicePolicy, Standing, WorkClass
from omni_stream.errors import EngineClosed
from omni_stream.worker import DeviceWorker


@pytest.fixture
async def worker():
    w = DeviceWorker(name="test-device", threads=1).start()
    yield w
    await w.aclose()


def gate_job(started: threading.Event, release: threading.Event) -> None:
    started.set()
    if not release.wait(5):
        raise TimeoutError("test gate never opened")


async def test_submit_runs_on_the_worker_thread_and_returns_the_result(worker):
    ident = await worker.submit(threading.get_ident)
    assert ident == worker.thread_id != threading.get_ident()
    assert await worker.submit(pow, 2, 10) == 1024


async def test_submit_raises_the_jobs_exception_type(worker):
    def boom():
        raise LookupError("no such thing")

    with pytest.raises(LookupError, match="no such thing"):
        await worker.submit(boom)
    assert await worker.submit(lambda: "still alive") == "still alive"


async def test_jobs_with_one_key_pending_at_pickup_run_as_one_batch(worker):
    started, release = threading.Event(), threading.Event()
    gate = worker.submit(gate_job, started, release)
    await anyio.to_thread.run_sync(started.wait)  # the worker is busy: what follows stays pending
    calls: list[list[int]] = []

    def square_all(items: list[int]) -> list[int]:
        calls.append(list(items))
        return [x * x for x in items]

    squares = [worker.submit_batched("square", i, square_all) for i in range(5)]
    others = [worker.submit_batched("other", i, square_all) for i in (10, 11)]
    release.set()
    await gate
    assert [await f for f in squares] == [0, 1, 4, 9, 16]
    assert [await f for f in others] == [100, 121]
    assert calls == [[0, 1, 2, 3, 4], [10, 11]]


async def test_a_failing_batch_fails_every_item_of_it_and_nothing_else(worker):
    started, release = threading.Event(), threading.Event()
    gate = worker.submit(gate_job, started, release)
    await anyio.to_thread.run_sync(started.wait)

    def broken(items):
        raise ArithmeticError("bad batch")

    bad = [worker.submit_batched("bad", i, broken) for i in range(3)]
    good = worker.submit_batched("good", 7, lambda items: [x + 1 for x in items])
    short = worker.submit_batched("short", 1, lambda items: [])
    release.set()
    await gate
    for f in bad:
        with pytest.raises(ArithmeticError):
            await f
    assert await good == 8
    with pytest.raises(ValueError, match="0 results for 1 items"):
        await short


async def test_cancelled_waiter_does_not_break_the_worker(worker):
    started, release = threading.Event(), threading.Event()
    gate = worker.submit(gate_job, started, release)
    await anyio.to_thread.run_sync(started.wait)
    ran = []
    abandoned = worker.submit(ran.append, 1)
    abandoned.cancel()
    release.set()
    await gate
    assert await worker.submit(lambda: 42) == 42
    assert ran == []  # a job whose waiter left before pickup is skipped


async def test_batched_items_whose_waiters_left_before_pickup_never_reach_batch_fn(worker):
    started, release = threading.Event(), threading.Event()
    gate = worker.submit(gate_job, started, release)
    await anyio.to_thread.run_sync(started.wait)  # hold the worker in a job
    calls: list[list[str]] = []

    def decode(items: list[str]) -> list[str]:
        calls.append(list(items))
        return [item.upper() for item in items]

    futures = {name: worker.submit_batched("codec", name, decode) for name in ("a", "gone", "b", "expired")}
    futures["gone"].cancel()  # its request was cancelled: its state may belong to another request now
    futures["expired"].set_exception(TimeoutError("deadline"))  # what ctx.wait does past the deadline
    all_gone = [worker.submit_batched("other", i, lambda items: [0] * len(items)) for i in range(2)]
    for f in all_gone:
        f.cancel()
    release.set()
    await gate
    assert await futures["a"] == "A" and await futures["b"] == "B"
    assert calls == [["a", "b"]]  # and the all-cancelled group made no call at all


async def test_a_one_off_job_that_expired_before_pickup_is_skipped(worker):
    started, release = threading.Event(), threading.Event()
    gate = worker.submit(gate_job, started, release)
    await anyio.to_thread.run_sync(started.wait)
    ran = []
    expired = worker.submit(ran.append, 1)
    expired.set_exception(TimeoutError("deadline"))
    release.set()
    await gate
    assert await worker.submit(lambda: 42) == 42
    assert ran == []
    with pytest.raises(TimeoutError):
        await expired


async def test_close_fails_pending_jobs_with_engine_closed():
    w = DeviceWorker(threads=1).start()
    started, release = threading.Event(), threading.Event()
    gate = w.submit(gate_job, started, release)
    await anyio.to_thread.run_sync(started.wait)
    pending = w.submit(lambda: "never")
    closing = threading.Thread(target=w.close)
    closing.start()
    release.set()
    await gate
    with pytest.raises(EngineClosed):
        await pending
    await anyio.to_thread.run_sync(closing.join)
    with pytest.raises(EngineClosed):
        w.submit(lambda: None)


async def test_idle_worker_blocks_on_its_condition(worker):
    await worker.submit(lambda: None)
    with anyio.fail_after(5):
        while True:  # wait for the thread to go back to sleep
            frame = sys._current_frames()[worker._thread.ident]
            if frame.f_code.co_name == "wait":
                break
            await anyio.sleep(0.001)
    assert "Condition" in repr(frame.f_locals.get("self"))


async def test_aclose_gives_up_on_a_step_that_never_returns(caplog):
    w = DeviceWorker(name="stuck-device", threads=1).start()
    started, release = threading.Event(), threading.Event()
    gate = w.submit(gate_job, started, release)
    await anyio.to_thread.run_sync(started.wait)
    with anyio.fail_after(10):  # a hang guard, not a timing assertion
        await w.aclose(grace=0.01)
    assert "still busy" in caplog.text and w.closed
    release.set()
    await gate


async def test_init_runs_on_the_worker_thread_before_any_job():
    seen: list[tuple[str, int]] = []
    local = threading.local()

    def init() -> None:
        local.tag = "ready"
        seen.append(("init", threading.get_ident()))

    w = DeviceWorker(name="init-device", init=init, threads=1).start()
    try:
        assert await w.submit(lambda: getattr(local, "tag", None)) == "ready"  # thread-local state set by init
        assert seen == [("init", w.thread_id)]
    finally:
        await w.aclose()


async def test_a_failing_init_is_logged_and_the_worker_still_runs(caplog):
    def init() -> None:
        raise RuntimeError("no stream today")

    w = DeviceWorker(name="bad-init", init=init, threads=1).start()
    try:
        assert await w.submit(pow, 3, 2) == 9
    finally:
        await w.aclose()
    assert "init failed" in caplog.text and "no stream today" in caplog.text


class ScriptedSource:
    """A step source of ``steps`` steps, each calling ``on_step(name)`` on the worker thread; ``urgent``: its stream
    is due now while it has work (else it has no deadline, so throughput work is never held for it)."""

    def __init__(
        self, name: str, work_class: WorkClass, steps: int, on_step: Callable[[str], None], *, urgent: bool = True
    ) -> None:
        self.name, self.work_class, self.left, self.on_step, self.urgent = name, work_class, steps, on_step, urgent

    def has_work(self) -> bool:
        return self.left > 0

    def next_deadline(self) -> None:
        return None

    def urgency(self, now: float) -> float | None:
        return now if self.urgent and self.left > 0 else None

    def run_step(self) -> None:
        self.left -= 1
        self.on_step(self.name)

    def shutdown(self) -> None:
        pass


class BehindSource(ScriptedSource):
    """A realtime source whose requests no listener plays yet, standing at virtual time ``virtual``."""

    def __init__(self, name: str, steps: int, on_step: Callable[[str], None], virtual: float) -> None:
        super().__init__(name, WorkClass.REALTIME, steps, on_step)
        self.virtual = virtual

    def standing(self, now: float) -> Standing | None:
        return Standing(None, self.virtual, True) if self.left > 0 else None


@pytest.mark.parametrize("lead", [0.05, 0.0])
async def test_the_source_furthest_behind_in_virtual_time_runs_until_it_catches_up(lead):
    """Two models whose requests are all due now (no audio out yet): the one whose requests stand further behind
    steps alone while the other is more than ``lead`` ahead (``max_skip`` long enough never to end it here), then
    the other; with ``lead`` 0 (the default) both step every round, in the order they were attached (the rule's
    inputs are not even read)."""
    stepped: list[str] = []
    done = threading.Event()

    def step(name: str) -> None:
        stepped.append(name)
        if len(stepped) == 6:
            done.set()

    policy = DevicePolicy(lead=lead, max_skip=60.0)
    w = DeviceWorker(name="test-device", threads=1, policy=policy)
    w.attach(BehindSource("text", 3, step, virtual=1.0))  # attached first: attach order does not decide
    w.attach(BehindSource("asr", 3, step, virtual=0.0))
    w.start()
    try:
        assert await anyio.to_thread.run_sync(done.wait, 10)
    finally:
        await w.aclose()
    expected = ["asr"] * 3 + ["text"] * 3 if lead else ["text", "asr"] * 3
    assert stepped == expected


async def test_each_realtime_step_runs_in_its_sources_context_and_throughput_steps_in_theirs():
    """``source_context`` (on CUDA: a stream of the source's own) is entered around every realtime step with that
    source; throughput steps run in ``throughput_context`` instead."""
    from contextlib import contextmanager

    entered: list[tuple[str, str]] = []
    stepped: list[tuple[str, tuple[str, str] | None]] = []
    done = threading.Event()
    inside: list[tuple[str, str]] = []

    def step(name: str) -> None:
        stepped.append((name, inside[-1] if inside else None))
        if len(stepped) == 4:
            done.set()

    def context(kind: str):
        @contextmanager
        def enter(source=None):
            mark = (kind, source.name if source is not None else "")
            entered.append(mark)
            inside.append(mark)
            try:
                yield
            finally:
                inside.pop()

        return enter

    w = DeviceWorker(
        name="test-device", threads=1, throughput_context=context("throughput"), source_context=context("own")
    ).start()
    rt, tp = WorkClass.REALTIME, WorkClass.THROUGHPUT
    sources = [ScriptedSource("text", rt, 2, step), ScriptedSource("speech", rt, 1, step),
               ScriptedSource("image", tp, 1, step)]  # fmt: skip
    try:
        for source in sources:
            w.attach(source)
        assert await anyio.to_thread.run_sync(done.wait, 10)
    finally:
        await w.aclose()
    assert sorted(stepped, key=str) == sorted(
        [("text", ("own", "text")), ("text", ("own", "text")), ("speech", ("own", "speech")),
         ("image", ("throughput", ""))], key=str)  # fmt: skip


async def test_no_throughput_step_starts_before_the_last_ones_fence_is_done():
    """``throughput_fence`` (on CUDA: an event on the side stream): after a throughput step, its source is not
    stepped again until the step's fence is done, while realtime work goes on; the fence's watcher wakes an idle
    worker when it is done, and each fence is made inside the throughput context (on the step's stream)."""
    from contextlib import contextmanager

    class Fence:
        def __init__(self, made_inside: bool) -> None:
            self.done, self.made_inside = threading.Event(), made_inside

        def query(self) -> bool:
            return self.done.is_set()

        def synchronize(self) -> None:
            assert self.done.wait(10), "test fence never released"

    fences: list[Fence] = []
    inside = threading.Event()
    stepped: list[str] = []
    changed = threading.Condition()

    def step(name: str) -> None:
        with changed:
            stepped.append(name)
            changed.notify_all()

    @contextmanager
    def side():
        inside.set()
        try:
            yield
        finally:
            inside.clear()

    def fence() -> Fence:
        made = Fence(inside.is_set())
        with changed:
            fences.append(made)
            changed.notify_all()
        return made

    async def until(predicate) -> None:
        def wait() -> bool:
            with changed:
                return changed.wait_for(predicate, 10)

        assert await anyio.to_thread.run_sync(wait)

    w = DeviceWorker(name="test-device", threads=1, throughput_context=side, throughput_fence=fence).start()
    try:
        w.attach(ScriptedSource("image", WorkClass.THROUGHPUT, 3, step, urgent=False))
        await until(lambda: len(fences) == 1)
        # rounds after the fence: realtime steps, image held (no stream is due: only the fence holds it)
        w.attach(ScriptedSource("speech", WorkClass.REALTIME, 2, step, urgent=False))
        await until(lambda: stepped.count("speech") == 2)
        assert stepped == ["image", "speech", "speech"]
        fences[0].done.set()  # the worker is idle now: only the watcher can wake it
        await until(lambda: len(fences) == 2)
        assert stepped == ["image", "speech", "speech", "image"]
        fences[1].done.set()
        await until(lambda: len(fences) == 3)
        assert stepped.count("image") == 3 and all(f.made_inside for f in fences)
    finally:
        for made in fences:
            made.done.set()
        await w.aclose()
