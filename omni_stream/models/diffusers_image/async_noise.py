"""Noise drawn from a request's CPU generator reaches the GPU without stopping the device worker's thread.

diffusers draws a step's noise (Euler ancestral, DDPM and the other stochastic schedulers, and a pipeline's
initial latents: ``randn_tensor``) from the request's generator, which the family makes on the CPU so that a seed
paints the same image on any device, and copies it to the device with a blocking ``.to(device)``. That copy waits
for everything queued before it: the step's batched UNet call for every request. Measured on an H100 at c = 16
(InstructPix2Pix, 512 px, 20 steps): 336 such copies held the worker's thread 1.57 s of 5.5 s. Meanwhile it could
launch nothing, neither the requests' own work for the next step nor a speech stream's step, and once the call was
done the GPU idled while that work ran (~36 ms a step).

:func:`install` puts :func:`randn_tensor` in the place of diffusers' in the modules of one pipeline and its
scheduler: the same draw on the CPU (diffusers' own function, so the values are the same bit for bit), then a copy
through pinned memory that is queued on the current stream instead of waited for. The pinned buffer comes from
PyTorch's caching host allocator, which does not reuse it before the copy is done.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

_ORIGINAL = "_omni_stream_original_randn_tensor"


def randn_tensor(
    shape: Any, generator: Any = None, device: Any = None, dtype: Any = None, layout: Any = None, *, original: Any
) -> torch.Tensor:
    """``original`` (diffusers' ``randn_tensor``), with CPU generators' noise copied to a CUDA ``device``
    asynchronously; anything else as ``original`` does it."""
    target = torch.device(device) if isinstance(device, str) else device
    first = generator[0] if isinstance(generator, list) and generator else generator
    on_cpu = isinstance(first, torch.Generator) and first.device.type == "cpu"
    if target is None or target.type != "cuda" or not on_cpu:
        return original(shape, generator=generator, device=device, dtype=dtype, layout=layout)  # type: ignore[no-any-return]
    noise = original(shape, generator=generator, device=torch.device("cpu"), dtype=dtype, layout=layout)
    return noise.pin_memory().to(target, non_blocking=True)  # type: ignore[no-any-return]


def install(pipe: Any) -> list[str]:
    """Use :func:`randn_tensor` in the modules of ``pipe``'s class and of its scheduler's class (each once; values
    unchanged, the copy asynchronous). Only where CUDA is available: elsewhere nothing is copied. Returns the modules
    changed."""
    if not torch.cuda.is_available():
        return []
    changed = []
    for cls in (type(pipe), type(getattr(pipe, "scheduler", None))):
        module = sys.modules.get(cls.__module__)
        current = getattr(module, "randn_tensor", None)
        if module is None or current is None or hasattr(module, _ORIGINAL):
            continue

        def patched(*args: Any, original: Any = current, **kwargs: Any) -> torch.Tensor:
            return randn_tensor(*args, original=original, **kwargs)

        setattr(module, _ORIGINAL, current)
        setattr(module, "randn_tensor", patched)  # noqa: B010  # a module attribute mypy cannot see
        changed.append(module.__name__)
    return changed
