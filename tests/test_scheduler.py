"""Batch scheduler, stepped by hand on the test's thread so every assertion is about step counts and order.

The batch model is the synthetic talker (``tests/synthetic``): its faults at chosen steps and its zero step cost
make every count exact."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import anyio
import pytest
from synthetic import SyntheticConfig, SyntheticFault, SyntheticTalker, TalkerInput
from synthetic.config import Faults

from omni_stream.context import RequestContext
from omni_stream.device_policy import WorkClass
from omni_stream.errors import DeadlineExceeded, EngineClosed
from omni_stream.requests import RequestState
from omni_stream.scheduler import Scheduler
from omni_stream.worker import DeviceWorker

CONFIG = SyntheticConfig()


def make(max_batch: int = 8, high: int = 8, low: int | None = None) -> tuple[Scheduler, SyntheticTalker]:
    model = SyntheticTalker(CONFIG, max_batch, record=True)
    # The worker thread is never started: the tests call run_step() themselves.
    return Scheduler(model, DeviceWorker(), high_watermark=high, low_watermark=low), model


async def settle() -> None:
    """Run the loop until every other task waits on an unresolved future and no callback is queued.

    ``anyio.wait_all_tasks_blocked`` does the same but naps 100 ms whenever a task is runnable.
    """
    loop, this = asyncio.get_running_loop(), asyncio.current_task()
    for _ in range(10_000):
        await asyncio.sleep(0)
        if not loop._ready and all(  # type: ignore[attr-defined]
            t is this or (t._fut_waiter is not None and not t._fut_waiter.done())  # type: ignore[attr-defined]
            for t in asyncio.all_tasks()
        ):
            return
    raise AssertionError("tasks never settled")


async def step(sched: Scheduler, n: int = 1) -> None:
    for _ in range(n):
        sched.run_step()
        await settle()  # let consumers take what the step delivered


def frames_of(items) -> list[int]:
    return [item.start_frame for item in items]


def steps_in(model: SyntheticTalker) -> list[tuple]:
    return [e for e in model.log if e[0] == "step"]


async def read_all(stream, into: list) -> None:
    async for item in stream:
        into.append(item)


async def test_equal_requests_finish_in_length_steps_not_n_times_length():
    sched, model = make(max_batch=8)
    results = [[] for _ in range(8)]
    async with AsyncExitStack() as stack, anyio.create_task_group() as tg:
        for out in results:
            stream = await stack.enter_async_context(sched.session(TalkerInput(n_frames=10, tone=1)))
            tg.start_soon(read_all, stream, out)
        await settle()
        while sched.has_work():
            await step(sched)
    assert model.steps == 10
    assert all(frames_of(out) == list(range(10)) for out in results)
    assert steps_in(model)[0] == ("step", tuple(range(8)), ())  # all prefilled together


async def test_newcomer_is_admitted_and_prefilled_while_others_decode():
    sched, model = make(max_batch=8)
    early = [[] for _ in range(4)]
    late: list = []
    async with AsyncExitStack() as stack, anyio.create_task_group() as tg:
        for out in early:
            tg.start_soon(read_all, await stack.enter_async_context(sched.session(TalkerInput(10, 1))), out)
        await settle()
        await step(sched, 3)
        newcomer = await stack.enter_async_context(sched.session(TalkerInput(10, 2)))
        tg.start_soon(read_all, newcomer, late)
        await step(sched)
        assert steps_in(model)[-1] == ("step", (newcomer.seq.seq_id,), (0, 1, 2, 3))
        assert frames_of(late) == [0]  # its first frame is out while the others are mid-stream
        assert all(len(out) == 4 for out in early)
        while sched.has_work():
            await step(sched)
    assert model.steps == 13
    assert frames_of(late) == list(range(10))


async def test_slow_consumer_pauses_only_itself_and_resumes_without_loss():
    sched, model = make(max_batch=4, high=8)  # low = 2
    fast_items: list = []
    async with sched.session(TalkerInput(100, 1)) as slow, sched.session(TalkerInput(100, 2)) as fast:
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_all, fast, fast_items)
            await settle()
            await step(sched, 20)
            # The slow request stopped at the high watermark, slot kept; the fast one stepped every time.
            assert slow.buffered == 8
            assert slow.seq.state is RequestState.PAUSED
            assert slow.seq.slot >= 0
            assert slow.seq.num_steps == 8
            assert fast.seq.num_steps == 20
            assert len(fast_items) == 20
            assert all(slow.seq.seq_id not in decode for _, _, decode in steps_in(model)[8:])
            # Reading down to the low watermark resumes it.
            got = [await slow.__anext__() for _ in range(5)]
            assert slow.seq.state is RequestState.PAUSED  # 3 left > low
            got.append(await slow.__anext__())
            assert slow.seq.state is RequestState.RUNNING  # 2 left == low
            await step(sched, 3)
            assert slow.seq.num_steps == 11
            assert fast.seq.num_steps == 23
            while sched.has_work() or slow.buffered:
                while slow.buffered:
                    got.append(await slow.__anext__())
                await step(sched)
            with pytest.raises(StopAsyncIteration):
                await slow.__anext__()
    assert frames_of(got) == list(range(100))  # nothing lost, nothing duplicated
    assert frames_of(fast_items) == list(range(100))


async def test_buffer_never_exceeds_the_high_watermark():
    sched, _ = make(max_batch=2, high=5)
    async with sched.session(TalkerInput(50, 1)) as stream:
        seen = []
        for _ in range(40):
            await step(sched)
            seen.append(stream.buffered)
            if len(seen) % 7 == 0:
                await stream.__anext__()
    assert max(seen) == 5


async def test_leaving_the_scope_frees_the_slot_before_the_next_step():
    sched, model = make(max_batch=2)
    async with sched.session(TalkerInput(100, 1)) as keep:
        async with sched.session(TalkerInput(100, 2)) as leave:
            await step(sched, 3)
            leaving, freed_slot = leave.seq.seq_id, leave.seq.slot
        assert leave.seq.state is RequestState.ABORTED
        await step(sched)
        i = model.log.index(("release", leaving))
        assert model.log[i - 1][0] == "step" and model.log[i + 1] == ("step", (), (keep.seq.seq_id,))
        assert sched.live()["slots_in_use"] == 1
        # The freed slot takes a newcomer at once.
        async with sched.session(TalkerInput(5, 3)) as newcomer:
            await step(sched)
            assert newcomer.seq.slot == freed_slot
            assert steps_in(model)[-1][1] == (newcomer.seq.seq_id,)
    await step(sched)
    assert sched.live() == dict.fromkeys(sched.live(), 0)
    assert model.released == {0: 1, 1: 1, 2: 1}
    assert model.live == set()


async def test_leaving_while_waiting_never_reaches_the_model():
    sched, model = make(max_batch=1)
    async with sched.session(TalkerInput(10, 1)):
        async with sched.session(TalkerInput(10, 2)) as queued:
            await step(sched)
            assert queued.seq.state is RequestState.WAITING
        assert queued.seq.state is RequestState.ABORTED
        assert sched.live()["waiting"] == 0
    await step(sched)
    assert model.released == {0: 1}


async def test_release_during_a_step_is_honoured_after_it():
    sched, model = make(max_batch=2)
    async with sched.session(TalkerInput(10, 1)) as a:
        seq = a.seq

        def leave_mid_step(batch):  # the consumer leaves while the worker is inside model.step
            sched.release(a._sess)

        model.before_step = leave_mid_step
        await step(sched)
        model.before_step = None
        assert a.buffered == 0  # the output of the step it left during was dropped
        assert seq.state is RequestState.ABORTED
        await step(sched)
    assert model.released == {seq.seq_id: 1}


async def test_step_error_fails_only_the_batch_it_ran():
    sched, _ = make(max_batch=2)
    outcome: dict[str, object] = {}

    async def consume(name, payload):
        items = []
        try:
            async with sched.session(payload) as stream:
                async for item in stream:
                    items.append(item)
            outcome[name] = frames_of(items)
        except Exception as exc:
            outcome[name] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume, "bad", TalkerInput(10, 1, Faults(step_at=2)))
        tg.start_soon(consume, "same_batch", TalkerInput(10, 2))
        tg.start_soon(consume, "queued", TalkerInput(4, 3))  # no slot yet: not in the failing batch
        await settle()
        while sched.has_work():
            await step(sched)
    assert isinstance(outcome["bad"], SyntheticFault)
    assert isinstance(outcome["same_batch"], SyntheticFault)
    assert outcome["queued"] == [0, 1, 2, 3]


async def test_seq_output_error_fails_one_sequence():
    sched, model = make(max_batch=4)
    outcome: dict[str, object] = {}

    async def consume(name, payload):
        items = []
        try:
            async with sched.session(payload) as stream:
                async for item in stream:
                    items.append(item)
            outcome[name] = frames_of(items)
        except SyntheticFault as exc:
            outcome[name] = (frames_of(items), exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume, "bad", TalkerInput(10, 1, Faults(seq_at=3)))
        tg.start_soon(consume, "good", TalkerInput(10, 2))
        await settle()
        while sched.has_work():
            await step(sched)
    frames, exc = outcome["bad"]
    assert frames == [0, 1, 2] and isinstance(exc, SyntheticFault)
    assert outcome["good"] == list(range(10))
    assert sorted(model.released) == [0, 1] and set(model.released.values()) == {1}


async def test_wait_past_the_deadline_raises_deadline_exceeded():
    sched, _ = make()
    ctx = RequestContext(wait_timeout=0.02)
    with pytest.raises(DeadlineExceeded):
        async with sched.session(TalkerInput(5, 1), ctx) as stream:
            await stream.__anext__()  # nobody steps the model
    assert sched.live()["waiting"] == 0


async def test_shutdown_fails_open_sessions_and_releases_admitted():
    sched, model = make(max_batch=1)
    async with sched.session(TalkerInput(10, 1)) as running, sched.session(TalkerInput(10, 2)) as waiting:
        await step(sched)
        sched.shutdown()
        assert (await running.__anext__()).start_frame == 0  # delivered before the shutdown
        with pytest.raises(EngineClosed):
            await running.__anext__()
        with pytest.raises(EngineClosed):
            await waiting.__anext__()
    assert model.released == {0: 1}
    with pytest.raises(EngineClosed):
        async with sched.session(TalkerInput(1, 1)):
            pass


def test_watermarks_are_validated():
    model = SyntheticTalker(CONFIG, 2)
    with pytest.raises(ValueError):
        Scheduler(model, DeviceWorker(), high_watermark=4, low_watermark=4)
    assert Scheduler(model, DeviceWorker(), high_watermark=16).low == 4


async def test_each_admission_records_its_wait_since_the_request_was_created():
    from prometheus_client import generate_latest

    from omni_stream.metrics import EngineMetrics

    engine_metrics = EngineMetrics()
    model = SyntheticTalker(CONFIG, 2, record=True)
    sched = Scheduler(model, DeviceWorker(), metrics=engine_metrics.scheduler("talker"))
    outs: list[list] = [[] for _ in range(3)]
    async with AsyncExitStack() as stack, anyio.create_task_group() as tg:
        for out in outs:
            ctx = RequestContext()
            ctx.timings.created -= 5.0  # created 5 s before it reached the scheduler
            tg.start_soon(read_all, await stack.enter_async_context(sched.session(TalkerInput(3, 1), ctx)), out)
        await settle()
        await step(sched)  # two slots: the third request waits
        text = generate_latest(engine_metrics.registry).decode()
        assert 'omni_stream_queue_seconds_count{scheduler="talker"} 2.0' in text
        while sched.has_work():
            await step(sched)
    text = generate_latest(engine_metrics.registry).decode()
    assert 'omni_stream_queue_seconds_count{scheduler="talker"} 3.0' in text
    total = next(float(line.split()[-1]) for line in text.splitlines()
                 if line.startswith('omni_stream_queue_seconds_sum{scheduler="talker"}'))  # fmt: skip
    assert 15.0 <= total < 16.0  # each waited its 5 s plus the steps before its admission
    # le="3.2" is a bucket below the 5 s wait, "6.4" the one above: all three there
    assert 'omni_stream_queue_seconds_bucket{le="3.2",scheduler="talker"} 0.0' in text
    assert 'omni_stream_queue_seconds_bucket{le="6.4",scheduler="talker"} 3.0' in text


async def test_standing_tells_the_virtual_time_of_the_most_behind_request_and_the_playback_deadline():
    """What the device worker's virtual-time rule reads (``omni_stream.device_policy``): a request that no listener
    plays yet stands at ``created + steps * quantum``, the quantum the model's own step time once a step without
    newcomers measured it (the policy's before), a newcomer at its creation; a playing one at the end of the audio
    its listener holds; the scheduler's standing is the earliest of each."""
    from omni_stream.device_policy import DevicePolicy, Standing

    model = SyntheticTalker(CONFIG, 2, record=True)
    sched = Scheduler(model, DeviceWorker(policy=DevicePolicy(quantum=0.01)))
    assert sched.standing(0.0) == Standing(None, None, False)  # nothing live
    first, second = RequestContext(), RequestContext()
    first.timings.created, second.timings.created = 100.0, 100.5
    async with AsyncExitStack() as stack:
        for ctx in (second, first):  # the older one queues second: the earliest creation counts, not the queue's head
            await stack.enter_async_context(sched.session(TalkerInput(n_frames=10, tone=1), ctx))
        assert sched.standing(0.0) == Standing(None, 100.0, True)
        sched.run_step()  # both admitted: a step with newcomers measures no step cost
        assert sched.step_cost is None
        assert sched.standing(0.0) == Standing(None, pytest.approx(100.01), True)  # the policy's quantum
        for _ in range(2):
            sched.run_step()
        quantum = sched.step_cost
        assert quantum is not None and quantum > 0  # measured by the steps without newcomers
        assert sched.standing(0.0) == Standing(None, pytest.approx(100.0 + 3 * quantum), True)
        first.timings.record_chunk(0.5, now=200.0)  # its first audio went out: it plays, due when 0.5 s ran out
        standing = sched.standing(0.0)
        assert standing == Standing(200.5, pytest.approx(100.5 + 3 * quantum), True)
        assert sched.urgency(7.0) == 7.0  # the second is still due now
        second.timings.record_chunk(0.25, now=201.0)
        assert sched.standing(0.0) == Standing(200.5, None, False)
        assert sched.urgency(7.0) == 200.5


@pytest.mark.parametrize("handoff", [True, False])
async def test_standing_tells_a_request_waiting_on_its_downstream_model_apart(handoff):
    """With the policy's ``handoff_yield``, a running request that handed its first output downstream
    (``Timings.handed_off``) and has no audio yet is neither due nor behind, and ``handed`` says one waits so while
    nothing is due; once its audio plays, its playback deadline counts as any other's. Off, it is due as before."""
    from omni_stream.device_policy import DevicePolicy, Standing

    model = SyntheticTalker(CONFIG, 2, record=True)
    sched = Scheduler(model, DeviceWorker(policy=DevicePolicy(quantum=0.01, handoff_yield=handoff)))
    first, second = RequestContext(), RequestContext()
    first.timings.created, second.timings.created = 100.0, 100.5
    async with AsyncExitStack() as stack:
        for ctx in (first, second):
            await stack.enter_async_context(sched.session(TalkerInput(n_frames=10, tone=1), ctx))
        sched.run_step()  # both admitted
        first.timings.handed_off = 100.2
        standing = sched.standing(0.0)
        assert standing.due and not standing.handed  # the second still owes its first output
        assert standing.virtual == pytest.approx(100.5 + 0.01 if handoff else 100.01)
        second.timings.handed_off = 100.6
        if handoff:
            assert sched.standing(0.0) == Standing(None, None, False, True)
        else:
            assert sched.standing(0.0) == Standing(None, pytest.approx(100.01), True, False)
        first.timings.record_chunk(0.5, now=200.0)  # its audio plays: due when its 0.5 s run out
        assert sched.standing(0.0).playback == 200.5
        assert sched.standing(0.0).handed == handoff  # the second still waits on its first audio
        assert sched.urgency(7.0) == 7.0  # the rule-off path: the second is due now


async def test_bulk_requests_queue_behind_the_others_and_hold_at_most_their_slots():
    model = SyntheticTalker(CONFIG, 4, record=True)
    sched = Scheduler(model, DeviceWorker(), high_watermark=64, bulk_slots=2)
    outs: dict[str, list] = {}
    async with AsyncExitStack() as stack, anyio.create_task_group() as tg:

        async def open_(name: str, frames: int, **kind) -> int:
            stream = await stack.enter_async_context(sched.session(TalkerInput(frames, 1), **kind))
            tg.start_soon(read_all, stream, outs.setdefault(name, []))
            return stream.seq.seq_id

        b1, b2, b3 = [await open_(f"b{i}", 4, bulk=True) for i in (1, 2, 3)]
        n1 = await open_("n1", 6)
        assert [s.seq_id for s in sched.waiting] == [n1, b1, b2, b3]  # the conversation's turn goes first
        await settle()
        await step(sched)
        assert steps_in(model)[-1] == ("step", (n1, b1, b2), ())  # b3 waits: bulk holds its 2 slots, 1 is free
        n2 = await open_("n2", 2)
        await step(sched)
        assert steps_in(model)[-1] == ("step", (n2,), (n1, b1, b2))  # a later turn takes the free slot at once
        await step(sched, 2)  # b1 and b2 end with their 4th frame (step 4), n2 with its 2nd (step 3)
        assert all(b3 not in prefill for _, prefill, _ in steps_in(model))
        await step(sched)
        assert steps_in(model)[-1] == ("step", (b3,), (n1,))  # only once the bulk slots are free again
        while sched.has_work():
            await step(sched)
    assert {name: len(items) for name, items in outs.items()} == {"b1": 4, "b2": 4, "b3": 4, "n1": 6, "n2": 2}
    assert sched.live() == dict.fromkeys(sched.live(), 0)


async def test_bulk_sequences_past_their_share_do_not_make_work_or_urgency():
    model = SyntheticTalker(CONFIG, 4, record=True)
    sched = Scheduler(model, DeviceWorker(), high_watermark=2, bulk_slots=1)
    async with sched.session(TalkerInput(20, 1), bulk=True) as held, sched.session(TalkerInput(20, 1), bulk=True):
        await step(sched, 3)  # the first fills its buffer (nobody reads it) and pauses; the second may not start
        assert held.seq.state is RequestState.PAUSED and len(sched.waiting) == 1
        assert not sched.has_work()  # nothing runnable, and the waiting one is past the bulk share: no empty steps
        assert sched.urgency(0.0) is None and not sched.standing(0.0).due
    with pytest.raises(ValueError, match="continuing or bulk"):
        sched.open(TalkerInput(1, 1), continuing=True, bulk=True)
    with pytest.raises(ValueError, match="bulk_slots"):
        Scheduler(model, DeviceWorker(), bulk_slots=0)


async def test_queued_bulk_work_does_not_cancel_a_turns_wait_for_the_rest_of_its_burst():
    model = SyntheticTalker(CONFIG, 4, record=True)
    sched = Scheduler(model, DeviceWorker(), high_watermark=64, bulk_slots=2, hold=60.0)
    async with AsyncExitStack() as stack:
        bulk = [await stack.enter_async_context(sched.session(TalkerInput(50, 1), bulk=True)) for _ in range(4)]
        await step(sched)  # 2 bulk run, 2 wait past their share; 2 slots are free
        running = tuple(s.seq.seq_id for s in bulk[:2])
        with sched.arriving() as arrival:  # the second turn of a burst is still being prepared
            first = await stack.enter_async_context(sched.session(TalkerInput(5, 1)))
            await step(sched)
            assert steps_in(model)[-1] == ("step", (), running)  # the first turn waits for it (the hold)
            second = await stack.enter_async_context(sched.session(TalkerInput(5, 1), arrival=arrival))
        await step(sched)
        assert steps_in(model)[-1] == ("step", (first.seq.seq_id, second.seq.seq_id), running)  # one prefill


async def test_a_throughput_scheduler_past_its_bulk_share_sets_no_deadline():
    model = SyntheticTalker(CONFIG, 4, record=True)
    sched = Scheduler(model, DeviceWorker(), high_watermark=2, bulk_slots=1, work_class=WorkClass.THROUGHPUT)
    async with sched.session(TalkerInput(20, 1), bulk=True) as held, sched.session(TalkerInput(20, 1), bulk=True):
        for _ in range(4):
            if sched.has_work():
                await step(sched)
        assert held.seq.state is RequestState.PAUSED and len(sched.waiting) == 1
        with sched.lock:
            assert not sched.has_work() and sched.next_deadline() is None  # nothing to wake the worker for
