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
from omni_stream.models.qwen3_tts.codec_stage import LiveCount, SlotWindow, codec_stage, issue_slot_windows
from omni_stream.models.qwen3_tts.codec_stream import (
    CodecStreamState,
    decode_window,
    first_window_frames,
    ramp_schedule,
)
from omni_stream.runtime.gpu_completions import Completions
from omni_stream.worker import DeviceWorker


class Gate:
    """A stand-in for a CUDA event: done once the test opens it; ``synchronize()`` blocks until then."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.waited = threading.Event()

    def query(self) -> bool:
        return self.opened.is_set()

    def synchronize(self) -> None:
        self.waited.set()
        if not self.opened.wait(30):
            raise TimeoutError("gate never opened")


class Broken:
    def query(self) -> bool:
        raise RuntimeError("device fault")

    def synchronize(self) -> None:
        raise RuntimeError("device fault")


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory):
    return load_speech_tokenizer(tiny_checkpoint_dir(tmp_path_factory), with_encoder=False).eval().decoder


def test_ready_events_are_collected_in_hand_over_order_without_blocking() -> None:
    c = Completions(DeviceWorker())  # never started: the test is the worker
    gates = [Gate(), Gate(), Gate()]
    ran: list[tuple[int, object]] = []
    for i, g in enumerate(gates):
        c.watch(g, lambda err, i=i: ran.append((i, err)))
    assert c.has_work() and c.deliver_ready() == 0 and ran == []
    gates[1].opened.set()
    assert c.deliver_ready() == 0 and ran == []  # the second is done, but the first still holds the line
    gates[0].opened.set()
    assert c.deliver_ready() == 2 and ran == [(0, None), (1, None)] and c.pending == 1
    gates[2].opened.set()
    c.run_step()
    assert ran[-1] == (2, None) and not c.has_work()


def test_the_worker_blocks_on_an_event_only_when_nothing_else_is_runnable() -> None:
    busy = [True]
    c = Completions(DeviceWorker(), busy=lambda: busy[0])
    gate = Gate()
    ran: list[object] = []
    c.watch(gate, ran.append)
    c.run_step()  # the talker has work: do not wait for the codec job
    assert ran == [] and not gate.waited.is_set()
    busy[0] = False
    opener = threading.Timer(0.05, gate.opened.set)
    opener.start()
    c.run_step()  # nothing else to do: wait for it (the GIL is released meanwhile)
    opener.join()
    assert gate.waited.is_set() and ran == [None]


def test_device_faults_and_callback_bugs_fail_only_their_own_job() -> None:
    c = Completions(DeviceWorker())
    got: list[BaseException | None] = []

    def bad(err):
        raise ValueError("callback bug")

    ok = Gate()
    ok.opened.set()
    c.watch(Broken(), got.append)
    c.watch(ok, bad)
    c.watch(ok, got.append)
    assert c.deliver_ready() == 3
    assert isinstance(got[0], RuntimeError) and got[1] is None


async def test_a_stopping_worker_fails_the_jobs_still_in_flight() -> None:
    worker = DeviceWorker(threads=1).start()
    c = Completions(worker, busy=lambda: True)  # never blocks: the job stays in flight
    got: list[object] = []
    c.watch(Gate(), got.append)
    await worker.aclose()
    assert len(got) == 1 and type(got[0]).__name__ == "EngineClosed" and not c.has_work()


def _pool(decoder, capacity: int = 4) -> CodecWindows:
    return CodecWindows(decoder, capacity, graphs=False, windows=(1, 2, 4))


def test_issued_windows_settle_when_collected_with_the_synchronous_audio(decoder) -> None:
    sync, side = _pool(decoder), _pool(decoder)
    completions = Completions(DeviceWorker())
    gate = Gate()
    launch = side.issue
    side.issue = lambda *a: PendingAudio(launch(*a).pieces, gate)  # type: ignore[method-assign,arg-type]
    gen = torch.Generator().manual_seed(0)
    codes = [torch.randint(0, 2048, (2, 16), generator=gen) for _ in range(3)]
    slots = [side.acquire() for _ in range(3)]
    assert slots == [sync.acquire() for _ in range(3)]
    jobs = [SlotWindow(s, c, True) for s, c in zip(slots, codes, strict=True)]
    futures = issue_slot_windows(side, jobs, completions)
    assert completions.deliver_ready() == 0 and not any(f.done() for f in futures)
    gate.opened.set()
    assert completions.deliver_ready() == 1
    got = [f.result(timeout=0) for f in futures]
    want = sync.decode(slots, codes, [True] * 3)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.float32 and g.shape == (2 * 1920,) and np.array_equal(g, w)


def test_a_job_with_a_first_window_is_waited_for_before_the_worker_moves_on(decoder) -> None:
    pool = _pool(decoder)
    completions = Completions(DeviceWorker())
    gate = Gate()
    launch = pool.issue
    pool.issue = lambda *a: PendingAudio(launch(*a).pieces, gate)  # type: ignore[method-assign,arg-type]
    codes = torch.randint(0, 2048, (1, 16), generator=torch.Generator().manual_seed(3))
    opener = threading.Timer(0.05, gate.opened.set)
    opener.start()
    futures = issue_slot_windows(pool, [SlotWindow(pool.acquire(), codes, True, first=True)], completions)
    opener.join()
    assert gate.waited.is_set() and futures[0].done() and not completions.has_work()
    assert futures[0].result().shape == (1920,)


async def test_the_worker_runs_talker_work_while_a_codec_window_is_on_the_device(decoder) -> None:
    """A later window is launched and the worker goes on; its audio is collected once its event is done."""
    worker = DeviceWorker(threads=1).start()
    completions = Completions(worker, busy=lambda: True)  # as if the talker always had work: never block
    watched = threading.Event()
    watch = completions.watch
    completions.watch = lambda e, then: (watch(e, then), watched.set())  # type: ignore[method-assign]
    pool = _pool(decoder)
    gates = [Gate(), Gate()]
    gates[0].opened.set()  # the first window (2 frames) is waited for at once; the second stays on the "device"
    events = iter(gates)
    launch = pool.issue
    pool.issue = lambda *a: PendingAudio(launch(*a).pieces, next(events))  # type: ignore[method-assign,arg-type]
    stage = codec_stage(decoder, worker, sample_rate=24000, samples_per_frame=1920, initial_frames=2,
                        steady_frames=4, pool=pool, completions=completions)  # fmt: skip
    codes = torch.randint(0, 2048, (6, 16), generator=torch.Generator().manual_seed(1))
    order: list[str] = []
    out: asyncio.Queue = asyncio.Queue()

    async def upstream():
        for i in range(6):
            yield CodecFrames(codes[i : i + 1], start_frame=i, final=i == 5)

    async def consume() -> None:
        async for audio in stage(RequestContext(), upstream()):
            order.append(f"audio {sum(o.startswith('audio') for o in order)}")
            await out.put(audio)

    try:
        task = asyncio.create_task(consume())
        first = await asyncio.wait_for(out.get(), 10)
        assert await asyncio.to_thread(watched.wait, 10)  # the second window was launched and left in flight
        assert await worker.submit(lambda: order.append("talker step") or 7) == 7
        assert order == ["audio 0", "talker step"]
        gates[1].opened.set()
        await worker.submit(completions.deliver_ready)  # what the runner's after-step hook does
        second = await asyncio.wait_for(out.get(), 10)
        await asyncio.wait_for(task, 10)
        assert order == ["audio 0", "talker step", "audio 1"] and second.final and not first.final
        state = CodecStreamState.zeros(decoder, 1)
        for chunk, (lo, hi) in zip((first, second), ((0, 2), (2, 6)), strict=True):
            want = decode_window(decoder, codes[lo:hi].T[None], state)[0].numpy()
            assert float(np.abs(chunk.samples - want).max()) < 1e-5
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
    worker = DeviceWorker(threads=1).start()
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
