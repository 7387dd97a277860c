"""Preparation jobs run on a few threads per event loop, a loop pass's jobs as one thread job, whatever the burst."""

from __future__ import annotations

import asyncio
import gc
import threading

import anyio
import pytest

from omni_stream.runtime.offload import (
    PREPARE_THREADS,
    TURN_THREADS,
    Lane,
    preparer,
    run_prepare,
    run_prepare_batched,
)


async def test_the_jobs_of_one_loop_pass_run_as_one_thread_job_in_order() -> None:
    """A burst's requests reach their preparation in one pass of the loop: one hand-off to a thread, not one each."""
    ran: list[tuple[int, int]] = []

    def job(i: int) -> int:
        ran.append((i, threading.get_ident()))
        if i == 3:
            raise ValueError("job 3 fails alone")
        return 10 * i

    before = preparer().batches
    results = await asyncio.gather(*(run_prepare(job, i) for i in range(8)), return_exceptions=True)
    assert results[:3] == [0, 10, 20] and results[4:] == [40, 50, 60, 70]
    assert isinstance(results[3], ValueError) and "job 3" in str(results[3])
    assert [i for i, _ in ran] == list(range(8)) and len({t for _, t in ran}) == 1
    assert preparer().batches == before + 1
    assert threading.get_ident() not in {t for _, t in ran}  # never on the event loop's thread


async def test_jobs_queued_while_threads_are_busy_use_no_more_than_the_limit_of_threads() -> None:
    release, entered = threading.Event(), threading.Semaphore(0)
    threads: set[int] = set()

    def job(i: int) -> int:
        threads.add(threading.get_ident())
        entered.release()
        release.wait()
        return i

    before = preparer().batches
    tasks = []
    for i in range(3 * PREPARE_THREADS):  # one job a loop pass: each its own thread job
        tasks.append(asyncio.ensure_future(run_prepare(job, i)))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    for _ in range(PREPARE_THREADS):  # the first jobs are in and hold every thread
        await anyio.to_thread.run_sync(entered.acquire)
    assert len(threads) == PREPARE_THREADS
    release.set()
    assert await asyncio.gather(*tasks) == list(range(3 * PREPARE_THREADS))
    assert len(threads) <= PREPARE_THREADS
    assert preparer().batches == before + 3 * PREPARE_THREADS  # prompts never gather: a thread job per pass


async def test_a_cancelled_job_is_dropped_and_the_others_of_its_pass_still_get_theirs() -> None:
    gate, ran = threading.Event(), []

    def job(i: int) -> int:
        gate.wait()
        ran.append(i)
        return i

    first = asyncio.ensure_future(run_prepare(job, 0))
    second = asyncio.ensure_future(run_prepare(job, 1))
    await asyncio.sleep(0)
    second.cancel()
    await asyncio.sleep(0)
    gate.set()
    assert await first == 0
    with pytest.raises(asyncio.CancelledError):
        await second
    assert ran == [0]  # the batch came back after its thread saw job 1 cancelled and skipped it


def test_the_loops_preparer_takes_the_number_of_threads_it_is_given() -> None:
    async def threads() -> tuple[int, int, int]:
        first = preparer().threads  # made on first use with the default
        given = preparer(5).threads  # the engine's load hands it Tuning.prepare_threads: replaced
        return first, given, preparer().threads

    assert asyncio.run(threads()) == (PREPARE_THREADS, 5, 5)


def test_every_event_loop_has_its_own_preparer_and_its_threads_end_with_the_loop() -> None:
    async def preparer_and_result():
        return preparer(), await run_prepare(sum, [1, 2, 3])

    (a, x), (b, y) = asyncio.run(preparer_and_result()), asyncio.run(preparer_and_result())
    assert a is not b and x == y == 6
    gc.collect()  # the loops are gone: their preparers' pools are shut down
    assert a._pool._shutdown and b._pool._shutdown


