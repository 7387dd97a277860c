"""Codec windows launched by the worker and handed back by a completion thread; the load-adaptive first window.

The device part (a side CUDA stream) runs in ``test_qwen3_gpu.py``; here the same code paths run on the CPU,
with events that the test opens by hand, so the order of things is checked, never their timing.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import torch
from reference_codec import tiny_checkpoint_dir

from omni_stream.chunks import CodecFrames
from omni_stream.context import RequestContext
from omni_stream.models.qwen3_tts.codec import load_speech_tokenizer
from omni_stream.models.qwen3_tts.codec_graphs import CodecWindows, PendingAudio
from omni_stream.models.qwen3_tts.codec_stream import (
    CodecStreamState,
    decode_window,
    first_window_frames,
    ramp_schedule,
)
from omni_stream.models.qwen3_tts.stages import LiveCount, SlotWindow, codec_stage, issue_slot_windows
from omni_stream.runtime.gpu_completions import Completions
from omni_stream.worker import DeviceWorker


class Gate:
    """A stand-in for a CUDA event: ``synchronize()`` blocks until the test opens it."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.waited = threading.Event()

    def synchronize(self) -> None:
        self.waited.set()
        if not self.opened.wait(30):
            raise TimeoutError("gate never opened")


class Broken:
    def synchronize(self) -> None:
        raise RuntimeError("device fault")


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory):
    return load_speech_tokenizer(tiny_checkpoint_dir(tmp_path_factory), with_encoder=False).eval().decoder


@pytest.fixture
def completions():
    c = Completions()
    yield c
    assert c.close()


def test_callbacks_run_in_hand_over_order_after_their_events(completions) -> None:
    gates = [Gate(), Gate()]
    ran: list[tuple[int, object]] = []
    done = threading.Event()
    completions.watch(gates[0], lambda err: ran.append((0, err)))
    completions.watch(gates[1], lambda err: (ran.append((1, err)), done.set()))
    completions.watch(Broken(), lambda err: ran.append((2, err)))
    assert gates[0].waited.wait(5) and ran == []  # blocked on the first event; nothing ran yet
    gates[1].opened.set()
    assert ran == []  # the second is done, but the first still holds the line
    gates[0].opened.set()
    assert done.wait(5)
    assert [i for i, _ in ran[:2]] == [0, 1] and ran[0][1] is None and ran[1][1] is None


def test_a_failed_wait_reaches_its_callback_and_a_failing_callback_stops_nothing(completions) -> None:
    got: list[BaseException | None] = []
    finished = threading.Event()

    def bad(err):
        raise ValueError("callback bug")

    completions.watch(Broken(), got.append)
    ok = Gate()
    ok.opened.set()
    completions.watch(ok, bad)
    completions.watch(ok, lambda err: finished.set())
    assert finished.wait(5)
    assert len(got) == 1 and isinstance(got[0], RuntimeError)


def test_close_runs_what_is_pending_then_refuses_more() -> None:
    c = Completions()
    gate = Gate()
    ran: list[object] = []
    c.watch(gate, ran.append)
    gate.opened.set()
    assert c.close(timeout=10)
    assert ran == [None]
    with pytest.raises(RuntimeError):
        c.watch(gate, ran.append)


def _pool(decoder, capacity: int = 4) -> CodecWindows:
    return CodecWindows(decoder, capacity, graphs=False, windows=(1, 2, 4))


def test_issued_windows_settle_only_after_their_event_with_the_synchronous_audio(decoder, completions) -> None:
    sync, side = _pool(decoder), _pool(decoder)
    gate = Gate()
    launch = side.issue
    side.issue = lambda *a: PendingAudio(launch(*a).pieces, gate)  # type: ignore[method-assign,arg-type]
    gen = torch.Generator().manual_seed(0)
    codes = [torch.randint(0, 2048, (2, 16), generator=gen) for _ in range(3)]
    slots = [side.acquire() for _ in range(3)]
    assert slots == [sync.acquire() for _ in range(3)]
    futures = issue_slot_windows(side, [SlotWindow(s, c, True) for s, c in zip(slots, codes, strict=True)], completions)
    assert gate.waited.wait(5) and not any(f.done() for f in futures)
    gate.opened.set()
    got = [f.result(timeout=10) for f in futures]
    want = sync.decode(slots, codes, [True] * 3)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.float32 and g.shape == (2 * 1920,) and np.array_equal(g, w)


