"""GPU-only: with ``realtime_priority`` the device worker's realtime work runs on a stream of higher priority than
the throughput steps' side stream, the families load on it, and speech is the same as without it; with
``throughput_fence`` too, an image edit beside a speech stream gives the image it gives alone."""

from __future__ import annotations

import anyio
import numpy as np
import pytest
import torch
from image_helpers import NEEDS_DIFFUSERS

from omni_stream.engine import AsyncEngine
from omni_stream.models.qwen3_tts.checkpoint import write_tiny_checkpoint
from omni_stream.requests import GREEDY, SpeechRequest
from omni_stream.runtime.settings import Tuning
from omni_stream.runtime.worker_streams import make_realtime_stream, throughput_fence, throughput_stream

pytestmark = pytest.mark.gpu
pytest_plugins = ("image_fixtures",)


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


def test_a_fence_is_an_event_on_the_side_stream():
    fence = throughput_fence("cuda")
    assert fence is not None and throughput_fence("cpu") is None
    side, _ = throughput_stream("cuda")
    assert side is not None
    with side():
        torch.cuda._sleep(10_000_000)  # device work the event comes after
        event = fence()
    event.synchronize()
    assert event.query()


async def edit_beside_speech(engine: AsyncEngine) -> np.ndarray:
    """A tiny edit's final image, painted while a speech stream runs on the same engine."""
    from image_helpers import picture

    from omni_stream.images.spec import ImageRequest

    edit = ImageRequest("snow", images=(picture(),), size=(64, 48), seed=3, rewrite=False)
    talk = SpeechRequest("Hello there.", voice="ryan", sampling=GREEDY, max_new_tokens=24, seed=3)
    said: list[int] = []

    async def say() -> None:
        async with engine.speech(talk) as stream:
            said.append(sum([a.samples.size async for a in stream]))

    async with anyio.create_task_group() as tg:
        tg.start_soon(say)
        async with engine.generate(edit) as stream:
            images = [o.chunk for o in [o async for o in stream] if o.stage == "image" and not o.chunk.partial]
    assert said and said[0] > 0 and len(images) == 1
    return images[0].pixels


@NEEDS_DIFFUSERS
async def test_an_image_beside_speech_with_both_switches_is_the_image_alone(tmp_path, pix2pix_checkpoint):
    speech = write_tiny_checkpoint(tmp_path, "custom_voice", "0.6b", seed=1)
    images = []
    for on in (False, True):
        tuning = Tuning(realtime_priority=on, throughput_fence=on)
        engine = await AsyncEngine.from_pretrained(
            [speech, pix2pix_checkpoint], device="cuda", progress=False, tuning=tuning
        )
        async with engine:
            assert (engine.worker._throughput_fence is not None) is on
            images.append(await edit_beside_speech(engine))
    np.testing.assert_allclose(images[0].astype(int), images[1].astype(int), atol=2)
