"""The noise scheduler's estimate of the finished latents after each step, for previews.

The latents mid-denoise (``x_t``) are mostly noise in the first steps, so a preview of them shows little until the
last third. The scheduler's estimate of the clean latents (``x0``, diffusers' ``pred_original_sample``) shows the
picture's layout after the first step (an edit's input image at once), which is what a preview is for; ComfyUI and
AUTOMATIC1111 preview the same estimate. :class:`Denoised` wraps the ``step`` of a request's own scheduler (each
request has one: ``Adapter.fork``) and keeps what the latest step gives:

- schedulers that return it (Euler, Euler ancestral, DDIM, DDPM, LMS, Heun: a second output with
  ``return_dict=False``, or the output's ``pred_original_sample``) give it as they are;
- flow-matching Euler (Qwen-Image), whose step returns only the next latents: ``x0 = x_t - sigma_t * v``, with the
  step's own ``sigma_t``, computed when a preview asks for it;
- any other (PNDM, DPM-Solver multistep) gives none, and the preview shows the latents themselves.

The estimate costs nothing the step did not already compute, except the flow-matching one (one fused multiply-add
over the latents, and only for a step that is previewed).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

FLOW_SCHEDULERS = ("FlowMatchEulerDiscreteScheduler",)


class Denoised:
    """The latest step's clean-latents estimate of the schedulers it watches (one request's)."""

    def __init__(self) -> None:
        self._given: torch.Tensor | None = None
        self._flow: tuple[torch.Tensor, torch.Tensor, float] | None = None  # (x_t, v, sigma_t) of the latest step

    def watch(self, scheduler: Any) -> None:
        """Wrap ``scheduler.step`` (on this instance only) so each step leaves its estimate here."""
        original = scheduler.step
        flow = type(scheduler).__name__ in FLOW_SCHEDULERS

        # wraps: pipelines read the step's signature (``prepare_extra_step_kwargs``) to pass it ``generator`` and
        # ``eta``; a bare ``*args, **kwargs`` would make them drop the request's generator
        @functools.wraps(original)
        def step(model_output: torch.Tensor, timestep: Any, sample: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            out = original(model_output, timestep, sample, *args, **kwargs)
            self._given, self._flow = None, None
            if flow:
                # the step has moved its index on: the sigma it stepped from is the one before
                sigma = float(scheduler.sigmas[scheduler.step_index - 1])
                self._flow = (sample, model_output, sigma)
            elif isinstance(out, tuple):
                self._given = out[1] if len(out) > 1 and isinstance(out[1], torch.Tensor) else None
            else:
                given = getattr(out, "pred_original_sample", None)
                self._given = given if isinstance(given, torch.Tensor) else None
            return out

        scheduler.step = step

    def latest(self) -> torch.Tensor | None:
        """The latest step's estimate of the finished latents (the scheduler's layout), or None when its scheduler
        gives none (or no step has run)."""
        if self._flow is not None:
            sample, velocity, sigma = self._flow
            return sample.float() - sigma * velocity.float()
        return self._given

    def clear(self) -> None:
        """Drop the tensors held (the request is done)."""
        self._given, self._flow = None, None
