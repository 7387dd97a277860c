"""The Helios family on a tiny random diffusers checkpoint: chunk-by-chunk equals one whole call, streaming order,
prompt steering, cancellation between and inside chunks, loading."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers", reason="needs the [video] extra (diffusers)")

from video_helpers import chunks_begun, settled, steps_after_release

from omni_stream.engine import AsyncEngine
from omni_stream.errors import ConfigError, InvalidRequestError, RequestCancelled
from omni_stream.family import read_config
from omni_stream.family_registry import embedded_checkpoint
from omni_stream.models.helios.checkpoint import (
    embedded_default_checkpoint,
    load_pipeline,
)
from omni_stream.models.helios.runner import HeliosRunner
from omni_stream.runtime.cache import EMBEDDED_MARKER
from omni_stream.video.spec import ChunkPrompt, PromptSteering, PromptUpdate, VideoRequest

pytest_plugins = ("video_fixtures",)

S = 32  # frame size of most tests (pixels)


@pytest.fixture
async def engine(video_checkpoint):
    async with await AsyncEngine.from_pretrained(video_checkpoint, progress=False) as engine:
        yield engine


def to_uint8(video: torch.Tensor) -> np.ndarray:
    return (video[0].permute(0, 2, 3, 1) * 255).round().clamp(0, 255).to(torch.uint8).numpy()


@pytest.mark.parametrize(
    ("guidance", "negative", "with_image"),
    [(1.0, None, False), (3.0, "blurry", False), (1.0, None, True)],
    ids=["text", "guided", "image"],
)
def test_chunk_by_chunk_generation_equals_one_whole_pipeline_call(video_checkpoint, guidance, negative, with_image):
    from PIL import Image

    pipe = load_pipeline(video_checkpoint, "cpu", torch.float32, progress=False)
    runner = HeliosRunner(pipe, "cpu", max_sequence_length=64)
    image = np.random.default_rng(1).integers(0, 255, (S, S, 3), dtype=np.uint8) if with_image else None
    state = runner.new_state("r", width=S, height=S, steps=2, guidance=guidance, seed=7, negative_prompt=negative,
                             image=image)  # fmt: skip
    prompt = ChunkPrompt((("a kite over a hill", 1.0),))
    chunks = [runner.generate_chunk(state, prompt, 33).frames for _ in range(3)]
    whole = pipe(
        prompt="a kite over a hill", negative_prompt=negative, height=S, width=S, num_frames=99, num_inference_steps=2,
        guidance_scale=guidance, generator=torch.Generator().manual_seed(7), output_type="pt", max_sequence_length=64,
        image=Image.fromarray(image) if with_image else None,
    ).frames  # fmt: skip
    expected = to_uint8(whole)
    streamed = np.concatenate(chunks)[: len(expected)]
    assert len(expected) == 97  # the pipeline cuts 99 frames to 4k + 1
    assert np.abs(streamed.astype(int) - expected.astype(int)).max() <= 1  # float rounding at most
    assert state.history.shape[2] == 19  # only the window the next chunk reads is kept


async def test_the_engine_yields_each_chunk_before_the_chunk_after_next_begins(engine):
    family = engine.models.get("video")
    request = VideoRequest("a cat", width=S, height=S, num_frames=4 * 33 - 10, num_inference_steps=1, seed=1)
    chunks = []
    async with engine.generate(request) as stream:
        async for out in stream:
            chunks.append(out.chunk)
            # the stage starts chunk k + 2 only after chunk k + 1 was taken: event order, not timing
            assert chunks_begun(family.step_log, request.request_id) <= out.chunk.index + 2
    assert [c.index for c in chunks] == [0, 1, 2, 3] and [c.final for c in chunks] == [False] * 3 + [True]
    assert [c.num_frames for c in chunks] == [33, 33, 33, 23]
    assert [c.start_frame for c in chunks] == [0, 33, 66, 99] and chunks[1].pts == 33 / 16
    assert all(c.frames.shape[1:] == (S, S, 3) and c.frames.dtype == np.uint8 for c in chunks)
    assert stream.usage["video"].output_tokens == 122 and stream.usage["video"].input_tokens > 0
    await settled(family)


async def collect(engine, request, update_at: int | None = None, update: PromptUpdate | None = None):
    """Chunks of ``request``; ``update`` is offered as soon as chunk ``update_at`` arrives."""
    chunks = []
    async with engine.generate(request) as stream:
        async for out in stream:
            chunks.append(out.chunk)
            if out.chunk.index == update_at:
                assert request.steering.offer(update)
    return chunks


async def test_a_prompt_update_changes_the_prompt_the_next_chunk_is_generated_with(engine):
    base = dict(width=S, height=S, num_frames=5 * 33, num_inference_steps=1, seed=3)
    plain = await collect(engine, VideoRequest("a cat", **base))
    steered = await collect(engine, VideoRequest("a cat", **base), 0, PromptUpdate("ui-1", "a red dog"))
    first_new = next(c.index for c in steered if c.prompt.started == ("ui-1",))
    # The stage reads updates when it submits a chunk: when chunk 0 arrived, chunk 1 may have been submitted already,
    # chunk 2 cannot have been (it waits until chunk 1 is taken). So the update applies from chunk 1 or 2 on.
    assert first_new in (1, 2)
    for c in steered:
        if c.index < first_new:  # the old prompt, the very same frames as without the update
            assert c.prompt.mix == (("a cat", 1.0),) and np.array_equal(c.frames, plain[c.index].frames)
        else:
            assert c.prompt.mix == (("a red dog", 1.0),)
    assert steered[first_new].prompt.completed == ("ui-1",)
    assert not np.array_equal(steered[first_new].frames, plain[first_new].frames)  # the embeddings really changed


async def test_a_video_request_that_has_run_is_refused_again_naming_its_closed_steering(engine):
    request = VideoRequest("a cat", width=S, height=S, num_frames=33, num_inference_steps=1, seed=3)
    await collect(engine, request)
    with pytest.raises(InvalidRequestError) as refused:  # its updates would be refused without a word
        engine.generate(request)
    assert refused.value.param == "steering"
    again = replace(request, steering=PromptSteering())
    assert len(await collect(engine, again)) == 1


async def test_a_transition_blends_over_the_chunks_it_names(engine):
    request = VideoRequest("a cat", width=16, height=16, num_frames=5 * 33, num_inference_steps=1, seed=3)
    chunks = await collect(engine, request, 0, PromptUpdate("ui-2", "a dog", transition_chunks=2))
    weights = [dict(c.prompt.mix).get("a dog", 0.0) for c in chunks]
    start = weights.index(0.5)
    assert weights[:start] == [0.0] * start and weights[start:] == [0.5] + [1.0] * (len(weights) - start - 1)


async def abort_inside_a_chunk(engine, request, chunk: int, passes: int) -> list:
    """Run ``request`` and abort it from inside the worker after its ``passes``-th model call (a denoising step or
    the decode) of chunk ``chunk``."""
    family = engine.models.get("video")
    loop = asyncio.get_running_loop()
    seen = {"n": 0}
    stream = engine.generate(request)
    label = f"{request.request_id}/{chunk}"

    def on_call(kind, labels):
        if label not in labels:
            return
        seen["n"] += 1
        if seen["n"] == passes:  # the loop releases the request now, between two of its calls
            asyncio.run_coroutine_threadsafe(_abort(stream), loop).result(timeout=10)

    hooks = _call_hooks(family)
    hooks.append(on_call)
    got = []
    try:
        with pytest.raises(RequestCancelled):
            async for out in stream:
                got.append(out.chunk)
    finally:
        hooks.remove(on_call)
        await stream.aclose()
    return got


def _call_hooks(family) -> list:
    """The model's ``on_call`` as a list of hooks (several requests of one test watch their own calls)."""
    model = family.runner.model
    if model.on_call is None:
        hooks: list = []
        model.on_call = lambda kind, labels: [hook(kind, labels) for hook in list(hooks)]
        model.on_call.hooks = hooks
    return model.on_call.hooks


