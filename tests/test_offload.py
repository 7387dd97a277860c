"""Preparation jobs run on a few threads per event loop, whatever the burst."""

from __future__ import annotations

import asyncio
import threading

import anyio
import pytest

from omni_stream.errors import ConfigError
from omni_stream.runtime.offload import PREPARE_THREADS, prepare_limiter, prepare_threads, run_prepare


async def test_a_burst_of_preparations_borrows_no_more_than_the_limit_of_threads() -> None:
    release, entered = threading.Event(), threading.Semaphore(0)
    threads: set[int] = set()

    def job(i: int) -> int:
        threads.add(threading.get_ident())
        entered.release()
        release.wait()
        return i

    n = 3 * PREPARE_THREADS
    tasks = [asyncio.ensure_future(run_prepare(job, i)) for i in range(n)]
    for _ in range(PREPARE_THREADS):  # the first jobs are in and hold their threads
        await anyio.to_thread.run_sync(entered.acquire)
    stats = prepare_limiter().statistics()
    assert stats.borrowed_tokens == PREPARE_THREADS and stats.tasks_waiting == n - PREPARE_THREADS
    release.set()
    assert await asyncio.gather(*tasks) == list(range(n))
    assert len(threads) <= PREPARE_THREADS


def test_the_number_of_preparation_threads_is_set_by_the_environment(monkeypatch) -> None:
    assert prepare_threads({}) == PREPARE_THREADS == 2
    assert prepare_threads({"OMNI_STREAM_PREPARE_THREADS": " 40 "}) == 40
    for bad in ("0", "65", "two", "-1", "1.5"):
        with pytest.raises(ConfigError, match="OMNI_STREAM_PREPARE_THREADS"):
            prepare_threads({"OMNI_STREAM_PREPARE_THREADS": bad})
    monkeypatch.setenv("OMNI_STREAM_PREPARE_THREADS", "5")

    async def limit() -> float:
        return prepare_limiter().total_tokens

    assert asyncio.run(limit()) == 5  # a new event loop's limiter takes it


def test_every_event_loop_has_its_own_limiter() -> None:
    async def limiter_and_result():
        return prepare_limiter(), await run_prepare(sum, [1, 2, 3])

    (a, x), (b, y) = asyncio.run(limiter_and_result()), asyncio.run(limiter_and_result())
    assert a is not b and x == y == 6


async def test_an_open_engine_keeps_its_loaded_heap_out_of_garbage_collection(tmp_path, monkeypatch) -> None:
    import gc

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
