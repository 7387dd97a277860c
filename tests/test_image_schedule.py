"""A request's noise schedule made on the CPU (``diffusers_image/async_schedule.py``): the begin index set where the
first step would find it, so no step searches the schedule on the device; on a GPU (``-m gpu``) the wrapped
``set_timesteps`` makes no synchronizing call, puts every tensor where diffusers puts it with the same values, and
a pipeline paints the same image bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("diffusers")
from diffusers import (
    EulerAncestralDiscreteScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    PNDMScheduler,
)

from omni_stream.models.diffusers_image import async_schedule

SD_BETAS = {"beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear"}


def schedulers():
    return [EulerAncestralDiscreteScheduler(**SD_BETAS), EulerDiscreteScheduler(**SD_BETAS),
            FlowMatchEulerDiscreteScheduler(shift=3.0)]  # fmt: skip


def run(scheduler, steps: int = 6, begin: bool = False, device: str = "cpu") -> torch.Tensor:
    """``steps`` steps from fixed noise with a fixed stand-in for the model's output (a seeded CPU generator)."""
    scheduler.set_timesteps(steps, device=device)
    if begin:
        async_schedule.begin_at_first(scheduler)
    gen = torch.Generator("cpu").manual_seed(3)
    sample = torch.randn(1, 4, 8, 8, generator=gen).to(device)
    for t in scheduler.timesteps:
        model_in = scheduler.scale_model_input(sample, t) if hasattr(scheduler, "scale_model_input") else sample
        output = 0.1 * model_in + torch.randn(1, 4, 8, 8, generator=gen).to(device)
        sample = scheduler.step(output, t, sample, generator=gen, return_dict=False)[0]
    return sample.cpu()


@pytest.mark.parametrize("scheduler", schedulers(), ids=lambda s: type(s).__name__)
def test_the_begin_index_is_where_the_first_step_finds_the_first_timestep(scheduler):
    scheduler.set_timesteps(20, device="cpu")
    found = scheduler.index_for_timestep(scheduler.timesteps[0])
    assert async_schedule.begin_at_first(scheduler) == found == 0 and scheduler.begin_index == 0
    assert torch.equal(run(copy.deepcopy(scheduler), begin=True), run(copy.deepcopy(scheduler)))


def test_a_first_timestep_that_repeats_begins_at_its_second_place_as_diffusers_does():
    scheduler = EulerDiscreteScheduler(**SD_BETAS)
    scheduler.set_timesteps(4, device="cpu")
    scheduler.timesteps = torch.cat([scheduler.timesteps[:1], scheduler.timesteps])
    assert async_schedule.begin_at_first(scheduler) == scheduler.index_for_timestep(scheduler.timesteps[0]) == 1


def test_a_scheduler_without_begin_indices_is_left_alone():
    scheduler = PNDMScheduler(**SD_BETAS)
    scheduler.set_timesteps(20, device="cpu")
    assert async_schedule.begin_at_first(scheduler) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine")
def test_without_cuda_nothing_is_wrapped():
    scheduler = EulerAncestralDiscreteScheduler(**SD_BETAS)
    assert async_schedule.install(scheduler) is False
    assert "set_timesteps" not in vars(scheduler)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("make", [*schedulers(), PNDMScheduler(**SD_BETAS)], ids=lambda s: type(s).__name__)
def test_on_cuda_the_schedule_is_diffusers_own_and_made_without_a_sync(make):
    plain, wrapped = copy.deepcopy(make), copy.deepcopy(make)
    assert async_schedule.install(wrapped) and not async_schedule.install(wrapped)  # once
    plain.set_timesteps(20, device="cuda")
    busy = torch.randn(4096, 4096, device="cuda")
    for _ in range(20):
        busy = busy @ busy  # queued work a blocking copy would wait for
        busy /= busy.norm()
    torch.cuda.set_sync_debug_mode("error")
    try:
        wrapped.set_timesteps(20, device="cuda")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for name, value in vars(plain).items():
        if isinstance(value, torch.Tensor):
            ours = getattr(wrapped, name)
            assert ours.device == value.device and torch.equal(ours.cpu(), value.cpu()), name
    assert torch.equal(run(copy.deepcopy(make), device="cuda"), run(wrapped_copy(make), device="cuda"))


def wrapped_copy(scheduler):
    twin = copy.deepcopy(scheduler)
    async_schedule.install(twin)
    return twin


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_a_pipeline_paints_the_same_image_with_its_schedule_made_on_the_cpu(tmp_path):
    import numpy as np
    from PIL import Image

    from omni_stream.family import LoadOptions
    from omni_stream.models.diffusers_image.checkpoint import write_tiny_checkpoint
    from omni_stream.models.diffusers_image.components import load_pipeline
    from omni_stream.runtime.stepwise import own_scheduler

    folder = write_tiny_checkpoint(tmp_path / "pix2pix", "image-edit")
    pipe = load_pipeline(folder, LoadOptions(device="cuda", load_format="auto", progress=False), torch.float32)
    picture = Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8))

    def paint(p):
        gen = torch.Generator("cpu").manual_seed(5)
        return p("snow", image=picture, num_inference_steps=5, generator=gen, output_type="pt").images

    twin = own_scheduler(pipe)
    assert async_schedule.install(twin.scheduler)
    assert torch.equal(paint(twin), paint(own_scheduler(pipe)))