async def test_an_open_engine_keeps_its_loaded_heap_out_of_garbage_collection(tmp_path, monkeypatch) -> None:
    from omni_stream.engine import AsyncEngine
    from omni_stream.models.qwen3_tts.checkpoint import write_tiny_checkpoint
    from omni_stream.runtime import gc_heap

    ckpt = write_tiny_checkpoint(tmp_path / "cv", "custom_voice", "0.6b", seed=3)
    # This engine must be the only holder whatever ran before in this process (a session's shared live server
    # holds the heap frozen): the others' holds are set aside for the test and given back after it.
    monkeypatch.setattr(gc_heap, "_holders", 0)
    gc.unfreeze()
    before = gc.get_freeze_count()
    async with await AsyncEngine.from_pretrained(ckpt, progress=False) as engine:
        talker = engine.models.speech().runner.talker
        assert gc.get_freeze_count() > before
        # a full collection does not walk the model's objects (the permanent generation is skipped)
        assert not any(o is talker for o in gc.get_objects(generation=2))
    assert gc.get_freeze_count() == before == 0  # the last engine to close unfroze the heap


async def test_the_threads_count_their_jobs_and_the_wait_of_a_job_behind_a_slow_one() -> None:
    """What a benchmark reads per level (take()): jobs run, failed ones too, cancelled ones not; a job queued behind
    a slow job of its pass waits for it."""
    gate = threading.Event()

    def slow() -> int:
        gate.wait(10)
        return 1

    def fails() -> int:
        raise ValueError("counted all the same")

    prep = preparer()
    prep.take()
    jobs = [asyncio.ensure_future(run_prepare(f)) for f in (slow, fails, lambda: 3)]
    dropped = asyncio.ensure_future(run_prepare(lambda: 4))
    dropped.cancel()
    await asyncio.sleep(0.05)  # the slow job holds its thread at least this long
    gate.set()
    results = await asyncio.gather(*jobs, return_exceptions=True)
    assert results[0] == 1 and isinstance(results[1], ValueError) and results[2] == 3
    taken = prep.take()
    assert taken.jobs == 3
    # The two behind the slow one were queued before the gate opened, at least 0.05 s after: each waited that long.
    # (The slow job's own run has no such bound: its thread may have picked it up late.)
    assert taken.max_wait_s >= 0.05 and taken.wait_s >= 2 * 0.05
    assert taken.run_s > 0
    assert prep.take().jobs == 0  # a fresh count


async def test_batched_jobs_of_one_pass_go_to_one_call_of_their_batch_in_order() -> None:
    """``run_prepare_batched``: the items of a pass's jobs with the same batch callable go to one call of it (a
    realtime server's sessions' VAD feeds: one network call); other jobs of the pass run where they stand; a
    cancelled item is left out of the call; a batch that raises fails each of its items; each item is counted."""
    calls: list[list[int]] = []
    ran: list[str] = []

    def doubled(items: list[int]) -> list[int]:
        calls.append(list(items))
        ran.append("batch")
        return [2 * i for i in items]

    def broken(items: list[int]) -> list[int]:
        raise ValueError(f"no batch of {len(items)}")

    def alone() -> str:
        ran.append("alone")
        return "alone"

    prep = preparer()
    prep.take()
    before = prep.batches
    futures = [
        asyncio.ensure_future(run_prepare_batched(doubled, 1)),
        asyncio.ensure_future(run_prepare(alone)),
        asyncio.ensure_future(run_prepare_batched(doubled, 2)),
        asyncio.ensure_future(run_prepare_batched(broken, 5)),
        asyncio.ensure_future(run_prepare_batched(doubled, 3)),
        asyncio.ensure_future(run_prepare_batched(broken, 6)),
    ]
    dropped = asyncio.ensure_future(run_prepare_batched(doubled, 4))
    await asyncio.sleep(0)  # every job queued in this pass
    dropped.cancel()
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert results[:3] == [2, "alone", 4] and results[4] == 6
    assert all(isinstance(results[k], ValueError) and "no batch of 2" in str(results[k]) for k in (3, 5))
    assert calls == [[1, 2, 3]] and ran == ["batch", "alone"]  # the batch where its first job stands
    assert prep.batches == before + 1
    assert prep.take().jobs == 6