async def test_the_worker_runs_other_work_while_a_codec_window_is_on_the_device(decoder, completions) -> None:
    """Issuing returns at once: a talker job submitted after the window runs before the window is done."""
    worker = DeviceWorker().start()
    pool = _pool(decoder)
    gate = Gate()
    launch = pool.issue
    pool.issue = lambda *a: PendingAudio(launch(*a).pieces, gate)  # type: ignore[method-assign,arg-type]
    stage = codec_stage(decoder, worker, sample_rate=24000, samples_per_frame=1920, initial_frames=2,
                        steady_frames=4, pool=pool, completions=completions)  # fmt: skip
    codes = torch.randint(0, 2048, (2, 16), generator=torch.Generator().manual_seed(1))
    order: list[str] = []

    async def upstream():
        yield CodecFrames(codes, start_frame=0, final=True)

    async def consume():
        async for audio in stage(RequestContext(), upstream()):
            order.append("audio")
            return audio
        return None

    try:
        task = asyncio.create_task(consume())
        # the window is on the "device": the completion thread waits on it
        assert await asyncio.to_thread(gate.waited.wait, 10)
        assert await worker.submit(lambda: order.append("talker step") or 7) == 7
        assert order == ["talker step"]
        gate.opened.set()
        audio = await asyncio.wait_for(task, 10)
        assert order == ["talker step", "audio"] and audio is not None and audio.final
        want = decode_window(decoder, codes.T[None], CodecStreamState.zeros(decoder, 1))[0].numpy()
        assert float(np.abs(audio.samples - want).max()) < 1e-5
        assert pool.in_use == 0  # the row went back when the stage ended
    finally:
        await worker.aclose()


# -- the first window follows the load -------------------------------------------------------------------------


def test_first_window_is_one_frame_when_idle_and_grows_with_load() -> None:
    assert [first_window_frames(n) for n in (1, 2, 16, 32, 33, 64, 65, 128, 10_000)] == [1, 1, 1, 1, 2, 2, 4, 4, 4]
    assert first_window_frames(128, requested=1) == 1 and first_window_frames(1, requested=6) == 6
    assert first_window_frames(5, by_load=((4, 2),), most=3) == 3
    with pytest.raises(ValueError):
        first_window_frames(1, requested=0)
    # The ramp from each first window still covers every frame, doubling up to the steady size.
    assert ramp_schedule(40, first_window_frames(1), 25) == [1, 2, 4, 8, 16, 9]
    assert ramp_schedule(40, first_window_frames(100), 25) == [4, 8, 16, 12]


@pytest.mark.parametrize(("load", "requested", "first"), [(0, None, 1), (40, None, 2), (99, None, 4), (99, 1, 1)])
async def test_the_stage_sizes_its_first_window_by_the_load_when_the_first_frame_arrives(
    decoder, load: int, requested: int | None, first: int
) -> None:
    worker = DeviceWorker().start()
    live = LiveCount()
    stage = codec_stage(decoder, worker, sample_rate=24000, samples_per_frame=1920, initial_frames=requested,
                        steady_frames=25, live=live)  # fmt: skip
    codes = torch.randint(0, 2048, (8, 16), generator=torch.Generator().manual_seed(2))
    seen: list[int] = []

    async def upstream():
        assert live.value == 1  # this request's own stage is counted from its start
        live.value += load  # others arrive before the first frame is made
        for i in range(8):
            yield CodecFrames(codes[i : i + 1], start_frame=i, final=i == 7)

    try:
        sizes = [a.n_samples // 1920 async for a in stage(RequestContext(), upstream())]
        seen.append(live.value)
    finally:
        await worker.aclose()
    assert sizes[0] == first and sum(sizes) == 8 and sizes == ramp_schedule(8, first, 25)
    assert seen == [load]  # the stage's own count left with it
