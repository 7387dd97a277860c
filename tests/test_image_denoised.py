"""Previews show the scheduler's estimate of the finished latents (``diffusers_image/denoised.py``): after one step
the estimate is the picture the step predicts, where the latents themselves are still mostly noise.

Each scheduler kind is checked on a step whose model output is the true one for a known clean latent (epsilon for
Euler ancestral, velocity for flow matching), so the estimate must give that latent back; a scheduler with no
estimate (PNDM) leaves the preview on the latents (the runner's previews end to end: ``test_image_engine.py``).
Last, the request's own copy of the pipeline (the one whose scheduler is watched) reads its execution device once,
not at every call.
"""

from __future__ import annotations

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from omni_stream.models.diffusers_image.denoised import Denoised  # noqa: E402

pytest_plugins = ("image_fixtures",)


def clean_and_noise(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, 4, 8, 8, generator=gen), torch.randn(2, 4, 8, 8, generator=gen)


def test_euler_ancestral_gives_its_own_estimate_of_the_clean_latents():
    scheduler = diffusers.EulerAncestralDiscreteScheduler(beta_schedule="scaled_linear")
    scheduler.set_timesteps(20)
    denoised = Denoised()
    denoised.watch(scheduler)
    assert denoised.latest() is None  # no step yet
    x0, eps = clean_and_noise()
    t = scheduler.timesteps[0]
    sigma = float(scheduler.sigmas[0])
    noisy = x0 + sigma * eps  # the pipeline's latents at the first timestep (k-diffusion space)
    out = scheduler.step(eps, t, noisy, generator=torch.Generator().manual_seed(1), return_dict=False)
    assert out[1] is denoised.latest()  # the scheduler's own pred_original_sample, not a copy
    torch.testing.assert_close(denoised.latest(), x0, atol=1e-4, rtol=1e-4)
    # ... while the latents after the step are still far from it
    assert (out[0] - x0).abs().mean() > 10 * (denoised.latest() - x0).abs().mean()
    denoised.clear()
    assert denoised.latest() is None


def test_flow_matching_estimate_is_the_latents_less_sigma_times_the_velocity():
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler()
    scheduler.set_timesteps(10)
    denoised = Denoised()
    denoised.watch(scheduler)
    x0, eps = clean_and_noise(1)
    for index in range(3):  # at each step, the true velocity for x0 gives x0 back
        sigma = float(scheduler.sigmas[index])
        noisy = (1 - sigma) * x0 + sigma * eps
        scheduler.step(eps - x0, scheduler.timesteps[index], noisy, return_dict=False)
        torch.testing.assert_close(denoised.latest(), x0, atol=1e-5, rtol=1e-5)


def test_a_scheduler_without_an_estimate_leaves_the_preview_on_the_latents():
    scheduler = diffusers.PNDMScheduler(skip_prk_steps=True)
    scheduler.set_timesteps(10)
    denoised = Denoised()
    denoised.watch(scheduler)
    x0, eps = clean_and_noise(2)
    scheduler.step(eps, scheduler.timesteps[0], x0 + eps, return_dict=False)
    assert denoised.latest() is None


def test_the_watched_step_keeps_its_signature_so_pipelines_still_pass_their_generator():
    import inspect

    scheduler = diffusers.EulerAncestralDiscreteScheduler()
    Denoised().watch(scheduler)
    assert {"generator", "return_dict"} <= set(inspect.signature(scheduler.step).parameters)


def test_a_requests_pipeline_copy_reads_its_execution_device_once(pix2pix_checkpoint):
    from omni_stream.family import LoadOptions
    from omni_stream.models.diffusers_image.components import load_pipeline
    from omni_stream.runtime.stepwise import own_scheduler

    pipe = load_pipeline(pix2pix_checkpoint, LoadOptions(progress=False), torch.float32)
    twin = own_scheduler(pipe)
    assert isinstance(twin, type(pipe)) and type(twin).__name__ == type(pipe).__name__
    assert twin._execution_device == pipe._execution_device == torch.device("cpu")
    assert twin.scheduler is not pipe.scheduler and twin.unet is pipe.unet
    twin.__dict__["_omni_stream_execution_device"] = torch.device("meta")  # read from the copy, not walked again
    assert twin._execution_device == torch.device("meta") and pipe._execution_device == torch.device("cpu")
    assert type(own_scheduler(twin)) is type(twin)  # a copy of a copy: the same class, not a new one
