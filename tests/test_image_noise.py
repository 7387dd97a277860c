"""Each step's noise from a request's CPU generator reaches the GPU without a blocking copy
(``diffusers_image/async_noise.py``): the same values as diffusers' own draw, and (on a GPU) no synchronization.

On a CPU nothing is installed and the function falls through to diffusers' own; the GPU tests (``-m gpu``) check
the values against diffusers' draw and that CUDA's sync debug mode, set to raise on a synchronizing call, raises
for diffusers' copy and not for ours.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("diffusers")
from diffusers.utils.torch_utils import randn_tensor as diffusers_randn

from omni_stream.models.diffusers_image import async_noise


def generators(n: int, seed: int = 7) -> list[torch.Generator]:
    return [torch.Generator("cpu").manual_seed(seed + k) for k in range(n)]


def test_off_cuda_the_draw_is_diffusers_own():
    for gen in (generators(1)[0], generators(3), None):
        ours = async_noise.randn_tensor((3, 4, 8, 8), generator=gen, device="cpu", original=diffusers_randn)
        if gen is None:
            assert ours.shape == (3, 4, 8, 8)
            continue
        again = generators(1)[0] if isinstance(gen, torch.Generator) else generators(3)
        assert torch.equal(ours, diffusers_randn((3, 4, 8, 8), generator=again, device="cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine")
def test_without_cuda_nothing_is_installed():
    class Pipe:
        scheduler = None

    assert async_noise.install(Pipe()) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("count", [1, 3])
def test_on_cuda_the_same_noise_arrives_without_a_sync(count):
    shape, dtype = (count, 4, 64, 64), torch.bfloat16
    expected = diffusers_randn(shape, generator=generators(count) if count > 1 else generators(1)[0],
                               device=torch.device("cuda"), dtype=dtype)  # fmt: skip
    torch.cuda.synchronize()
    busy = torch.randn(4096, 4096, device="cuda")
    for _ in range(20):  # queued work the blocking copy would wait for
        busy = busy @ busy / 4096
    torch.cuda.set_sync_debug_mode("error")
    try:
        gens = generators(count) if count > 1 else generators(1)[0]
        ours = async_noise.randn_tensor(shape, generator=gens, device=torch.device("cuda"), dtype=dtype,
                                        original=diffusers_randn)  # fmt: skip
        with pytest.raises(RuntimeError, match="synchroniz"):  # diffusers' own copy waits
            diffusers_randn(shape, generator=generators(1)[0], device=torch.device("cuda"), dtype=dtype)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert ours.device.type == "cuda" and torch.equal(ours, expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_install_changes_the_schedulers_module_once():
    import diffusers

    class Pipe:  # a module without randn_tensor (this test's) beside a diffusers scheduler's
        scheduler = diffusers.EulerAncestralDiscreteScheduler()

    changed = async_noise.install(Pipe())
    assert changed == ["diffusers.schedulers.scheduling_euler_ancestral_discrete"] or changed == []  # once a process
    assert async_noise.install(Pipe()) == []
    import diffusers.schedulers.scheduling_euler_ancestral_discrete as module

    assert module.randn_tensor is not diffusers_randn
