"""GPU-only: with ``realtime_priority`` the device worker's realtime work runs on a stream of higher priority than
the throughput steps' side stream, the families load on it, and speech is the same as without it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omni_stream.engine import AsyncEngine
from omni_stream.models.qwen3_tts.checkpoint import write_tiny_checkpoint
from omni_stream.requests import GREEDY, SpeechRequest
from omni_stream.runtime.settings import Tuning
from omni_stream.runtime.worker_streams import make_realtime_stream, throughput_stream

pytestmark = pytest.mark.gpu


def test_the_side_stream_is_of_lower_priority_than_the_realtime_one():
    realtime = make_realtime_stream("cuda")
    assert realtime is not None and realtime.priority < 0  # negative: higher than the default stream's 0
    side, back = throughput_stream("cuda", realtime)
    assert side is not None and back is not None
    with side():
        assert torch.cuda.current_stream().priority == 0 > realtime.priority
        with back():
            assert torch.cuda.current_stream() == realtime


async def test_the_worker_runs_on_the_realtime_stream_and_speech_is_unchanged(tmp_path):
    checkpoint = write_tiny_checkpoint(tmp_path, "custom_voice", "0.6b", seed=1)
    heard = []
    for on in (False, True):
        tuning = Tuning(realtime_priority=on)
        async with await AsyncEngine.from_pretrained(
            checkpoint, device="cuda", progress=False, tuning=tuning
        ) as engine:
            priority = await engine.worker.submit(lambda: torch.cuda.current_stream().priority)
            default = await engine.worker.submit(lambda: torch.cuda.current_stream() == torch.cuda.default_stream())
            assert (priority < 0 and not default) if on else (priority == 0 and default)
            request = SpeechRequest("Hello there.", voice="ryan", sampling=GREEDY, max_new_tokens=12, seed=3)
            async with engine.speech(request) as stream:
                heard.append(np.concatenate([a.samples async for a in stream]))
    assert heard[0].size > 0 and heard[0].shape == heard[1].shape
    np.testing.assert_allclose(heard[0], heard[1], atol=1e-3)
