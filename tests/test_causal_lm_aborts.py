"""Text requests aborted at random points, every way a client can leave, leave no slot, KV or scheduler state."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import anyio
from lm_helpers import tiny_lm_checkpoint

from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.errors import DeadlineExceeded, RequestCancelled
from omni_stream.family import ModelKind
from omni_stream.requests import GREEDY, ChatMessage, Role, SamplingParams, TextRequest

MODES = ("aclose", "task_cancel", "abort", "deadline", "break", "stop_string", "complete")


def chat(text: str, **fields) -> TextRequest:
    return TextRequest(messages=(ChatMessage(Role.USER, text),), **fields)


async def consume(engine: AsyncEngine, mode: str, k: int, rng: random.Random, outcomes: Counter) -> None:
    sampling = SamplingParams(temperature=1.0) if rng.random() < 0.5 else GREEDY
    request = chat("word " * rng.randint(1, 30), max_tokens=rng.randint(1, 60), sampling=sampling,
                   seed=rng.randrange(1 << 30), ignore_eos=rng.random() < 0.5,
                   stop=("e",) if mode == "stop_string" else ())  # fmt: skip
    timeout = rng.uniform(0.001, 0.03) if mode == "deadline" else None
    stream = engine.chat(request, timeout=timeout)
    if mode == "task_cancel":

        async def read() -> None:
            async for _ in stream:  # no `async with`: cancelling the read alone must clean up
                await asyncio.sleep(0)

        task = asyncio.get_running_loop().create_task(read())
        for _ in range(k):
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    else:
        try:
            async with stream:
                n = 0
                async for _ in stream:
                    n += 1
                    if mode in ("aclose", "break") and n >= k:
                        break
                    if mode == "abort" and n >= k:
                        engine.abort(request.request_id)
                    if mode == "deadline":
                        await anyio.sleep(0.001)
        except RequestCancelled:
            outcomes["aborted"] += 1
        except DeadlineExceeded:
            outcomes["deadline_hit"] += 1
    outcomes[mode] += 1


async def test_100_random_aborts_leave_no_state_and_later_requests_are_unchanged(tmp_path_factory, monkeypatch):
    path = tiny_lm_checkpoint(tmp_path_factory, "qwen3")
    sources = {"llm": ModelSource(path, kind=ModelKind.TEXT)}
    async with await AsyncEngine.load(sources, progress=False, max_batch_size=6, max_buffered_frames=4) as engine:
        family = engine.models.text()
        runner, sched = family.runner, family.scheduler  # type: ignore[attr-defined]
        probe = chat("same every time", max_tokens=24, sampling=GREEDY, ignore_eos=True)

        async def text_of(request: TextRequest) -> str:
            async with engine.chat(request) as stream:
                return "".join([o.chunk.text async for o in stream])

        before = await text_of(probe)
        await engine.worker.submit(lambda: None)  # the probe's release has run before the counting starts
        await engine.worker.submit(lambda: None)
        admitted: Counter[int] = Counter()
        released: Counter[int] = Counter()
        real_admit, real_release = runner._admit, runner.release

        def admit(seq):
            admitted[seq.seq_id] += 1
            return real_admit(seq)

        def release(seq):
            released[seq.seq_id] += 1
            return real_release(seq)

        monkeypatch.setattr(runner, "_admit", admit)
        monkeypatch.setattr(runner, "release", release)
        rng = random.Random(20261201)
        outcomes: Counter[str] = Counter()
        async with anyio.create_task_group() as tg:
            for _ in range(100):
                tg.start_soon(consume, engine, rng.choice(MODES), rng.randint(0, 8), rng, outcomes)
        await engine.worker.submit(lambda: None)
        await engine.worker.submit(lambda: None)

        assert sum(outcomes[m] for m in MODES) == 100
        assert outcomes["aborted"] > 0 and outcomes["deadline_hit"] > 0
        assert sched.live() == dict.fromkeys(sched.live(), 0)
        assert runner.num_active == 0 and runner._states == {}
        assert set(admitted.values()) == {1} and released == admitted  # each admitted sequence released once
        assert len(admitted) > 50 and sched.stats.max_batch > 1
        assert asyncio.all_tasks() == {asyncio.current_task()}  # no stage or helper task left
        again = TextRequest(messages=probe.messages, max_tokens=24, sampling=GREEDY, ignore_eos=True)
        assert await text_of(again) == before  # reused slots and KV rows give the same tokens
