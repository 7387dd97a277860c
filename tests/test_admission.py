"""Admission paced by playback deadlines: the pure rule, and the scheduler stepping running streams first.

The batch model is the synthetic talker (``tests/synthetic``): a step makes exactly the frames the test counts, at
no cost, so deadlines and the order of steps are exact; a real model's step time would make them a race."""

from __future__ import annotations

import asyncio
import time

import anyio
import pytest
from synthetic import SyntheticConfig, SyntheticTalker, TalkerInput
from test_scheduler import make, read_all, settle, step, steps_in

from omni_stream.context import RequestContext
from omni_stream.device_policy import WorkClass
from omni_stream.scheduler import Scheduler
from omni_stream.speech.admission import PlaybackAdmission, hold_newcomers
from omni_stream.worker import DeviceWorker


def test_all_newcomers_go_in_while_every_playing_stream_has_audio_ahead() -> None:
    rule = PlaybackAdmission(guard=0.15, max_defer=0.5)
    assert rule.budget(8, [0.01, 0.0], []) == 2  # nothing playing yet
    assert rule.budget(8, [0.01, 0.0], [0.4, 0.15]) == 2
    assert rule.budget(1, [0.01, 0.0], [0.4]) == 1  # never more than the free slots
    assert rule.budget(8, [], [0.0]) == 0


def test_newcomers_wait_while_a_stream_is_about_to_run_dry_but_never_past_max_defer() -> None:
    rule = PlaybackAdmission(guard=0.15, max_defer=0.5)
    assert rule.budget(8, [0.2, 0.1, 0.0], [0.4, 0.149]) == 0
    assert rule.budget(8, [0.7, 0.5, 0.1], [0.4, -0.3]) == 2  # the two that waited long enough, oldest first
    assert rule.budget(1, [0.7, 0.6], [-1.0]) == 1
    with pytest.raises(ValueError):
        PlaybackAdmission(guard=-1)


def _playing(ctx: RequestContext, ahead: float) -> None:
    """Timings as if the consumer had taken chunks that leave ``ahead`` seconds unplayed now."""
    t = ctx.timings
    t.first_chunk = time.perf_counter() - 10.0 + ahead
    t.chunk_times, t.chunk_durations = [t.first_chunk], [10.0]


async def test_the_scheduler_steps_running_streams_first_while_their_listeners_run_dry() -> None:
    sched, model = make(max_batch=4)
    sched.admission = PlaybackAdmission(guard=0.15, max_defer=60.0)
    ctx_a = RequestContext()
    async with sched.session(TalkerInput(20, 1), ctx_a) as a:
        items: list = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_all, a, items)
            await settle()
            await step(sched, 2)
            _playing(ctx_a, ahead=0.05)  # its listener has 50 ms left
            ctx_b = RequestContext()
            async with sched.session(TalkerInput(5, 2), ctx_b) as b:
                await step(sched, 3)
                assert b.seq.num_steps == 0  # held back: three steps for the stream about to run dry
                assert all(e[1] == () for e in steps_in(model)[2:])  # decode-only steps
                _playing(ctx_a, ahead=1.0)  # the stream caught up: the newcomer goes in at the next step
                await step(sched)
                assert steps_in(model)[-1][1] == (b.seq.seq_id,) and b.seq.num_steps == 1
                _playing(ctx_a, ahead=0.0)
                late, old = RequestContext(), RequestContext()
                old.timings.created -= 120.0  # waited past max_defer already: admitted whatever the slack
                async with sched.session(TalkerInput(3, 3), old) as c, sched.session(TalkerInput(3, 4), late) as d:
                    await step(sched)
                    assert c.seq.num_steps == 1 and d.seq.num_steps == 0
                    _playing(ctx_a, ahead=5.0)
                    await step(sched)
                    assert d.seq.num_steps == 1
                    while sched.has_work():
                        await step(sched)
                        for stream in (b, c, d):
                            while stream.buffered:
                                await stream.__anext__()
            tg.cancel_scope.cancel()


def test_newcomers_wait_for_their_burst_only_while_it_is_prepared_and_briefly() -> None:
    assert hold_newcomers(arriving=3, waiting=2, free=8, waited=0.01, hold=0.05)
    assert not hold_newcomers(arriving=0, waiting=2, free=8, waited=0.01, hold=0.05)  # nothing else coming
    assert not hold_newcomers(arriving=3, waiting=8, free=8, waited=0.01, hold=0.05)  # no slot left for them
    assert not hold_newcomers(arriving=3, waiting=2, free=8, waited=0.05, hold=0.05)  # waited long enough
    assert not hold_newcomers(arriving=3, waiting=2, free=8, waited=0.0, hold=0.0)  # holding off


async def test_a_burst_prefills_together_once_its_last_request_is_prepared() -> None:
    sched, model = make(max_batch=4)
    sched.hold = 60.0  # never runs out here: only the arrivals end the wait
    with sched.arriving() as first, sched.arriving() as second, sched.arriving():
        pass  # the third's preparation failed: it counts no more
    assert sched._arriving == 0
    with sched.arriving() as first, sched.arriving() as second:
        async with sched.session(TalkerInput(3, 1), arrival=first) as a:
            assert not sched.has_work()  # the second is still being prepared
            deadline = sched.next_deadline()
            assert deadline is not None and 59.0 < deadline - time.perf_counter() <= 60.0
            async with sched.session(TalkerInput(3, 2), arrival=second) as b:
                assert sched.has_work() and sched.next_deadline() is None
                await step(sched)
                assert steps_in(model)[0] == ("step", (a.seq.seq_id, b.seq.seq_id), ())
                with sched.arriving() as third:
                    await step(sched)  # running streams step while a newcomer is prepared
                    assert steps_in(model)[-1] == ("step", (), (a.seq.seq_id, b.seq.seq_id))
                    async with sched.session(TalkerInput(3, 3), arrival=third) as c:
                        await step(sched)
                        assert steps_in(model)[-1][1] == (c.seq.seq_id,)


async def _held_newcomer_goes_in(**options) -> None:
    """On a running worker, with a request that never finishes its preparation: the worker wakes at the hold's
    end by itself (nothing notifies it then) and admits the newcomer."""
    model = SyntheticTalker(SyntheticConfig(), 2)
    worker = DeviceWorker(threads=1).start()
    try:
        sched = Scheduler(model, worker, hold=0.02, **options)
        with sched.arriving(), sched.arriving() as mine:
            async with sched.session(TalkerInput(2, 1), arrival=mine) as stream:
                first = await asyncio.wait_for(stream.__anext__(), 10)
                assert first.start_frame == 0 and sched._arriving == 1
    finally:
        await worker.aclose()


async def test_a_held_newcomer_goes_in_when_the_hold_runs_out() -> None:
    await _held_newcomer_goes_in()
    with pytest.raises(ValueError, match="hold"):
        Scheduler(SyntheticTalker(SyntheticConfig(), 2), DeviceWorker(), hold=-1)


async def test_a_held_throughput_newcomer_goes_in_when_the_hold_runs_out() -> None:
    """A throughput model's newcomers are held for their burst too: the worker wakes at the hold's end, not at the
    end of the capacity wait (``max_defer``, here longer than the test waits)."""
    await _held_newcomer_goes_in(max_defer=60.0, work_class=WorkClass.THROUGHPUT)
