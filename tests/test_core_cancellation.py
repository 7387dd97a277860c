"""Requests aborted at random points in every way a client can leave leave no per-request state behind.

Why the synthetic families (``tests/synthetic``): hundreds of random aborts at zero step cost, with the model's
release log; the real families' aborts are in ``test_causal_lm_aborts.py``, ``test_serving_disconnect.py`` and the
image and video tests."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import anyio
import anyio.lowlevel
from synthetic import write_checkpoint

from omni_stream.engine import AsyncEngine
from omni_stream.errors import DeadlineExceeded

MODES = ("aclose", "task_cancel", "scope_cancel", "consumer_error", "deadline", "break", "complete")


class ConsumerError(Exception):
    pass


async def worker_barrier(engine: AsyncEngine) -> None:
    """Return once the worker has finished every iteration that began before this call."""
    await engine.worker.submit(lambda: None)
    await engine.worker.submit(lambda: None)


async def consume(engine: AsyncEngine, mode: str, n_chars: int, k: int, rng: random.Random, outcomes: Counter) -> None:
    text = "c" * n_chars
    if mode == "aclose":
        stream = engine.speech(text, voice="alice")
        for _ in range(k):
            if await anext(stream, None) is None:
                break
        await stream.aclose()
    elif mode == "task_cancel":
        stream = engine.speech(text, voice="bob")
        got = anyio.Event()

        async def read() -> None:
            n = 0
            async for _ in stream:  # no `async with`: cancelling the read alone must clean up
                n += 1
                if n >= k:
                    got.set()
            got.set()

        task = asyncio.get_running_loop().create_task(read())
        await got.wait()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            outcomes["task_cancelled"] += 1  # else it had read everything before the cancel landed
    elif mode == "scope_cancel":
        with anyio.CancelScope() as scope:
            async with engine.speech(text, voice="carol") as stream:
                n = 0
                async for _ in stream:
                    n += 1
                    if n >= k:
                        scope.cancel()
                        await anyio.lowlevel.checkpoint()
    elif mode == "consumer_error":
        try:
            async with engine.speech(text, voice="dave") as stream:
                n = 0
                async for _ in stream:
                    n += 1
                    if n >= k:
                        raise ConsumerError
        except ConsumerError:
            pass
    elif mode == "deadline":
        try:
            async with engine.speech(text, voice="alice", timeout=rng.uniform(0.001, 0.02)) as stream:
                async for _ in stream:
                    await anyio.sleep(0.002)
        except DeadlineExceeded:
            outcomes["deadline_hit"] += 1
    elif mode == "break":
        async with engine.speech(text, voice="bob") as stream:
            n = 0
            async for _ in stream:
                n += 1
                if n >= k:
                    break
    else:
        async with engine.speech(text, voice="carol") as stream:
            chunks = [a async for a in stream]
        assert sum(c.n_samples for c in chunks) == max(1, round(n_chars * 0.5)) * 1920
    outcomes[mode] += 1


async def test_random_aborts_leave_no_per_request_state(tmp_path):
    rng = random.Random(20261129)
    path = write_checkpoint(tmp_path, codec_windows=[1, 2, 4])
    async with await AsyncEngine.from_pretrained(
        path, progress=False, max_batch_size=16, max_buffered_frames=4
    ) as engine:
        talker, sched = engine.models.speech().talker, engine.models.speech().scheduler
        talker.record = True
        outcomes: Counter[str] = Counter()
        async with anyio.create_task_group() as tg:
            for _ in range(200):
                mode = rng.choice(MODES)
                tg.start_soon(consume, engine, mode, rng.randint(2, 80), rng.randint(1, 6), rng, outcomes)
        await worker_barrier(engine)

        assert sum(outcomes[m] for m in MODES) == 200
        assert outcomes["task_cancelled"] > 0 and outcomes["deadline_hit"] > 0
        assert sched.live() == dict.fromkeys(sched.live(), 0)
        assert talker.live == set()
        admitted = Counter(i for e in talker.log if e[0] == "step" for i in e[1])
        assert set(admitted.values()) == {1}  # each sequence prefilled once
        assert talker.released == admitted  # released exactly once per admitted sequence
        assert asyncio.all_tasks() == {asyncio.current_task()}  # no stage or host task left
        assert talker.steps > 0 and sched.stats.max_batch > 1
