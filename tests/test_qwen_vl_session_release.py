"""Frame sessions of Qwen2.5-VL (tiny random checkpoint, fp32, one torch thread) keep their rows right however
things end: a session's rows and slot are freed when its owner is cancelled (anyio scopes and plain
``task.cancel()``, at random points of its life), a frame whose write fails leaves the session as it was (a
question afterwards answers as its whole prompt does), and a frame the caller changes in place after sending it
changes nothing the session holds."""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter

import anyio
import numpy as np
import pytest
import torch
from vl_helpers import tiny_vl_checkpoint

from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.errors import ConfigError, InvalidRequestError
from omni_stream.family import ModelKind
from omni_stream.models.causal_lm.tokenizer import ChatTokenizer
from omni_stream.models.qwen_vl.config import load_config, load_image_spec
from omni_stream.models.qwen_vl.frames import image_key
from omni_stream.models.qwen_vl.model import load_vl
from omni_stream.models.qwen_vl.prompt import session_prefix
from omni_stream.models.qwen_vl.runner import FrameIn, QwenVLRunner
from omni_stream.models.qwen_vl.vision import prepare_image, smart_resize
from omni_stream.requests import GREEDY, ChatMessage, Role, TextRequest
from omni_stream.runtime.kv_cache import Attend

torch.set_num_threads(1)
MAX_TOKENS = 6


class WriteFails(RuntimeError):
    """The device failing part way through a frame session's write (injected)."""


def frame(i: int) -> np.ndarray:
    """A 56 x 84 frame: 6 image tokens, 8 cache rows."""
    return np.random.default_rng(100 + i).integers(0, 256, (56, 84, 3), dtype=np.uint8)


def keys(images) -> list[bytes]:
    return [image_key(image) for image in images]


def question(messages: tuple[ChatMessage, ...]) -> TextRequest:
    return TextRequest(messages=messages, max_tokens=MAX_TOKENS, sampling=GREEDY, ignore_eos=True)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_vl_checkpoint(tmp_path_factory)


async def load(ckpt, **backend_args):
    source = {"llm": ModelSource(ckpt, kind=ModelKind.TEXT)}
    return await AsyncEngine.load(source, progress=False, max_batch_size=4, backend_args=backend_args)


async def tokens(engine: AsyncEngine, request: TextRequest) -> list[int]:
    runner = engine.models.text().runner  # type: ignore[attr-defined]
    runner.record = True
    async with engine.chat(request) as stream:
        async for _ in stream:
            pass
    await engine.worker.submit(lambda: None)
    (out,) = runner.recorded.values()
    runner.recorded.clear()
    return out


async def settle(engine: AsyncEngine) -> None:
    """Let every job queued by now, and any it queues from the loop when it ends, run (a close submitted by a
    session that opened after its opener was cancelled is queued by the open's done callback)."""
    for _ in range(3):
        await engine.worker.submit(lambda: None)