async def test_turn_detection_has_threads_of_its_own_that_never_wait_behind_prompts() -> None:
    """A realtime session's audio feeds go to the TURNS lane: a prompt job holding every prompt thread does not hold
    them up (queued behind a burst of prompts, feeds waited up to half a second on the GPU host)."""
    gate = threading.Event()
    prompts = preparer()
    busy = [asyncio.ensure_future(run_prepare(gate.wait, 10)) for _ in range(prompts.threads)]
    await asyncio.sleep(0)

    def feed(items: list[int]) -> list[int]:
        return [i + 1 for i in items]

    try:
        fed = await asyncio.wait_for(
            asyncio.gather(*(run_prepare_batched(feed, i, Lane.TURNS) for i in range(3))), timeout=5
        )
    finally:
        gate.set()
    assert fed == [1, 2, 3]
    assert all(await asyncio.gather(*busy))
    turns = preparer(lane=Lane.TURNS)
    assert turns is not prompts and turns.threads == TURN_THREADS


async def test_judgements_have_a_thread_of_their_own_that_never_waits_behind_feeds() -> None:
    """The end-of-turn model's batched judgements go to the JUDGE lane: feeds holding every turn-detection thread do
    not hold them up (behind 32 sessions' feeds, a 5-14 ms judgement waited 84-213 ms on average on the GPU host)."""
    gate = threading.Event()
    turns = preparer(lane=Lane.TURNS)

    def hold(items: list[int]) -> list[bool]:
        return [gate.wait(10) for _ in items]

    busy = []
    for i in range(turns.threads):  # a pass each: each pass's thread job holds a turn-detection thread
        busy.append(asyncio.ensure_future(run_prepare_batched(hold, i, Lane.TURNS)))
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    def judge(items: list[int]) -> list[int]:
        assert threading.current_thread().name.startswith("omni-stream-judge")
        return [i * 10 for i in items]

    try:
        judged = await asyncio.wait_for(
            asyncio.gather(*(run_prepare_batched(judge, i, Lane.JUDGE) for i in range(3))), timeout=5
        )
    finally:
        gate.set()
    assert judged == [0, 10, 20]
    assert all(await asyncio.gather(*busy))
    assert preparer(lane=Lane.JUDGE).threads == 1


async def test_jobs_of_later_passes_queued_while_every_thread_is_busy_go_to_one_call_of_their_batch() -> None:
    """The judgements of 32 sessions' pauses reach the one judging thread over several loop passes: while it judges
    the first pass's, the next passes' wait together and go to one call (one at a time, each pass waited for every
    call before it)."""
    entered, release = threading.Event(), threading.Event()
    calls: list[list[int]] = []

    def judge(items: list[int]) -> list[int]:
        calls.append(list(items))
        if items == [0]:
            entered.set()
            release.wait(10)
        return [10 * i for i in items]

    prep = preparer(lane=Lane.JUDGE)
    before = prep.batches
    first = asyncio.ensure_future(run_prepare_batched(judge, 0, Lane.JUDGE))
    await anyio.to_thread.run_sync(entered.wait, 10)  # the thread holds the first pass's call
    later = []
    for i in range(1, 5):  # a pass each
        later.append(asyncio.ensure_future(run_prepare_batched(judge, i, Lane.JUDGE)))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    release.set()
    assert await asyncio.gather(first, *later) == [0, 10, 20, 30, 40]
    assert calls == [[0], [1, 2, 3, 4]] and prep.batches == before + 2
