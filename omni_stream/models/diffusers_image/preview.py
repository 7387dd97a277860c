"""Cheap previews from latents mid-denoise: a tiny autoencoder when the checkpoint has one, else a linear map.

A checkpoint may carry a TAESD-style ``AutoencoderTiny`` in ``preview_decoder/`` (not in ``model_index.json``,
so other tools ignore it); it decodes the pipeline's latents directly, in a few milliseconds. Without one, the
preview is a linear latent-to-RGB projection (ComfyUI's "latent RGB factors" idea), fitted once at load against
the checkpoint's own VAE: random latents are decoded, pooled to the latent grid, and ``rgb = W @ latent + b``
is solved by least squares. It costs one small VAE decode at load and a matmul per preview, works for any VAE
(tiny random ones included), and is upsampled to the output size. Both run on the device thread, one batched
device-to-host copy per step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from omni_stream.models.diffusers_image.adapters import Adapter

PREVIEW_DIR = "preview_decoder"
FIT_SAMPLES = 4  # random latents decoded to fit the linear projection
FIT_SIDE = 8  # their latent side (64 px through an 8x VAE)


def to_uint8(rgb: torch.Tensor) -> np.ndarray:
    """``(B, 3, H, W)`` in [-1, 1] (NaN-safe) -> uint8 ``(B, H, W, 3)``, one host copy."""
    rgb = torch.nan_to_num(rgb.float(), nan=0.0).add(1.0).mul(127.5).clamp(0, 255).round()
    return rgb.to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()


def float_to_uint8(images: np.ndarray) -> np.ndarray:
    """A pipeline's float images in [0, 1] ``(B, H, W, 3)`` -> uint8."""
    return np.clip(np.rint(np.nan_to_num(images, nan=0.0) * 255.0), 0, 255).astype(np.uint8)


@torch.inference_mode()
def fit_linear(adapter: Adapter, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W, b)`` with ``rgb ~= W @ latent + b`` per latent pixel: ``W`` is ``(3, C)``, ``b`` is ``(3,)``."""
    gen = torch.Generator("cpu").manual_seed(seed)
    channels = adapter.latent_channels
    x = torch.randn(FIT_SAMPLES, channels, FIT_SIDE, FIT_SIDE, generator=gen)
    rgb = adapter.decode(x.to(adapter.device, adapter.dtype)).float().cpu()
    rgb = F.adaptive_avg_pool2d(rgb, (FIT_SIDE, FIT_SIDE))  # each latent pixel's patch, averaged
    a = torch.cat([x.permute(0, 2, 3, 1).reshape(-1, channels), torch.ones(x.numel() // channels, 1)], dim=1)
    y = rgb.permute(0, 2, 3, 1).reshape(-1, 3)
    solution = torch.linalg.lstsq(a.double(), y.double()).solution.float()  # (C + 1, 3)
    return solution[:channels].T.contiguous(), solution[channels].contiguous()


class PreviewDecoder:
    """Latents ``(B, C, h, w)`` (unpacked, pipeline space) -> uint8 previews ``(B, H, W, 3)``."""

    def __init__(self, adapter: Adapter, tiny: Any | None = None) -> None:
        self.adapter = adapter
        self.tiny = tiny
        self.kind = "tiny-autoencoder" if tiny is not None else "linear"
        if tiny is None:
            weight, bias = fit_linear(adapter)
            self.weight = weight.to(adapter.device)
            self.bias = bias.to(adapter.device)

    @classmethod
    def load(cls, adapter: Adapter, checkpoint: Path, device: str, dtype: torch.dtype) -> PreviewDecoder:
        folder = checkpoint / PREVIEW_DIR
        if (folder / "config.json").is_file():
            from diffusers import AutoencoderTiny

            tiny = AutoencoderTiny.from_pretrained(folder, torch_dtype=dtype, low_cpu_mem_usage=False)
            return cls(adapter, tiny.to(device).eval().requires_grad_(False))
        return cls(adapter)

    @torch.inference_mode()
    def decode(self, latents: torch.Tensor, width: int, height: int) -> np.ndarray:
        if self.tiny is not None:
            rgb = self.tiny.decode(latents.to(self.tiny.dtype), return_dict=False)[0]
        else:
            rgb = torch.einsum("rc,bchw->brhw", self.weight, latents.float()) + self.bias.view(1, 3, 1, 1)
        if rgb.shape[-2:] != (height, width):
            rgb = F.interpolate(rgb.float(), size=(height, width), mode="bilinear", align_corners=False)
        return to_uint8(rgb)