def fail_writes(runner: QwenVLRunner, when) -> Counter[str]:
    """Make the session cache's writes for which ``when(slot, start)`` holds fail at the second layer, after the
    first layer's rows were written (a device error part way through the forward); returns a count of them."""
    kv = runner.session_kv
    assert kv is not None
    real = kv.prefill
    failed: Counter[str] = Counter()

    def prefill(slot: int, start: int = 0) -> Attend:
        attend = real(slot, start)
        if not when(slot, start):
            return attend

        def failing(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            if layer >= 1:
                failed["writes"] += 1
                raise WriteFails("injected")
            return attend(layer, q, k, v)

        return failing

    kv.prefill = prefill  # type: ignore[method-assign]
    return failed


def assert_released(family) -> None:
    runner, sched = family.runner, family.scheduler
    assert runner.views == {} and runner._sessions == {}
    assert runner._free_sessions == list(range(runner.session_kv.shape.num_slots))
    assert sched.live() == dict.fromkeys(sched.live(), 0) and runner._states == {}


# -- 1. cancellation --------------------------------------------------------------------------------------


async def test_a_session_body_cancelled_twice_by_task_cancel_frees_its_rows(ckpt):
    """The second ``task.cancel()`` lands while the close waits for the (busy) device worker: the close still runs."""
    async with await load(ckpt, max_sessions=1) as engine:
        family = engine.models.text()
        inside = asyncio.Event()

        async def body() -> None:
            async with family.frame_session() as session:
                await session.add_frame(frame(0))
                inside.set()
                await asyncio.Event().wait()

        task = asyncio.create_task(body())
        await inside.wait()
        gate = threading.Event()
        busy = engine.worker.submit(gate.wait)  # the close queues behind this
        task.cancel()
        for _ in range(5):
            await asyncio.sleep(0)  # the body leaves and its close is queued
        task.cancel()
        gate.set()
        await asyncio.wait([task])
        await busy
        await settle(engine)
        assert_released(family)
        async with family.frame_session() as again:  # the one session is free again
            await again.add_frame(frame(1))


async def test_a_session_whose_opener_is_cancelled_while_it_opens_closes_itself(ckpt):
    async with await load(ckpt, max_sessions=1) as engine:
        family = engine.models.text()
        runner = family.runner
        opening, release = threading.Event(), threading.Event()
        real_open = runner.session_open

        def gated_open(prefix, max_frames):
            opening.set()
            release.wait()
            return real_open(prefix, max_frames)

        runner.session_open = gated_open

        async def body() -> None:
            async with family.frame_session():
                raise AssertionError("the opener was cancelled before the session opened")

        task = asyncio.create_task(body())
        await anyio.to_thread.run_sync(opening.wait)
        task.cancel()
        release.set()
        await asyncio.wait([task])
        assert task.cancelled()
        await settle(engine)
        assert_released(family)
        runner.session_open = real_open
        async with family.frame_session():
            pass


async def test_a_session_is_entered_once(ckpt):
    async with await load(ckpt, max_sessions=2) as engine:
        family = engine.models.text()
        session = family.frame_session()
        async with session:
            with pytest.raises(RuntimeError, match="entered once"):
                await session.__aenter__()
            assert len(family.runner.views) == 1
        assert family.runner.views == {}


async def test_random_aborts_over_a_frame_session_life_free_every_row(ckpt):
    """Enter, frames, questions, exit, cancelled at random points by an anyio scope or by ``task.cancel()`` (once
    or twice): afterwards no view, every slot free, the scheduler idle; the one session can always be opened. A
    point is the k-th step of the life (entered, a frame in, a token out), then a random number of loop turns."""
    async with await load(ckpt, max_sessions=1) as engine:
        family = engine.models.text()
        rng = random.Random(1205)
        steps: Counter[str] = Counter()
        hows: Counter[str] = Counter()

        class Life:
            def __init__(self) -> None:
                self.marks = 0
                self.moved = asyncio.Event()
                self.over = False

            def mark(self, what: str) -> None:
                steps[what] += 1
                self.marks += 1
                self.moved.set()

            async def run(self, n_frames: int, asks: int) -> None:
                try:
                    async with family.frame_session(max_frames=3) as session:
                        self.mark("entered")
                        for i in range(n_frames):
                            await session.add_frame(frame(i))
                            self.mark("frame")
                            if i < asks:
                                async with engine.chat(question(session.messages("What now?"))) as stream:
                                    async for _ in stream:
                                        self.mark("token")
                    self.mark("exited")
                finally:
                    self.end()

            def end(self, *_: object) -> None:
                self.over = True
                self.moved.set()

            async def reach(self, k: int, spins: int) -> None:
                """Until the k-th step (or the end), then ``spins`` loop turns."""
                while self.marks < k and not self.over:
                    self.moved.clear()
                    await self.moved.wait()
                for _ in range(spins):
                    await asyncio.sleep(0)

        async def stop_later(scope: anyio.CancelScope, life: Life, k: int, spins: int) -> None:
            await life.reach(k, spins)
            scope.cancel()

        for _ in range(30):
            n_frames, asks = rng.randint(0, 4), rng.randint(0, 2)
            k, spins = rng.randint(0, 2 + n_frames * 2), rng.randint(0, 30)
            how = rng.choice(["scope", "cancel", "cancel twice"])
            life = Life()
            if how == "scope":
                with anyio.CancelScope() as scope:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(stop_later, scope, life, k, spins)
                        await life.run(n_frames, asks)
                        scope.cancel()
                hows[how] += scope.cancelled_caught
            else:
                task = asyncio.create_task(life.run(n_frames, asks))
                task.add_done_callback(life.end)  # also when cancelled before its first step
                await life.reach(k, spins)
                task.cancel()
                if how == "cancel twice":
                    await life.reach(k + 1, rng.randint(0, 10))
                    task.cancel()
                await asyncio.wait([task])
                if not task.cancelled():
                    task.result()  # it ended before the cancel came: it must have ended well
                hows[how] += task.cancelled()
            await settle(engine)
            assert_released(family)
        assert steps["entered"] > 0 and steps["frame"] > 0 and steps["token"] > 0 and steps["exited"] > 0
        assert all(hows[how] > 0 for how in ("scope", "cancel", "cancel twice")), hows
        async with family.frame_session() as session:  # nothing leaked: the one session opens
            await session.add_frame(frame(0))


# -- 2. a failed write -------------------------------------------------------------------------------------


async def test_a_failed_frame_write_leaves_the_session_as_it_was(ckpt):
    async with await load(ckpt) as engine:
        family = engine.models.text()
        runner = family.runner
        async with family.frame_session(max_frames=8) as session:
            for i in range(2):
                await session.add_frame(frame(i))
            before = runner.views[0]
            failed = fail_writes(runner, lambda slot, start: failed["writes"] == 0)
            with pytest.raises(WriteFails):
                await session.add_frame(frame(2))
            assert failed["writes"] == 1
            assert keys(session.frames) == keys([frame(0), frame(1)]) and runner.views[0] is before
            await session.add_frame(frame(3))  # after the two kept frames' rows
            assert keys(session.frames) == keys([frame(0), frame(1), frame(3)])
            shown = session.frames
            incremental = await tokens(engine, question(session.messages("What changed?")))
            assert runner.prefill_log[-1][2] == "continued"
        whole = await tokens(engine, question((ChatMessage(Role.USER, "What changed?", images=shown),)))
        assert runner.prefill_log[-1][2] == "eager" and incremental == whole


async def test_a_rebuild_that_fails_part_way_makes_questions_prefill_their_whole_prompt(ckpt):
    async with await load(ckpt) as engine:
        family = engine.models.text()
        runner = family.runner
        async with family.frame_session(max_frames=2) as session:
            for i in range(2):
                await session.add_frame(frame(i))
            failed = fail_writes(runner, lambda slot, start: start == 0 and failed["writes"] == 0)
            with pytest.raises(WriteFails):
                await session.add_frame(frame(2))  # past the window: a rebuild, its rows half overwritten
            assert keys(session.frames) == keys([frame(0), frame(1)])
            asked = session.messages("And now?")
            stale = await tokens(engine, question(asked))
            assert runner.prefill_log[-1][2] == "eager"  # the rows are not the frames' until rebuilt
            await session.add_frame(frame(3))  # rebuilt
            assert keys(session.frames) == keys([frame(1), frame(3)])
            later = session.messages("And now?")
            rebuilt = await tokens(engine, question(later))
            assert runner.prefill_log[-1][2] == "continued"
            shown = session.frames
        assert stale == await tokens(engine, question(asked))
        assert rebuilt == await tokens(engine, question((ChatMessage(Role.USER, "And now?", images=shown),)))


async def test_a_session_whose_first_write_fails_leaves_its_slot_free(ckpt):
    async with await load(ckpt, max_sessions=1) as engine:
        family = engine.models.text()
        runner = family.runner
        failed = fail_writes(runner, lambda slot, start: failed["writes"] == 0)
        with pytest.raises(WriteFails):
            async with family.frame_session():
                pass
        assert runner.views == {} and runner._free_sessions == [0]
        async with family.frame_session() as session:
            await session.add_frame(frame(0))


def test_a_failed_write_in_a_batch_fails_its_own_frame_alone(ckpt):
    cfg = load_config(ckpt)
    tok = ChatTokenizer(ckpt)
    spec = load_image_spec(ckpt, cfg.vision)
    runner = QwenVLRunner(load_vl(ckpt, dtype=torch.float32), tok.decode, max_batch_size=2, max_len=256,
                          max_sessions=2)  # fmt: skip
    prefix = session_prefix(tok, cfg, None)
    runner.session_open(prefix, max_frames=4)
    runner.session_open(prefix, max_frames=4)
    fail_writes(runner, lambda slot, start: slot == 1)

    def frame_in(sid: int, i: int) -> FrameIn:
        return FrameIn(sid, frame(i), image_key(frame(i)), prepare_image(frame(i), spec))

    out = runner.session_append_many([frame_in(0, 0), frame_in(1, 1), frame_in(0, 2)])
    assert isinstance(out[1], WriteFails)
    assert out[0] is not out[2] and out[2] is runner.views[0]
    assert [f.key for f in runner.views[0].frames] == keys([frame(0), frame(2)]) and runner.views[1].frames == ()


# -- 3. frames changed in place ----------------------------------------------------------------------------


async def test_a_frame_changed_in_place_by_its_sender_changes_nothing_held(ckpt):
    async with await load(ckpt) as engine:
        family = engine.models.text()
        async with family.frame_session() as session:
            buffer = frame(0)
            await session.add_frame(buffer)
            buffer[:] = frame(1)  # the caller reuses its buffer for the next frame
            (held,) = session.frames
            assert held is not buffer and keys([held]) == keys([frame(0)])
            with pytest.raises(ValueError):
                held.flags.writeable = True
            assert family.encode_prompt(question(session.messages("What is it?"))).cached is not None
            reused = (ChatMessage(Role.USER, "What is it?", images=(buffer,)),)
            assert family.encode_prompt(question(reused)).cached is None  # other pixels now: no match
            incremental = await tokens(engine, question(session.messages("What is it?")))
        whole = await tokens(engine, question((ChatMessage(Role.USER, "What is it?", images=(frame(0),)),)))
        assert incremental == whole


def test_an_image_key_tells_dtypes_and_shapes_apart():
    image = frame(0)
    assert image_key(image) == image_key(image.copy())
    assert image_key(image) != image_key(image.view(np.int8))
    assert image_key(image) != image_key(image.reshape(84, 56, 3))


# -- 5. errors -----------------------------------------------------------------------------------------------


async def test_session_rows_are_checked_at_load_naming_the_field(ckpt):
    with pytest.raises(ConfigError, match=r"backend_args session_rows: must be an integer >= 1, got 0"):
        await load(ckpt, session_rows=0)
    with pytest.raises(ConfigError, match=r"backend_args session_rows: must be in 1\.\.256 \(max_model_len\)"):
        await load(ckpt, max_model_len=256, session_rows=512)


def test_a_zero_sided_image_is_refused_as_such():
    with pytest.raises(InvalidRequestError, match="0x56 pixels: a side is zero"):
        smart_resize(56, 0, 28, 56 * 56, 28 * 28 * 1280)
