"""Slot hand-out: the lowest free slot goes first, so a step's rows follow the live batch, not past bursts.

A slot-indexed model computes rows ``0 .. max(slot)`` per step. Handing out the last-freed slot left a
lone request after a burst in a high slot for good, paying for every row below it (and on CUDA a large
graph bucket). Proved by the rows each step computed (synthetic talker and the Qwen3-TTS runner's decode).
"""

from __future__ import annotations

from contextlib import AsyncExitStack

import anyio
import pytest
from synthetic import TalkerInput
from test_scheduler import make, read_all, settle, step

from omni_stream.engine import AsyncEngine
from omni_stream.models.qwen3_tts.checkpoint import write_tiny_checkpoint
from omni_stream.models.qwen3_tts.options import Qwen3TTSOptions
from omni_stream.requests import GREEDY, SpeechRequest


async def _burst(sched, lengths: list[int]) -> None:
    """Run one request per length together to the end; the longest was admitted last (highest slot)."""
    async with AsyncExitStack() as stack, anyio.create_task_group() as tg:
        for n in lengths:
            tg.start_soon(read_all, await stack.enter_async_context(sched.session(TalkerInput(n, 1))), [])
        await settle()
        while sched.has_work():
            await step(sched)


async def test_free_slots_are_handed_out_lowest_first():
    sched, _ = make(max_batch=4)
    async with AsyncExitStack() as stack:
        streams = [await stack.enter_async_context(sched.session(TalkerInput(50, 1))) for _ in range(4)]
        await step(sched)
        assert [s.seq.slot for s in streams] == [0, 1, 2, 3]
        sched.release(streams[0]._sess)  # slots 0 then 2 are freed, in that order
        sched.release(streams[2]._sess)
        await step(sched)
        a = await stack.enter_async_context(sched.session(TalkerInput(50, 2)))
        await step(sched)
        b = await stack.enter_async_context(sched.session(TalkerInput(50, 3)))
        await step(sched)
        assert (a.seq.slot, b.seq.slot) == (0, 2)


async def test_lone_request_after_a_burst_computes_one_row():
    sched, model = make(max_batch=8)
    await _burst(sched, [3 + 4 * i for i in range(8)])  # all eight slots used; slot 7 is freed last
    assert max(model.rows) == 8
    mark = len(model.rows)
    lone: list = []
    async with sched.session(TalkerInput(20, 2)) as stream, anyio.create_task_group() as tg:
        tg.start_soon(read_all, stream, lone)
        await settle()
        assert stream.seq.slot == -1  # not admitted yet
        await step(sched)
        assert stream.seq.slot == 0
        while sched.has_work():
            await step(sched)
    assert len(lone) == 20
    assert list(model.rows)[mark:] == [1] * 20  # every step of the lone request computed one row


@pytest.fixture(scope="module")
def custom_voice_dir(tmp_path_factory: pytest.TempPathFactory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("cv"), "custom_voice", "0.6b", seed=3)


async def _speak(engine: AsyncEngine, frames: int) -> int:
    request = SpeechRequest(
        text="Hello there.",
        voice="ryan",
        max_new_tokens=frames,
        ignore_eos=True,
        sampling=GREEDY,
        options=Qwen3TTSOptions(subtalker_sampling=GREEDY),
    )
    async with engine.speech(request) as stream:
        return sum([a.n_samples async for a in stream])


async def test_qwen3_decode_rows_follow_the_live_batch(custom_voice_dir):
    async with await AsyncEngine.from_pretrained(custom_voice_dir, progress=False, max_batch_size=4) as engine:
        runner = engine.models.speech().runner
        async with anyio.create_task_group() as tg:
            for frames in (4, 8, 12, 16):
                tg.start_soon(_speak, engine, frames)
        assert max(runner.decode_rows) == 4  # the burst held all four slots at once
        mark = len(runner.decode_rows)
        assert await _speak(engine, 10) == 10 * 1920
        assert list(runner.decode_rows)[mark:] == [1] * 10
