"""One device worker, many models: speech beside image edits and video sessions on the real tiny families.

Proved by the worker's log (``record=True``: every job, batch and step in the order it ran, with its time) and the
families' step logs, never by timing: a speech step runs between two denoising steps of a running image; a stream
whose first audio is due is stepped before throughput work; throughput work still progresses under a speech load
that never spares it a step (the fairness bound); video sessions of one size share one transformer call per step
and give the frames each gives alone; an image request waits for capacity in the ``image`` waiting gauge while
live speech cannot spare a step; random aborts across every kind leave no state.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("diffusers")

from image_helpers import call_hooks, calls_of, picture

from omni_stream.device_policy import DevicePolicy, WorkClass
from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.errors import RequestCancelled
from omni_stream.family import ModelKind
from omni_stream.images.spec import ImageRequest
from omni_stream.requests import ChatMessage, Role, SpeechRequest, TextRequest
from omni_stream.video.spec import VideoRequest

pytest_plugins = ("image_fixtures", "video_fixtures")


@pytest.fixture(scope="module")
def speech_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from omni_stream.models.qwen3_tts.checkpoint import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tts"), "custom_voice", "0.6b", seed=1)


@pytest.fixture(scope="module")
def text_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from omni_stream.models.causal_lm.checkpoint import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("lm") / "lm")


async def load(policy: DevicePolicy, **paths: Path) -> AsyncEngine:
    sources = {kind: ModelSource(path, kind=kind) for kind, path in paths.items()}
    return await AsyncEngine.load(sources, progress=False, device_policy=policy, record=True)


async def until(condition, what: str) -> None:
    deadline = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def wait_on_device(condition, what: str) -> None:
    """On the device thread (inside a step hook): wait until the event loop made ``condition`` true."""
    deadline = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


async def speak(engine: AsyncEngine, frames: int = 20):
    request = SpeechRequest("Hello there, how are you?", max_new_tokens=frames, ignore_eos=True)  # exactly `frames`
    async with engine.speech(request) as stream:
        async for _ in stream:
            pass
    return stream.timings


async def paint(engine: AsyncEngine, request: ImageRequest) -> list:
    async with engine.generate(request) as stream:
        return [out.chunk async for out in stream]


def records(engine: AsyncEngine, kind: str, name: str) -> list:
    return [r for r in engine.worker.log if r.kind == kind and r.name == name]


def queued(scheduler) -> bool:
    live = scheduler.live()
    return bool(live["waiting"] or live["arriving"] or live["running"])


async def test_a_speech_request_is_stepped_between_two_denoising_steps_and_its_first_audio_comes_first(
    speech_checkpoint, pix2pix_checkpoint
):
    policy = DevicePolicy(max_wait=600.0)  # no forced step: the order below is the deadlines' alone
    async with await load(policy, speech=speech_checkpoint, image=pix2pix_checkpoint) as engine:
        image = engine.models.get(ModelKind.IMAGE)
        talker = engine.models.speech().scheduler
        loop = asyncio.get_running_loop()
        request = ImageRequest("make it snowy", images=(picture(),), steps=6, seed=1)
        spoken: list = []

        def on_call(kind, labels):  # after the image's second step, a speech request arrives
            if kind == "denoise" and calls_of(image, request.request_id) == 2 and not spoken:
                spoken.append(asyncio.run_coroutine_threadsafe(speak(engine), loop))
                wait_on_device(lambda: queued(talker), "the speech request to queue")

        call_hooks(image).append(on_call)
        painted = await paint(engine, request)
        timings = await asyncio.wrap_future(spoken[0])
    assert not painted[-1].partial and painted[-1].pixels.shape == (64, 64, 3)
    denoise = records(engine, "denoise", "image")
    assert len(denoise) == 6
    between = [r for r in engine.worker.log if denoise[1].seq < r.seq < denoise[2].seq]
    assert any(r.kind == "step" and r.name == "talker" for r in between)  # realtime steps between two denoising
    assert any(r.kind == "batch" for r in between)  # ... and the codec's windows
    # Its first audio was due at once (nothing played yet): no denoising step ran before it was delivered.
    assert timings.first_chunk is not None and timings.first_chunk < denoise[2].at
    steps = [r for r in engine.worker.log if r.kind == "step" and r.name == "image"]
    assert {r.detail for r in steps if r.work_class is WorkClass.THROUGHPUT} == {("spare",)}  # none was forced


async def test_a_speech_request_that_arrives_during_a_denoising_step_runs_between_the_unets_blocks(
    speech_checkpoint, pix2pix_checkpoint
):
    policy = DevicePolicy(max_wait=600.0)
    async with await load(policy, speech=speech_checkpoint, image=pix2pix_checkpoint) as engine:
        image = engine.models.get(ModelKind.IMAGE)
        talker = engine.models.speech().scheduler
        loop = asyncio.get_running_loop()
        request = ImageRequest("make it snowy", images=(picture(),), steps=4, seed=1)
        spoken: list = []

        def first_block(module, args):  # inside the image's second step: a speech request arrives
            if calls_of(image, request.request_id) == 2 and not spoken:
                spoken.append(asyncio.run_coroutine_threadsafe(speak(engine), loop))
                wait_on_device(lambda: queued(talker), "the speech request to queue")

        hook = image.pipe.unet.down_blocks[0].register_forward_pre_hook(first_block)
        try:
            await paint(engine, request)
            await asyncio.wrap_future(spoken[0])
        finally:
            hook.remove()
    log = list(engine.worker.log)
    second = records(engine, "denoise", "image")[1]
    after = [r for r in log if r.seq > second.seq]
    step_end = next(r.seq for r in after if r.kind == "step" and r.name == "image")  # the image's next step
    inside = [r for r in after if r.seq < step_end]
    # the talker's newcomer ran at a yield point of that UNet call, before the call (and so the step) ended
    assert any(r.kind == "yield" for r in inside)
    assert any(r.kind == "step" and r.name == "talker" for r in inside)
    # ... and the log says when the image's step went on after it (work_profile counts that time the image's again)
    talker = next(r.seq for r in inside if r.kind == "step" and r.name == "talker")
    assert any(r.kind == "resume" and r.name == "image" and r.seq > talker for r in inside)


async def test_a_speech_request_that_arrives_while_a_video_session_joins_runs_between_its_text_encoders_layers(
    speech_checkpoint, video_checkpoint
):
    # A session's join step encodes its prompt (umT5) before the transformer's first call: one of the longest
    # pieces between two realtime steps on a GPU. Speech due meanwhile runs between the encoder's layers.
    policy = DevicePolicy(max_wait=600.0)
    async with await load(policy, speech=speech_checkpoint, video=video_checkpoint) as engine:
        family = engine.models.get(ModelKind.VIDEO)
        talker = engine.models.speech().scheduler
        loop = asyncio.get_running_loop()
        spoken: list = []

        def first_layer(module, args):  # inside the session's join: a speech request arrives
            if not spoken:
                spoken.append(asyncio.run_coroutine_threadsafe(speak(engine), loop))
                wait_on_device(lambda: queued(talker), "the speech request to queue")

        request = VideoRequest("a kite", width=16, height=16, num_frames=33, num_inference_steps=2, seed=1)
        hook = family.runner.pipe.text_encoder.encoder.block[0].register_forward_pre_hook(first_layer)
        try:
            async with engine.generate(request) as stream:
                async for _ in stream:
                    pass
            await asyncio.wrap_future(spoken[0])
        finally:
            hook.remove()
    log = list(engine.worker.log)
    join = next(r for r in log if r.kind == "join" and r.name == "video")
    step_end = next(r.seq for r in log if r.seq > join.seq and r.kind == "step" and r.name == "video")
    inside = [r for r in log if join.seq < r.seq < step_end]
    denoise = [r for r in inside if r.kind == "denoise"]
    assert not denoise  # the join had not reached the transformer ...
    assert any(r.kind == "yield" for r in inside)  # ... when the text encoder's layer yielded
    assert any(r.kind == "step" and r.name == "talker" for r in inside)  # and the talker's newcomer ran there


async def test_an_image_edits_text_encoder_yields_between_its_layers_as_its_unet_does(pix2pix_checkpoint):
    async with await load(DevicePolicy(), image=pix2pix_checkpoint) as engine:
        pipe = engine.models.get(ModelKind.IMAGE).pipe
        layers = pipe.text_encoder.encoder.layers  # transformers 5: CLIPTextModel holds the encoder
        assert all(layer._forward_pre_hooks for layer in layers)  # the yield point before each of its layers
        assert all(block._forward_pre_hooks for block in pipe.unet.down_blocks)


async def test_throughput_work_progresses_under_a_speech_load_that_never_spares_a_step(
    speech_checkpoint, pix2pix_checkpoint
):
    # No stream can keep a margin this large, so realtime work never spares a step: only the bound runs one.
    policy = DevicePolicy(max_wait=0.2, margin=1e6)
    async with await load(policy, speech=speech_checkpoint, image=pix2pix_checkpoint) as engine:
        talker = engine.models.speech().scheduler
        speakers = [asyncio.create_task(speak(engine, frames=4000)) for _ in range(4)]
        await until(lambda: talker.live()["running"] == 4, "four streams speaking")
        painted = await paint(engine, ImageRequest("make it snowy", images=(picture(),), steps=4, seed=1))
        still_speaking = talker.live()["running"]
        for task in speakers:
            task.cancel()
        await asyncio.gather(*speakers, return_exceptions=True)
    assert not painted[-1].partial and still_speaking == 4  # the image finished while every stream spoke
    steps = [
        r
        for r in engine.worker.log
        if r.kind == "step" and r.name == "image" and r.work_class is WorkClass.THROUGHPUT  # not a release alone
    ]
    assert len(steps) >= 6 and all(r.detail == ("overdue",) for r in steps)  # join, 4 steps, decode
    talker_steps = [r.seq for r in engine.worker.log if r.kind == "step" and r.name == "talker"]
    for a, b in itertools.pairwise(steps):
        assert b.at - a.at >= 0.2 * 0.99  # each waited the bound ...
        assert any(a.seq < t < b.seq for t in talker_steps)  # ... while speech kept its steps


async def test_an_image_waits_for_capacity_in_the_waiting_gauge_while_speech_cannot_spare_a_step(
    speech_checkpoint, pix2pix_checkpoint
):
    policy = DevicePolicy(max_wait=0.05, margin=1e6)  # live speech never has room for another image's share
    async with await load(policy, speech=speech_checkpoint, image=pix2pix_checkpoint) as engine:
        image = engine.models.get(ModelKind.IMAGE)
        talker = engine.models.speech().scheduler
        registry = engine.metrics.registry

        def gauge(name: str) -> float | None:
            return registry.get_sample_value(f"omni_stream_requests_{name}", {"scheduler": "image"})

        speaker = asyncio.create_task(speak(engine, frames=4000))
        await until(lambda: talker.live()["running"] == 1, "a stream speaking")
        first = asyncio.create_task(paint(engine, ImageRequest("a", images=(picture(),), steps=30, seed=1)))
        await until(lambda: gauge("running") == 1, "the first image running")
        second = asyncio.create_task(paint(engine, ImageRequest("b", images=(picture(),), steps=2, seed=2)))
        await until(lambda: gauge("waiting") == 1, "the second image queued")
        assert image.scheduler.live()["running"] == 1  # nothing of it runs: it waits for capacity
        speaker.cancel()
        await asyncio.gather(speaker, return_exceptions=True)
        assert not (await second)[-1].partial  # no live speech: admitted
        await first
        await until(lambda: gauge("waiting") == 0 and gauge("running") == 0, "the gauges to settle")


async def test_video_sessions_of_one_size_share_each_step_and_give_the_frames_each_gives_alone(video_checkpoint):
    async with await load(DevicePolicy(), video=video_checkpoint) as engine:
        family = engine.models.get(ModelKind.VIDEO)

        def session(prompt: str, seed: int, size: int = 32) -> VideoRequest:
            return VideoRequest(prompt, width=size, height=size, num_frames=66, num_inference_steps=2, seed=seed)

        async def frames(request: VideoRequest) -> list[np.ndarray]:
            async with engine.generate(request) as stream:
                return [out.chunk.frames async for out in stream]

        requests = [session("a kite", 1), session("a red boat at dawn", 2), session("rain", 3), session("x", 4, 16)]
        gate = threading.Event()
        blocker = engine.worker.submit(gate.wait, 30)  # every session queues before the first step
        tasks = [asyncio.create_task(frames(r)) for r in requests]
        await until(lambda: family.scheduler.live()["waiting"] == 4, "four sessions queued")
        gate.set()
        await blocker
        together = await asyncio.gather(*tasks)
        events = family.runner.model.log.events()
        alone = [await frames(session(r.prompt, r.seed, r.width)) for r in requests]
    same_size = {f"{r.request_id}/{k}" for r in requests[:3] for k in (0, 1)}
    calls = [set(e.labels) for e in events if e.kind == "denoise"]
    # one transformer call per denoising step for the three 32 px sessions (chunk 0, then chunk 1), the 16 px one
    # in calls of its own
    assert sum(1 for c in calls if len(c) == 3 and c <= same_size) == 4
    assert all(len(c) == 1 for c in calls if any(label.startswith(requests[3].request_id) for label in c))
    for batched, single in zip(together, alone, strict=True):
        assert len(batched) == len(single) == 2
        for a, b in zip(batched, single, strict=True):
            assert np.abs(a.astype(int) - b.astype(int)).max() <= 1  # float rounding at most


@pytest.mark.parametrize("lead", [0.0, 0.05], ids=["default", "virtual-time-rule"])
async def test_random_aborts_across_every_kind_leave_no_state(
    lead, speech_checkpoint, text_checkpoint, pix2pix_checkpoint, video_checkpoint
):
    """Also with the virtual-time rule on (``lead``: realtime models far ahead sit rounds out)."""
    rng = random.Random(32)
    paths = dict(speech=speech_checkpoint, text=text_checkpoint, image=pix2pix_checkpoint, video=video_checkpoint)
    async with await load(DevicePolicy(max_wait=0.05, lead=lead), **paths) as engine:
        image, video = engine.models.get(ModelKind.IMAGE), engine.models.get(ModelKind.VIDEO)

        def request(i: int):
            kind = rng.choice(["speech", "text", "image", "video"])
            if kind == "speech":
                return engine.speech(SpeechRequest(f"Sentence {i}.", max_new_tokens=rng.randrange(4, 40)))
            if kind == "text":
                messages = (ChatMessage(Role.USER, f"say {i}"),)
                return engine.chat(TextRequest(messages=messages, max_tokens=rng.randrange(2, 30)))
            if kind == "image":
                steps, previews = rng.randrange(1, 6), rng.randrange(0, 3)
                return engine.generate(
                    ImageRequest(f"p{i}", images=(picture(seed=i),), steps=steps, partial_images=previews, seed=i)
                )
            return engine.generate(VideoRequest(f"v{i}", width=16, height=16, num_frames=66, num_inference_steps=2))

        async def one(i: int) -> None:
            stream = request(i)
            stop, how = rng.randrange(0, 8), rng.randrange(3)
            if how == 0:  # the consumer leaves after some outputs
                async with stream:
                    n = 0
                    async for _ in stream:
                        n += 1
                        if n > stop:
                            break
            elif how == 1:  # aborted from elsewhere
                async with stream:
                    n = 0
                    async for _ in stream:
                        n += 1
                        if n > stop:
                            stream.abort(RequestCancelled("aborted by the test"))
            else:  # the consumer task is cancelled

                async def drain() -> None:
                    async with stream:
                        async for _ in stream:
                            pass

                task = asyncio.create_task(drain())
                for _ in range(stop * 50):
                    await asyncio.sleep(0)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

        for group in range(6):
            results = await asyncio.gather(*(one(6 * group + i) for i in range(6)), return_exceptions=True)
            assert all(r is None or isinstance(r, RequestCancelled) for r in results), results

        schedulers = [engine.models.speech().scheduler, engine.models.text().scheduler]

        def clean() -> bool:
            held = [s.live() for s in schedulers] + [image.live(), video.live()]
            return not any(v for live in held for v in live.values())

        await until(clean, "no per-request state in any model")
        assert await engine.worker.submit(lambda: "idle") == "idle"
        for log in (image.runner.log, video.runner.model.log):
            for event in log.events():
                if event.kind == "release":
                    after = [e for e in log.of(event.labels[0]) if e.seq > event.seq]
                    assert not after, after  # no step of a request after its release
