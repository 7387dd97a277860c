"""Backpressure end to end (real worker thread): a reader that stops pauses only its own request."""

from __future__ import annotations

import anyio
import numpy as np

from omni_stream.engine import AsyncEngine
from omni_stream.models.synthetic import SyntheticConfig, tone_samples, write_checkpoint
from omni_stream.requests import RequestState

HIGH = 8


async def test_stalled_reader_pauses_at_the_high_watermark_and_resumes_without_loss(tmp_path):
    path = write_checkpoint(tmp_path, codec_windows=[1, 2, 4, 8])
    async with await AsyncEngine.from_pretrained(path, progress=False, max_buffered_frames=HIGH) as engine:
        sched = engine.family.scheduler
        async with engine.speech("s", voice="alice", max_new_tokens=200, ignore_eos=True) as slow:
            chunks = [await slow.__anext__()]  # then stop reading
            async with engine.speech("f", voice="bob", max_new_tokens=200, ignore_eos=True) as fast:
                fast_audio = np.concatenate([a.samples async for a in fast])
            assert np.array_equal(fast_audio, tone_samples(SyntheticConfig(), 2, 0, 200))

            with sched.lock:
                (seq,) = sched.running.values()
            with anyio.fail_after(5):
                while seq.state is not RequestState.PAUSED:  # noqa: ASYNC110 (set on the worker thread)
                    await anyio.sleep(0.001)
            with sched.lock:
                buffered = len(sched._sessions[seq.seq_id].buffer)
            assert sched.low < buffered <= HIGH  # paused at HIGH; the stages may have taken a few since
            # Bounded lead: watermark + the talker->codec channel (4) + one codec window (8) + the audio
            # channel (4 chunks of at most 8 frames) + the items each blocked stage holds.
            assert seq.num_steps <= HIGH + 4 + 8 + 4 * 8 + 8 + 2
            assert seq.slot >= 0  # paused, slot kept

            chunks += [a async for a in slow]
        frames = [c.start_sample // 1920 for c in chunks]
        assert frames == sorted(set(frames))  # in order, no duplicates
        assert np.array_equal(np.concatenate([c.samples for c in chunks]), tone_samples(SyntheticConfig(), 1, 0, 200))
