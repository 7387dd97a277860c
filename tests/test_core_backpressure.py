"""Backpressure end to end (real worker thread): a reader that stops pauses only its own request, within the
run-ahead bound the engine documents, and resuming loses and duplicates nothing.

To make the bound's worst case happen on every run, each model step first lets the event loop run until
every task is blocked: the stages take all the frames they can before the worker produces the next one.

Why the synthetic TTS (``tests/synthetic``): every frame's samples are known, so a lost or duplicated sample shows,
and the bound is counted in its frames at no step cost; the same bound on the tiny Qwen3-TTS's serving paths is
in ``test_serving_disconnect.py``.
"""

from __future__ import annotations

import asyncio
import threading

import anyio
import numpy as np
from synthetic import SyntheticConfig, tone_samples, write_checkpoint

from omni_stream.engine import AsyncEngine
from omni_stream.requests import RequestState

CONFIG = SyntheticConfig()
SPF = CONFIG.samples_per_frame
WINDOWS = CONFIG.codec_windows  # (1, 2, 4, 8)


def documented_bound(high: int) -> int:
    """engine.py "Run-ahead bound": scheduler buffer + the talker's hand-off + one codec window + the frame after it."""
    return high + 1 + max(WINDOWS) + 1


async def _settle() -> None:
    me = asyncio.current_task()
    for _ in range(100_000):
        runnable = [
            t
            for t in asyncio.all_tasks()
            if t is not me and not t.done() and (t._fut_waiter is None or t._fut_waiter.done())
        ]
        if not runnable:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"the event loop never settled: {runnable}")


class Harness:
    """Steps wait for a settled loop; every queue-gauge update is recorded with the registry's values."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.loop = asyncio.get_running_loop()
        self.sched = engine.models.speech().scheduler
        self.gauges: list[tuple[float, float, float]] = []  # (running, waiting, paused) as /metrics shows them
        self.on_loop: list[bool] = []  # whether each update came from the event loop's thread
        self.changed = asyncio.Event()
        loop_thread = threading.get_ident()
        metrics = self.sched.metrics
        observe = metrics.observe_queues

        def observe_queues(running: int, waiting: int, paused: int) -> None:
            observe(running, waiting, paused)
            self.gauges.append(self.registry_gauges())
            self.on_loop.append(threading.get_ident() == loop_thread)
            self.loop.call_soon_threadsafe(self.changed.set)

        metrics.observe_queues = observe_queues
        engine.models.speech().talker.before_step = self.before_step

    def before_step(self, batch) -> None:
        asyncio.run_coroutine_threadsafe(_settle(), self.loop).result(30)

    def registry_gauges(self) -> tuple[float, float, float]:
        registry, label = self.engine.metrics.registry, {"scheduler": "talker"}
        return tuple(  # type: ignore[return-value]
            registry.get_sample_value(f"omni_stream_requests_{name}", label)
            for name in ("running", "waiting", "paused")
        )

    async def until_gauges(self, running: int, waiting: int, paused: int) -> int:
        """Wait (event-driven) until the gauges read these values; returns the index of that update."""
        want = (running, waiting, paused)
        seen = 0
        with anyio.fail_after(10):  # a hang guard, not a timing assertion
            while True:
                for i in range(seen, len(self.gauges)):
                    if self.gauges[i] == want:
                        return i
                seen = len(self.gauges)
                self.changed.clear()
                await self.changed.wait()

    def seq(self):
        with self.sched.lock:
            (seq,) = [s for s in self.sched.running.values() if s.state is RequestState.PAUSED]
            return seq, len(self.sched._sessions[seq.seq_id].buffer)


async def test_default_settings_a_stalled_reader_stays_within_the_documented_bound_and_resumes_losslessly(tmp_path):
    async with await AsyncEngine.from_pretrained(write_checkpoint(tmp_path), progress=False) as engine:
        high = engine.models.speech().scheduler.high
        assert high == 25  # the default max_buffered_frames
        h = Harness(engine)
        async with engine.speech("s", voice="alice", max_new_tokens=80, ignore_eos=True) as stream:
            chunks = [await stream.__anext__()]  # then stop reading
            paused_at = await h.until_gauges(running=0, waiting=0, paused=1)
            seq, buffered = h.seq()
            delivered = chunks[0].n_samples // SPF
            # Worst case, reached on every run: the codec stage hands over its second window once the frame after
            # it says it is not the last, the talker holds one more frame, and the scheduler's buffer is full.
            assert buffered == high
            assert seq.num_steps == delivered + WINDOWS[1] + 1 + 1 + high
            assert seq.num_steps - delivered <= documented_bound(high)
            assert stream.usage.output_tokens == delivered + WINDOWS[1] + 1 + 1
            assert seq.slot >= 0  # paused, slot kept
            assert h.gauges[-1] == (0, 0, 1)  # nothing changed since: no resume, no further step

            chunks += [audio async for audio in stream]
        assert (1, 0, 0) in h.gauges[paused_at + 1 :]  # resumed
    starts = [c.start_sample for c in chunks]
    assert starts == sorted(set(starts))  # in order, no duplicates
    assert np.array_equal(np.concatenate([c.samples for c in chunks]), tone_samples(CONFIG, 1, 0, 80))


async def test_queue_gauges_show_a_paused_request_as_paused_and_a_resumed_one_as_running(tmp_path):
    async with await AsyncEngine.from_pretrained(write_checkpoint(tmp_path), progress=False) as engine:
        h = Harness(engine)
        async with engine.speech("s", voice="bob", max_new_tokens=60, ignore_eos=True) as stream:
            await stream.__anext__()
            paused_at = await h.until_gauges(running=0, waiting=0, paused=1)
            assert h.registry_gauges() == (0, 0, 1)  # what /metrics serves while the reader stalls
            async for _ in stream:
                pass
        await h.until_gauges(running=0, waiting=0, paused=0)
    # The resume itself updates the gauges (on the loop, where the talker stage drains the buffer), before
    # any step of the worker could.
    resumed_at = h.gauges.index((1, 0, 0), paused_at + 1)
    assert h.on_loop[resumed_at]
    assert h.registry_gauges() == (0, 0, 0)


async def test_a_stalled_reader_pauses_only_its_own_request(tmp_path):
    high = 8
    path = write_checkpoint(tmp_path)
    async with await AsyncEngine.from_pretrained(path, progress=False, max_buffered_frames=high) as engine:
        h = Harness(engine)
        async with engine.speech("s", voice="alice", max_new_tokens=60, ignore_eos=True) as slow:
            chunks = [await slow.__anext__()]  # then stop reading
            await h.until_gauges(running=0, waiting=0, paused=1)
            seq, buffered = h.seq()
            steps_when_paused = seq.num_steps
            async with engine.speech("f", voice="bob", max_new_tokens=60, ignore_eos=True) as fast:
                fast_audio = np.concatenate([a.samples async for a in fast])
            assert np.array_equal(fast_audio, tone_samples(CONFIG, 2, 0, 60))
            with engine.models.speech().scheduler.lock:
                assert seq.state is RequestState.PAUSED and seq.num_steps == steps_when_paused
                assert seq.slot >= 0
            delivered = chunks[0].n_samples // SPF
            assert buffered == high
            assert seq.num_steps - delivered <= documented_bound(high)

            chunks += [a async for a in slow]
        starts = [c.start_sample for c in chunks]
        assert starts == sorted(set(starts))
        assert np.array_equal(np.concatenate([c.samples for c in chunks]), tone_samples(CONFIG, 1, 0, 60))