async def _abort(stream) -> None:
    stream.abort(RequestCancelled("stopped by the test"))


async def test_a_stop_inside_a_denoising_loop_runs_no_further_step(engine):
    family = engine.models.get("video")
    request = VideoRequest("a cat", width=S, height=S, num_frames=99, num_inference_steps=6, seed=2)
    got = await abort_inside_a_chunk(engine, request, chunk=1, passes=3)
    assert [c.index for c in got] == [0]
    assert steps_after_release(family.step_log, request.request_id) == []
    denoise_1 = [e for e in family.step_log.of(request.request_id) if e.kind == "denoise" and e.chunk == 1]
    assert len(denoise_1) == 3  # 6 were due: the released request stopped between steps
    await settled(family)


async def test_random_aborts_leave_no_state(engine):
    family = engine.models.get("video")
    rng = random.Random(1234)
    requests = []

    async def one(i: int) -> None:
        request = VideoRequest(f"prompt {i}", width=16, height=16, num_frames=3 * 33, num_inference_steps=2, seed=i)
        requests.append(request)
        where = rng.choice(["before", "between", "inside"])
        if where == "before":
            stream = engine.generate(request)
            stream.abort()
            await stream.aclose()
        elif where == "between":
            after = rng.randrange(3)
            async with engine.generate(request) as stream:
                async for out in stream:
                    if out.chunk.index == after:
                        break
        else:
            await abort_inside_a_chunk(engine, request, chunk=rng.randrange(3), passes=rng.randrange(1, 4))

    for group in range(6):
        await asyncio.gather(*(one(5 * group + i) for i in range(5)))
    assert len(requests) == 30
    await settled(family)
    for request in requests:
        assert steps_after_release(family.step_log, request.request_id) == []
    assert await engine.worker.submit(lambda: "idle") == "idle"  # nothing of them is left queued on the device
    # and the model still works
    async with engine.generate(VideoRequest("after", width=16, height=16, num_frames=33, seed=1)) as stream:
        assert [out.chunk.num_frames async for out in stream] == [33]


