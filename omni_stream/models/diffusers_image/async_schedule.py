"""A request's noise schedule is made on the CPU and reaches the GPU without stopping the device worker's thread.

diffusers' schedulers build their timesteps and sigmas with numpy in ``set_timesteps`` and copy them to the
execution device with blocking ``.to(device)`` calls (Euler's then copy the sigmas back to the CPU, "to avoid too
much CPU/GPU communication"), and their first step finds its place in the schedule with ``.nonzero()`` and
``.item()`` on the device (``index_for_timestep``). Each of those waits for everything queued before it on the
image stream. ``image_bench --sync-debug`` (run 83, H100, c = 16) counted 177 waits in a round, 5 of each
request's 7 as it starts among them: behind the batched prompt encoding and input encoding of the requests
starting with it, and, for a request joining a running batch, behind that batch's denoiser call (~150 ms at 48
rows). While the thread waits it launches nothing, and once the GPU is done it idles while the thread goes on.

:func:`install` wraps one scheduler (a request's own copy, ``stepwise.own_scheduler``): a ``set_timesteps`` for a
CUDA device runs on the CPU, then the timesteps (which the pipeline iterates and hands the denoiser) are copied to
the device through pinned memory, queued on the current stream instead of waited for. Every scheduler diffusers
ships for the supported pipelines (Euler, Euler ancestral, flow matching, PNDM) keeps everything else on the CPU
already, so each tensor ends where diffusers puts it, with the same values. The first step's index is found on the
CPU copy, as ``index_for_timestep`` finds it for the schedule's first timestep, and set as the begin index; a
pipeline that starts in the middle of the schedule sets its own after ``set_timesteps``, as diffusers' img2img and
Qwen-Image-Edit pipelines do (one that starts in the middle without saying so would be stepped from the start).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

_WRAPPED = "_omni_stream_async_schedule"


def begin_at_first(scheduler: Any) -> int | None:
    """Set ``scheduler``'s begin index to where its first step finds the schedule's first timestep (on whatever
    device its timesteps are: call it on the CPU copy); None (nothing set) for a scheduler without begin indices."""
    find = getattr(scheduler, "index_for_timestep", None)
    begin = getattr(scheduler, "set_begin_index", None)
    timesteps = getattr(scheduler, "timesteps", None)
    if find is None or begin is None or not isinstance(timesteps, torch.Tensor) or timesteps.numel() == 0:
        return None
    index = int(find(timesteps[0], timesteps))
    begin(index)
    return index


def install(scheduler: Any) -> bool:
    """Wrap ``scheduler.set_timesteps`` as the module docstring says (this instance only, once). Only where CUDA is
    available: elsewhere nothing is copied, and False is returned."""
    if not torch.cuda.is_available() or getattr(scheduler, _WRAPPED, False):
        return False
    original = scheduler.set_timesteps
    signature = inspect.signature(original)

    @functools.wraps(original)  # its signature too: pipelines read set_timesteps' parameters to pass custom ones
    def set_timesteps(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        device = bound.arguments.get("device")
        target = torch.device(device) if isinstance(device, str) else device
        if not isinstance(target, torch.device) or target.type != "cuda":
            return original(*args, **kwargs)
        bound.arguments["device"] = torch.device("cpu")
        result = original(*bound.args, **bound.kwargs)
        begin_at_first(scheduler)
        timesteps = getattr(scheduler, "timesteps", None)
        if isinstance(timesteps, torch.Tensor):
            scheduler.timesteps = timesteps.pin_memory().to(target, non_blocking=True)
        return result

    scheduler.set_timesteps = set_timesteps
    setattr(scheduler, _WRAPPED, True)
    return True
