"""The image pipeline on the engine: AR rewrite -> diffusion on real (tiny, random) diffusers pipelines.

Order of outputs, the rewritten prompt reaching the diffusion, previews, batching by step (requests of one size
share each denoiser call, a request joins a running batch at the next step and paints what it paints alone),
cancellation between steps (the step log), random aborts, masks, the three pipeline classes (InstructPix2Pix,
Stable Diffusion, Qwen-Image-Edit), dummy weights and the embedded default.

The rewriting text model is the synthetic echo LM (``tests/synthetic``): the test that the diffusion paints from the
rewritten prompt compares it with a request given that exact prompt, which no random model writes; the routes run
the tiny Qwen3 there (``test_image_serving.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from image_helpers import REWRITE_PREFIX, call_hooks, calls_of, load_engine, picture

from omni_stream.errors import InvalidRequestError, RequestCancelled
from omni_stream.family import ModelKind
from omni_stream.images.spec import ImageInfo, ImageMode, ImageRequest, output_size, preview_steps
from omni_stream.pipeline_specs import MissingModelError

pytest_plugins = ("image_fixtures",)


async def collect(stream):
    async with stream:
        return [out async for out in stream]


def finals(outputs):
    return [o.chunk for o in outputs if o.stage == "image" and not o.chunk.partial]


async def until(condition, what: str, polls: int = 2000) -> None:
    """Poll ``condition()`` (state the device thread changes; at most ~10 s)."""
    for _ in range(polls):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


async def settle(family, lm=None) -> None:
    """Until the image family (and the text model) hold no per-request state."""

    def clean() -> bool:
        lm_live = lm.scheduler.live() if lm is not None else {}
        return not any(family.live().values()) and not any(lm_live.values())

    await until(clean, "no per-request state")


# --- pure policy ----------------------------------------------------------------------------------------------


PREVIEW_CASES = [(4, 2, (1, 3)), (4, 3, (1, 2, 3)), (20, 3, (1, 7, 14)), (20, 2, (1, 11)), (20, 1, (1,)),
                 (2, 2, (1,)), (1, 3, ()), (10, 0, ()), (3, 1, (1,))]  # fmt: skip


@pytest.mark.parametrize(("steps", "n", "expected"), PREVIEW_CASES)
def test_previews_start_after_the_first_step_and_never_come_after_the_last(steps, n, expected):
    assert preview_steps(steps, n) == expected


def test_auto_size_fits_the_input_to_the_model():
    info = ImageInfo(
        "m", "diffusers", ModelKind.IMAGE, modes=(ImageMode.EDIT,), size_multiple=16, min_side=16, max_side=512
    )
    assert output_size(info, ImageRequest("x", images=(picture(100, 50),))) == (96, 48)
    assert output_size(info, ImageRequest("x", images=(picture(1024, 768),))) == (512, 384)
    assert output_size(info, ImageRequest("x", size=(128, 64))) == (128, 64)
    assert output_size(info, ImageRequest("x")) == info.default_size


# --- the pipeline ---------------------------------------------------------------------------------------------


async def test_an_edit_streams_the_rewrite_then_previews_then_the_image(pix2pix_checkpoint, rewriting_lm):
    async with await load_engine(pix2pix_checkpoint, rewriting_lm) as engine:
        request = ImageRequest("make it snowy", images=(picture(),), size=(64, 48), partial_images=2, seed=3)
        stream = engine.generate(request)
        outputs = await collect(stream)
    stages = [o.stage for o in outputs]
    n_text = stages.count("text")
    assert n_text >= 2 and stages == ["text"] * n_text + ["image"] * 3
    assert "".join(o.chunk.text for o in outputs[:n_text]) == f"{REWRITE_PREFIX} make it snowy"
    assert [o.last for o in outputs] == [False] * (n_text - 1) + [True, False, False, True]
    previews, final = [o.chunk for o in outputs[n_text:-1]], outputs[-1].chunk
    assert all(p.partial and p.pixels.shape == (48, 64, 3) and p.pixels.dtype == np.uint8 for p in previews)
    assert [p.meta["step"] for p in previews] == ["1", "3"]  # 4 steps, 2 previews
    assert not final.partial and final.pixels.shape == (48, 64, 3)
    usage = stream.usage
    assert usage[ModelKind.TEXT].output_tokens == n_text and usage[ModelKind.IMAGE].output_tokens == 8 * 6
    assert usage["image_input"].input_tokens == 8 * 6 and usage[ModelKind.IMAGE].input_tokens > 0


async def test_a_preview_shows_the_schedulers_estimate_of_the_finished_picture(pix2pix_checkpoint, monkeypatch):
    # observed, not replaced: what the request's scheduler estimated, and what the preview decoder was given
    import torch

    from omni_stream.models.diffusers_image.denoised import Denoised
    from omni_stream.models.diffusers_image.preview import PreviewDecoder

    estimates, shown = [], []
    latest, decode = Denoised.latest, PreviewDecoder.decode

    def observed_latest(self):
        estimates.append(latest(self))
        return estimates[-1]

    def observed_decode(self, latents, width, height):
        shown.append(latents)
        return decode(self, latents, width, height)

    monkeypatch.setattr(Denoised, "latest", observed_latest)
    monkeypatch.setattr(PreviewDecoder, "decode", observed_decode)
    request = ImageRequest("make it snowy", images=(picture(),), steps=4, n=2, partial_images=1, seed=1)
    async with await load_engine(pix2pix_checkpoint) as engine:
        outputs = await collect(engine.generate(request))
    assert [(o.chunk.partial, o.chunk.meta.get("step")) for o in outputs] == [(True, "1"), (False, None), (False, None)]
    (estimate,), (latents,) = estimates, shown  # one preview, after the first step
    assert estimate is not None and estimate.shape[0] == 2  # the request's two images' estimate (Euler ancestral's)
    assert torch.equal(latents, estimate[:1])  # the first image's


async def test_the_diffusion_paints_from_the_rewritten_prompt(pix2pix_checkpoint, rewriting_lm):
    image = picture(seed=5)
    async with await load_engine(pix2pix_checkpoint, rewriting_lm) as engine:
        rewritten = finals(await collect(engine.generate(ImageRequest("make it snowy", images=(image,), seed=7))))
        direct = ImageRequest(f"{REWRITE_PREFIX} make it snowy", images=(image,), seed=7, rewrite=False)
        same = finals(await collect(engine.generate(direct)))
        other = ImageRequest("make it snowy", images=(image,), seed=7, rewrite=False)
        unrewritten = finals(await collect(engine.generate(other)))
    assert np.array_equal(rewritten[0].pixels, same[0].pixels)
    assert not np.array_equal(rewritten[0].pixels, unrewritten[0].pixels)


async def test_without_a_text_model_the_diffusion_runs_alone(pix2pix_checkpoint):
    async with await load_engine(pix2pix_checkpoint) as engine:
        outputs = await collect(engine.generate(ImageRequest("make it snowy", images=(picture(),), n=2, seed=1)))
        with pytest.raises(MissingModelError) as info:
            engine.generate(ImageRequest("x", images=(picture(),), rewrite=True))
    assert info.value.param == "model"
    assert [o.stage for o in outputs] == ["image", "image"]
    assert [(o.chunk.index, o.chunk.count, o.last) for o in outputs] == [(0, 2, False), (1, 2, True)]
    assert not np.array_equal(outputs[0].chunk.pixels, outputs[1].chunk.pixels)  # seed and seed + 1


async def test_requests_of_one_size_share_every_model_call(pix2pix_checkpoint):
    async with await load_engine(pix2pix_checkpoint) as engine:
        family = engine.models.get(ModelKind.IMAGE)
        requests = [ImageRequest("make it snowy", images=(picture(seed=s),), seed=s) for s in (1, 2, 3)]
        requests.append(ImageRequest("make it snowy", images=(picture(),), steps=3, seed=4))  # fewer steps
        gate = threading.Event()
        blocker = engine.worker.submit(gate.wait, 30)  # hold the worker until all four are queued
        tasks = [asyncio.create_task(collect(engine.generate(r))) for r in requests]
        await queued(family, 4, gate)
        await blocker
        batched = [finals(outputs)[0].pixels for outputs in await asyncio.gather(*tasks)]
        ids = [r.request_id for r in requests]
        events = family.runner.log.events()
        # as they start (one join step): one call for all four prompts, one for the negative ones, one for the inputs
        assert sorted(e.labels[0] for e in events[:4] if e.kind == "join") == sorted(ids)  # in any order
        assert [(e.kind, sorted(e.labels)) for e in events[4:7]] == [
            ("text", sorted(ids)), ("text", sorted(ids)), ("encode", sorted(ids))
        ]  # fmt: skip
        denoise = [sorted(e.labels) for e in events if e.kind == "denoise"]
        # one denoiser call per step for all of them (per-row timesteps), the 3-step one leaving after its third
        assert denoise == [sorted(ids)] * 3 + [sorted(ids[:3])]
        alone = [finals(await collect(engine.generate(r.__class__(**_fields(r)))))[0].pixels for r in requests]
    for one, many in zip(alone, batched, strict=True):
        assert np.abs(one.astype(int) - many.astype(int)).max() <= 1  # the same image (float rounding at most)


def _fields(request):
    return {f: getattr(request, f) for f in ("prompt", "images", "steps", "seed")}


async def queued(family, n: int, gate: threading.Event) -> None:
    """Open ``gate`` (a job holding the device thread) once ``n`` image requests are queued behind it."""
    await until(lambda: family.scheduler.live()["waiting"] >= n, f"{n} queued requests")
    gate.set()


async def test_a_request_joins_a_running_batch_at_the_next_step_and_paints_what_it_paints_alone(pix2pix_checkpoint):
    async with await load_engine(pix2pix_checkpoint) as engine:
        family = engine.models.get(ModelKind.IMAGE)
        first = ImageRequest("make it snowy", images=(picture(seed=1),), steps=8, seed=1)
        joiner = ImageRequest("paint it red", images=(picture(seed=2),), steps=4, partial_images=2, seed=2)
        loop = asyncio.get_running_loop()
        started: list[asyncio.Task] = []

        def on_call(kind, labels):  # after the first request's second step, the second one arrives
            if kind == "denoise" and calls_of(family, first.request_id) == 2 and not started:
                started.append(asyncio.run_coroutine_threadsafe(_start(engine, joiner), loop))
                deadline = time.monotonic() + 10
                while not family.scheduler.live()["waiting"]:  # the device thread waits until it is queued
                    assert time.monotonic() < deadline
                    time.sleep(0.005)

        call_hooks(family).append(on_call)
        first_out = await collect(engine.generate(first))
        joined_out = await asyncio.wrap_future(started[0])
        call_hooks(family).remove(on_call)
        events = family.runner.log.events()
        alone = await collect(engine.generate(ImageRequest(**_fields(joiner), partial_images=2)))
    denoise = [set(e.labels) for e in events if e.kind == "denoise"]
    both = {first.request_id, joiner.request_id}
    # steps 1-2 alone; the joiner's join step; then one call for both until the joiner's 4 steps are done
    assert denoise[:2] == [{first.request_id}] * 2 and denoise[2:6] == [both] * 4
    assert denoise[6:] == [{first.request_id}] * 2
    assert [o.chunk.partial for o in joined_out] == [True, True, False]
    for got, expected in zip(joined_out, alone, strict=True):
        # previews and image as alone (float rounding at most: the batched kernels sum in another order)
        assert np.abs(got.chunk.pixels.astype(int) - expected.chunk.pixels.astype(int)).max() <= 1
    assert finals(first_out)[0].pixels.shape == (64, 64, 3)


async def _start(engine, request):
    return await collect(engine.generate(request))


async def _cancel_at_step(engine, requests, victim, at_step, gate=None):
    """Start ``requests``; after the denoiser call that is ``victim``'s step ``at_step``, abort it while the device
    thread waits. With ``gate`` (a job holding the device thread), it opens once every request is queued."""
    family = engine.models.get(ModelKind.IMAGE)
    loop = asyncio.get_running_loop()
    reached, go = asyncio.Event(), threading.Event()

    def on_call(kind, labels):
        if kind == "denoise" and victim.request_id in labels and calls_of(family, victim.request_id) == at_step:
            loop.call_soon_threadsafe(reached.set)
            assert go.wait(10)

    call_hooks(family).append(on_call)
    streams = [engine.generate(r) for r in requests]
    tasks = [asyncio.create_task(collect(s)) for s in streams]
    if gate is not None:
        await queued(family, len(requests), gate)
    await reached.wait()
    assert engine.abort(victim.request_id)
    go.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    call_hooks(family).remove(on_call)
    return results


def _after_release(family, label):
    events = family.runner.log.of(label)
    kinds = [e.kind for e in events]
    assert "release" in kinds, kinds
    return [e.kind for e in events[kinds.index("release") + 1 :]]


async def test_a_cancelled_request_is_not_stepped_again(pix2pix_checkpoint):
    async with await load_engine(pix2pix_checkpoint) as engine:
        family = engine.models.get(ModelKind.IMAGE)
        victim = ImageRequest("make it snowy", images=(picture(),), steps=8, partial_images=3, seed=1)
        (result,) = await _cancel_at_step(engine, [victim], victim, at_step=2)
        await settle(family)  # the stream ends at once; the device thread frees it at its next step
    assert isinstance(result, RequestCancelled)
    started = ["join", "text", "text", "encode"]  # its prompt (and the negative one) and its input, as it starts
    assert [e.kind for e in family.runner.log.of(victim.request_id)] == [*started, "denoise", "denoise", "release"]


async def test_a_cancelled_request_leaves_its_batch_running(pix2pix_checkpoint):
    async with await load_engine(pix2pix_checkpoint) as engine:
        family = engine.models.get(ModelKind.IMAGE)
        gate = threading.Event()
        blocker = engine.worker.submit(gate.wait, 30)  # both requests queue, then run in one batch
        keep = ImageRequest("make it snowy", images=(picture(),), steps=6, seed=1)
        victim = ImageRequest("make it snowy", images=(picture(),), steps=6, seed=2)
        kept, cancelled = await _cancel_at_step(engine, [keep, victim], victim, at_step=2, gate=gate)
        await blocker
        await settle(family)
    assert isinstance(cancelled, RequestCancelled) and finals(kept)[0].pixels.shape == (64, 64, 3)
    denoise = [sorted(e.labels) for e in family.runner.log.events() if e.kind == "denoise"]
    assert denoise == [sorted((keep.request_id, victim.request_id))] * 2 + [[keep.request_id]] * 4
    assert _after_release(family, victim.request_id) == []


async def test_fifty_random_aborts_leave_no_state(pix2pix_checkpoint, rewriting_lm):
    rng = np.random.default_rng(0)
    async with await load_engine(pix2pix_checkpoint, rewriting_lm) as engine:
        family, lm = engine.models.get(ModelKind.IMAGE), engine.models.text()

        async def run(k: int) -> None:
            request = ImageRequest(
                "make it snowy please",
                images=(picture(seed=k),),
                steps=int(rng.integers(2, 7)),
                partial_images=int(rng.integers(0, 4)),
                n=int(rng.integers(1, 3)),
                seed=k,
            )
            stop_after, how = int(rng.integers(0, 12)), int(rng.integers(0, 3))
            stream = engine.generate(request)
            if how == 0:  # the consumer leaves after some outputs
                async with stream:
                    async for i, _ in _enumerate(stream):
                        if i >= stop_after:
                            break
            elif how == 1:  # aborted by id from elsewhere
                async with stream:
                    async for i, _ in _enumerate(stream):
                        if i >= stop_after:
                            engine.abort(request.request_id)
            else:  # the consumer task is cancelled
                task = asyncio.create_task(collect(stream))
                for _ in range(stop_after):
                    await asyncio.sleep(0)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

        for round_ in range(10):
            results = await asyncio.gather(*(run(round_ * 5 + j) for j in range(5)), return_exceptions=True)
            assert all(r is None or isinstance(r, RequestCancelled) for r in results), results
            await settle(family, lm)
            for event in family.runner.log.events():
                if event.kind == "release":
                    assert _after_release(family, event.labels[0]) == []


async def _enumerate(stream):
    i = 0
    async for item in stream:
        yield i, item
        i += 1


async def test_a_mask_keeps_the_opaque_part_of_the_input(pix2pix_checkpoint):
    image = picture(seed=9)
    mask = np.zeros((64, 64), np.float32)
    mask[:, :32] = 1.0  # the left half may change
    async with await load_engine(pix2pix_checkpoint) as engine:
        outputs = await collect(
            engine.generate(ImageRequest("x", images=(image,), mask=mask, partial_images=1, seed=1))
        )
    for out in outputs:
        assert np.array_equal(out.chunk.pixels[:, 32:], image[:, 32:])
        assert not np.array_equal(out.chunk.pixels[:, :32], image[:, :32])


async def test_invalid_requests_fail_before_anything_runs(pix2pix_checkpoint):
    async with await load_engine(pix2pix_checkpoint) as engine:
        family = engine.models.get(ModelKind.IMAGE)
        image = (picture(),)
        for request, param in [
            (ImageRequest("x", images=image, size=(60, 64)), "size"),
            (ImageRequest("x", images=image, size=(1024, 1024)), "size"),
            (ImageRequest("x", images=image, steps=500), "num_inference_steps"),
            (ImageRequest("a cat"), "image"),  # text to image on an edit model
            (ImageRequest("x", images=image * 2), "image"),
        ]:
            with pytest.raises(InvalidRequestError) as info:
                engine.generate(request)
            assert info.value.param == param
        assert not any(family.live().values())
    for fields, param in [
        ({"prompt": " "}, "prompt"),
        ({"n": 5}, "n"),
        ({"partial_images": 4}, "partial_images"),
        ({"images": (picture(),), "mask": np.zeros((3, 3), np.float32)}, "mask"),
        ({"images": (np.zeros((4, 4, 4), np.uint8),)}, "image"),
        ({"guidance_scale": float("nan")}, "guidance_scale"),
    ]:
        with pytest.raises(InvalidRequestError) as info:
            ImageRequest(**{"prompt": "x", **fields})
        assert info.value.param == param


# --- the other pipeline classes -------------------------------------------------------------------------------


@pytest.fixture
def qwen_small_condition(monkeypatch):
    """Qwen-Image-Edit resizes its condition image to a 1024x1024 area; a 128x128 one keeps CPU tests fast."""
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit as qe

    original = qe.calculate_dimensions
    monkeypatch.setattr(qe, "calculate_dimensions", lambda area, ratio: original(128 * 128, ratio))


async def test_qwen_image_edit_tiny_streams_previews_and_batches(qwen_edit_checkpoint, qwen_small_condition):
    async with await load_engine(qwen_edit_checkpoint) as engine:
        family = engine.models.get(ModelKind.IMAGE)
        assert (family.info.preview, family.info.size_multiple) == ("linear", 8)
        gate = threading.Event()
        blocker = engine.worker.submit(gate.wait, 30)
        requests = [
            ImageRequest("make it snowy", images=(picture(seed=s),), size=(64, 48), partial_images=2, seed=s)
            for s in (1, 2)
        ]
        tasks = [asyncio.create_task(collect(engine.generate(r))) for r in requests]
        await queued(family, 2, gate)
        await blocker
        results = await asyncio.gather(*tasks)
    ids = {r.request_id for r in requests}
    events = family.runner.log.events()
    # its transformer takes per-request lists: each request's step is its own call, one per step; decodes batch
    assert [len(e.labels) for e in events if e.kind == "denoise"] == [1] * 2 * 4
    assert [set(e.labels) for e in events if e.kind == "decode"] == [ids]
    for outputs in results:
        images = [o.chunk for o in outputs]
        assert [i.partial for i in images] == [True, True, False]
        assert all(i.pixels.shape == (48, 64, 3) for i in images)
    assert not np.array_equal(finals(results[0])[0].pixels, finals(results[1])[0].pixels)


async def test_stable_diffusion_paints_from_text_and_edits_as_img2img(sd_checkpoint):
    async with await load_engine(sd_checkpoint) as engine:
        family = engine.models.get(ModelKind.IMAGE)
        text_to_image = ImageRequest("a cat", size=(64, 32), partial_images=1, seed=1)
        edit = ImageRequest("a cat", images=(picture(),), steps=5, seed=1)
        generated = await collect(engine.generate(text_to_image))
        edited = await collect(engine.generate(edit))
    assert [(o.chunk.partial, o.chunk.pixels.shape) for o in generated] == [(True, (32, 64, 3)), (False, (32, 64, 3))]
    assert finals(edited)[0].pixels.shape == (64, 64, 3)
    assert calls_of(family, text_to_image.request_id) == 4
    assert calls_of(family, edit.request_id) == 4  # img2img at strength 0.8 runs 4 of 5 steps


# --- loading --------------------------------------------------------------------------------------------------


async def test_dummy_weights_load_from_the_component_configs_alone(pix2pix_checkpoint, tmp_path):
    configs = tmp_path / "configs"
    for path in pix2pix_checkpoint.rglob("*.json"):
        if "tokenizer" in path.parent.name or path.parent.name == "preview_decoder":
            continue
        target = configs / path.relative_to(pix2pix_checkpoint)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    (configs / "tokenizer").mkdir()
    assert not list(configs.rglob("*.safetensors"))
    async with await load_engine(configs, load_format="dummy") as engine:
        family = engine.models.get(ModelKind.IMAGE)
        outputs = await collect(engine.generate(ImageRequest("x", images=(picture(),), partial_images=1, seed=1)))
    assert family.info.preview == "linear"  # no tiny autoencoder: the fitted projection
    assert [o.chunk.pixels.shape for o in outputs] == [(64, 64, 3), (64, 64, 3)]


async def test_a_dummy_qwen_text_encoder_adopts_the_offline_tokenizers_special_ids(
    qwen_edit_checkpoint, tmp_path, qwen_small_condition
):
    # configs only, the text encoder's special-token ids and vocabulary as published (benchmarks/configs)
    configs = tmp_path / "qwen"
    for path in qwen_edit_checkpoint.rglob("*.json"):
        if path.parent.name not in ("tokenizer", "processor"):
            target = configs / path.relative_to(qwen_edit_checkpoint)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
    text_config = configs / "text_encoder" / "config.json"
    published = json.loads(
        (Path(__file__).parents[1] / "benchmarks/configs/qwen-image-edit/text_encoder/config.json").read_text()
    )
    config = json.loads(text_config.read_text())
    config.update(
        {k: published[k] for k in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")}
    )
    config["vocab_size"] = config["text_config"]["vocab_size"] = published["text_config"]["vocab_size"]
    text_config.write_text(json.dumps(config))
    async with await load_engine(configs, load_format="dummy") as engine:
        encoder = engine.models.get(ModelKind.IMAGE).pipe.text_encoder
        outputs = await collect(engine.generate(ImageRequest("x", images=(picture(),), size=(32, 32), seed=1)))
    assert encoder.config.image_token_id < 400 < published["image_token_id"]
    assert finals(outputs)[0].pixels.shape == (32, 32, 3)


def test_make_checkpoint_writes_image_kinds(pix2pix_checkpoint, tmp_path):
    from omni_stream.make_checkpoint import add_arguments, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert run(parser.parse_args(["--tiny", "--kind", "image-edit", str(tmp_path / "tiny")])) == 0
    assert (
        run(parser.parse_args(["--from-config", str(pix2pix_checkpoint), "--kind", "image-edit", str(tmp_path / "d")]))
        == 0
    )
    for out in ("tiny", "d"):
        assert (tmp_path / out / "model_index.json").is_file() and list((tmp_path / out / "unet").glob("*.safetensors"))


async def test_the_embedded_default_is_built_once_and_serves_edits(tmp_path, monkeypatch):
    from omni_stream.engine import AsyncEngine, ModelSource
    from omni_stream.runtime.cache import EMBEDDED_MARKER

    monkeypatch.setenv("OMNI_STREAM_CACHE", str(tmp_path))
    async with await AsyncEngine.load({"image": ModelSource(kind=ModelKind.IMAGE)}, progress=False) as engine:
        info = engine.models.get(ModelKind.IMAGE).info
        outputs = await collect(engine.generate(ImageRequest("x", images=(picture(),))))
    built = tmp_path / "checkpoints" / info.model_name
    assert (built / EMBEDDED_MARKER).is_file() and info.default_steps <= 4 and info.default_size == (64, 64)
    assert finals(outputs)[0].pixels.shape == (64, 64, 3)
    assert not _leftovers(tmp_path / "checkpoints")


def _leftovers(folder: Path) -> list[Path]:
    """Half-built temporary directories."""
    return [p for p in folder.iterdir() if p.name.startswith(".")]


def test_a_default_whose_extra_is_missing_is_left_out(monkeypatch):
    import importlib

    from omni_stream.family_registry import default_available

    real_import = importlib.import_module

    def without_diffusers(name, *args):
        if name == "omni_stream.models.diffusers_image.checkpoint":
            raise ModuleNotFoundError("No module named 'diffusers'", name="diffusers")
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", without_diffusers)
    assert not default_available(ModelKind.IMAGE)
    assert default_available(ModelKind.SPEECH)