async def test_requests_the_model_cannot_serve_fail_before_streaming(engine):
    with pytest.raises(InvalidRequestError) as info:
        engine.generate(VideoRequest("a cat", width=40))
    assert info.value.param == "width"
    with pytest.raises(InvalidRequestError):
        engine.generate(VideoRequest("a cat", num_frames=10_000))


async def test_dummy_weights_load_at_the_configured_sizes(video_checkpoint, tmp_path):
    configs = tmp_path / "configs"
    shutil.copytree(video_checkpoint, configs, ignore=shutil.ignore_patterns("*.safetensors", "tokenizer"))
    assert not list(configs.rglob("*.safetensors"))
    with pytest.raises(ConfigError):
        await AsyncEngine.from_pretrained(configs, progress=False)  # real weights are missing
    async with await AsyncEngine.from_pretrained(configs, load_format="dummy", progress=False) as engine:
        family = engine.models.get("video")
        assert family.runner.pipe.transformer.config.num_layers == 2
        request = VideoRequest("a cat", width=16, height=16, num_frames=40, num_inference_steps=1)
        assert [out.chunk.num_frames async for out in engine.generate(request)] == [33, 7]


def test_a_diffusers_directory_names_its_pipeline_as_model_type(video_checkpoint, tmp_path):
    config = read_config(video_checkpoint)
    assert config["model_type"] == "HeliosPipeline" and config["transformer"] == [
        "diffusers",
        "HeliosTransformer3DModel",
    ]
    (tmp_path / "model_index.json").write_text(json.dumps({"vae": ["diffusers", "AutoencoderKLWan"]}))
    with pytest.raises(ConfigError, match="_class_name"):
        read_config(tmp_path)


def test_make_checkpoint_writes_a_tiny_video_model_offline(tmp_path, capsys):
    from omni_stream.cli import main

    out = tmp_path / "tiny-video"
    assert main(["make-checkpoint", "--tiny", "--kind", "video", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert read_config(out)["model_type"] == "HeliosPipeline"
    assert {p.name for p in out.iterdir()} >= {"model_index.json", "transformer", "vae", "text_encoder", "tokenizer",
                                               "scheduler", "video_defaults.json"}  # fmt: skip


def test_the_embedded_default_is_built_once_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNI_STREAM_CACHE", str(tmp_path))
    path = embedded_checkpoint("video")
    assert path == tmp_path / "checkpoints" / "helios-tiny-v1" and (path / EMBEDDED_MARKER).exists()
    stamp = (path / "model_index.json").stat().st_mtime_ns
    assert embedded_default_checkpoint(tmp_path) == path and (path / "model_index.json").stat().st_mtime_ns == stamp
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]  # no temp leftovers


def test_the_embedded_default_serves_video_beside_speech(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNI_STREAM_CACHE", str(tmp_path))
    from omni_stream.family_registry import default_kinds

    assert "video" in default_kinds() and "speech" in default_kinds()

    async def main() -> list:
        from omni_stream.engine import ModelSource

        async with await AsyncEngine.load({"video": ModelSource(kind="video")}, progress=False) as engine:
            info = engine.models.get("video").info
            return [info.model_name, info.default_width, info.frames_per_chunk]

    assert asyncio.run(main()) == ["helios-tiny-v1", 64, 33]
