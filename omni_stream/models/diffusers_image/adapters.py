"""What differs between diffusers pipelines: how one call is made, which model calls are its steps, and where
its latents live.

An adapter wraps one loaded pipeline (never a copy of its code): it calls it for the rows of one request with
``callback_on_step_end`` (the runner's step hook), names the model calls a request parks at between steps
(:meth:`Adapter.intercepts`: the prompt's and the input image's encoding, the denoiser's forward, the VAE's
decode, with the arguments stacked across requests), hands out a copy of itself for one request
(:meth:`Adapter.fork`: its own noise scheduler, watched for its estimate of the finished latents), unpacks the
latents the callback sees into ``(batch, channels, h, w)`` (previews), and decodes such latents through the
pipeline's own VAE (to fit the linear preview projection at load). Supported: Stable Diffusion (text to image,
and edits as img2img), InstructPix2Pix (edits) and Qwen-Image-Edit (edits).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from omni_stream.errors import ConfigError
from omni_stream.images.spec import ImageMode
from omni_stream.models.diffusers_image.denoised import Denoised
from omni_stream.runtime.stepwise import Intercept, own_scheduler

StepCallback = Callable[[Any, int, Any, dict[str, Any]], dict[str, Any]]

# UNet2DConditionModel.forward's per-row arguments: requests at different timesteps share one call.
UNET_ROWS = ("sample", "timestep", "encoder_hidden_states", "timestep_cond", "attention_mask", "encoder_attention_mask")
# CLIPTextModel.forward's per-row arguments (a prompt's token ids, padded to the encoder's length)
CLIP_ROWS = ("input_ids", "attention_mask", "position_ids")
EDIT_STRENGTH = 0.8  # img2img on a text-to-image model: how far from the input the edit may go (diffusers' default)
IMAGE_GUIDANCE = 1.5  # InstructPix2Pix: how closely the edit follows the input image (its authors' default)


@dataclass(slots=True, frozen=True)
class Shape:
    """What requests must share to run in one pipeline call (sizes in pixels)."""

    mode: ImageMode
    width: int
    height: int
    steps: int
    guidance: float


@dataclass(slots=True, frozen=True)
class Row:
    """One image of a batched call: its prompt, its input image (PIL, at the output size) and its seed."""

    prompt: str
    image: Any | None
    seed: int


def _generators(rows: Sequence[Row]) -> list[torch.Generator]:
    # CPU generators: the same seed paints the same image on any device
    return [torch.Generator("cpu").manual_seed(row.seed) for row in rows]


class Adapter:
    """Base: a pipeline with an ``AutoencoderKL``-style VAE and unpacked ``(B, C, h, w)`` latents."""

    pipeline_classes: ClassVar[tuple[str, ...]] = ()
    modes: ClassVar[tuple[ImageMode, ...]] = ()
    default_steps: ClassVar[int] = 30
    default_guidance: ClassVar[float] = 7.5
    min_edit_steps: ClassVar[int] = 1  # the fewest num_inference_steps an edit runs at least one denoising step with

    def __init__(self, pipe: Any) -> None:
        self.pipe = pipe
        self.denoised: Denoised | None = None  # a fork's (one request's)

    def fork(self) -> Adapter:
        """This adapter for one request: the same models, a noise scheduler of its own (a pipeline call keeps its
        loop's state on its pipeline), watched for its clean-latents estimate (:attr:`denoised`, for previews)."""
        twin = copy.copy(self)
        twin.pipe = own_scheduler(self.pipe)
        twin.denoised = Denoised()
        twin.denoised.watch(twin.pipe.scheduler)
        return twin

    def preview_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """What a preview after this step shows (the callback's ``latents`` layout): the scheduler's estimate of
        the finished latents where it gives one, else ``latents`` themselves (:mod:`.denoised`)."""
        estimate = self.denoised.latest() if self.denoised is not None else None
        return estimate if estimate is not None and estimate.shape == latents.shape else latents

    def intercepts(self) -> list[Intercept]:
        """The model calls a request parks at: its prompt's encoding (each text encoder call: the prompt, the
        negative one) and its input image's encoding as it starts (batched across the requests starting together,
        inside their join step: one call each, not one per request; each costs ~10 ms of launching on the worker's
        thread at any batch, and sixteen requests' joins were most of the first preview's wait at c = 16 in run 77),
        then one denoising step at a time, and the VAE decode."""
        text = self.pipe.text_encoder
        encoder = getattr(self.pipe.vae, "encoder", None)
        return [
            *(
                [Intercept("text", text, "forward", CLIP_ROWS, at_join=True)]
                if isinstance(text, torch.nn.Module)
                else []
            ),
            *(
                [Intercept("encode", encoder, "forward", ("sample",), at_join=True)]
                if isinstance(encoder, torch.nn.Module)
                else []
            ),
            Intercept("denoise", self.pipe.unet, "forward", UNET_ROWS),
            Intercept("decode", self.pipe.vae, "decode", ("z",), fine=True),
        ]

    @property
    def size_multiple(self) -> int:
        return int(self.pipe.vae_scale_factor)

    @property
    def token_pixels(self) -> int:
        return int(self.pipe.vae_scale_factor)

    @property
    def default_side(self) -> int:
        return int(self.pipe.unet.config.sample_size) * int(self.pipe.vae_scale_factor)

    @property
    def latent_channels(self) -> int:
        return int(self.pipe.vae.config.latent_channels)

    @property
    def device(self) -> torch.device:
        return torch.device(self.pipe._execution_device)

    @property
    def dtype(self) -> torch.dtype:
        return self.pipe.vae.dtype

    @property
    def max_prompt_tokens(self) -> int:
        """The most tokens of a prompt (specials included) the text encoder reads; it cuts the rest."""
        return int(self.pipe.tokenizer.model_max_length)

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` in the pipeline's text encoder's tokens, specials included, past its limit too."""
        # verbose=False: counting a long text is not feeding it to the encoder (no warning about its length)
        return len(self.pipe.tokenizer(text, truncation=False, verbose=False).input_ids)

    def unpack(self, latents: torch.Tensor, shape: Shape) -> torch.Tensor:
        """The callback's latents as ``(B, C, h, w)``."""
        return latents

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Unpacked latents through the full VAE: RGB in [-1, 1], ``(B, 3, H, W)``."""
        vae = self.pipe.vae
        return vae.decode(latents / vae.config.scaling_factor, return_dict=False)[0]

    def call(self, rows: Sequence[Row], shape: Shape, callback: StepCallback) -> np.ndarray:
        """One pipeline call for ``rows``: float images in [0, 1], ``(B, H, W, 3)``."""
        raise NotImplementedError

    def _common(self, rows: Sequence[Row], shape: Shape, callback: StepCallback) -> dict[str, Any]:
        return {
            "prompt": [row.prompt for row in rows],
            "num_inference_steps": shape.steps,
            "generator": _generators(rows),
            "output_type": "np",
            "callback_on_step_end": callback,
            "callback_on_step_end_tensor_inputs": ["latents"],
        }


class StableDiffusionAdapter(Adapter):
    """Stable Diffusion 1.x/2.x: text to image; edits run the same components as img2img."""

    pipeline_classes = ("StableDiffusionPipeline",)
    modes = (ImageMode.GENERATE, ImageMode.EDIT)
    # img2img denoises int(steps * strength) of the steps asked: at 0.8, one step asked would be none
    min_edit_steps = math.ceil(1 / EDIT_STRENGTH)

    def __init__(self, pipe: Any) -> None:
        super().__init__(pipe)
        from diffusers import StableDiffusionImg2ImgPipeline

        self.img2img = StableDiffusionImg2ImgPipeline.from_pipe(pipe)  # shares every component
        self.img2img.set_progress_bar_config(disable=True)

    def fork(self) -> Adapter:
        twin = super().fork()
        assert isinstance(twin, StableDiffusionAdapter) and twin.denoised is not None
        twin.img2img = own_scheduler(self.img2img)
        twin.denoised.watch(twin.img2img.scheduler)
        return twin

    def call(self, rows: Sequence[Row], shape: Shape, callback: StepCallback) -> np.ndarray:
        kwargs = self._common(rows, shape, callback)
        if shape.mode is ImageMode.EDIT:
            out = self.img2img(
                image=[row.image for row in rows], strength=EDIT_STRENGTH, guidance_scale=shape.guidance, **kwargs
            )
        else:
            out = self.pipe(height=shape.height, width=shape.width, guidance_scale=shape.guidance, **kwargs)
        return np.asarray(out.images)


class InstructPix2PixAdapter(Adapter):
    """InstructPix2Pix: edits by instruction; the output has the input image's size."""

    pipeline_classes = ("StableDiffusionInstructPix2PixPipeline",)
    modes = (ImageMode.EDIT,)
    default_steps = 20

    def call(self, rows: Sequence[Row], shape: Shape, callback: StepCallback) -> np.ndarray:
        out = self.pipe(
            image=[row.image for row in rows],
            guidance_scale=shape.guidance,
            image_guidance_scale=IMAGE_GUIDANCE,
            **self._common(rows, shape, callback),
        )
        return np.asarray(out.images)


class QwenImageEditAdapter(Adapter):
    """Qwen-Image-Edit: packed 2x2-patch latents, a video-style VAE (one frame), true CFG with a blank negative."""

    pipeline_classes = ("QwenImageEditPipeline",)
    modes = (ImageMode.EDIT,)
    default_steps = 50
    default_guidance = 4.0  # true_cfg_scale; <= 1 turns classifier-free guidance off

    @property
    def size_multiple(self) -> int:
        return int(self.pipe.vae_scale_factor) * 2

    @property
    def token_pixels(self) -> int:
        return self.size_multiple

    @property
    def default_side(self) -> int:
        return int(self.pipe.default_sample_size) * int(self.pipe.vae_scale_factor)

    @property
    def latent_channels(self) -> int:
        return int(self.pipe.vae.config.z_dim)

    def intercepts(self) -> list[Intercept]:
        """Its transformer's calls carry per-request lists (image shapes, text lengths): each request's step runs
        as its own call; the VAE decode batches."""
        return [
            Intercept("denoise", self.pipe.transformer, "forward"),
            Intercept("decode", self.pipe.vae, "decode", ("z",), fine=True),
        ]

    @property
    def max_prompt_tokens(self) -> int:
        return int(self.pipe.tokenizer_max_length)

    def count_tokens(self, text: str) -> int:
        return len(self.pipe.tokenizer(text, truncation=False, verbose=False).input_ids)

    def unpack(self, latents: torch.Tensor, shape: Shape) -> torch.Tensor:
        pipe = self.pipe
        return pipe._unpack_latents(latents, shape.height, shape.width, pipe.vae_scale_factor)[:, :, 0]

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        config = self.pipe.vae.config
        mean = torch.tensor(config.latents_mean, device=latents.device, dtype=latents.dtype).view(1, -1, 1, 1)
        std = torch.tensor(config.latents_std, device=latents.device, dtype=latents.dtype).view(1, -1, 1, 1)
        z = (latents * std + mean).unsqueeze(2)  # the pipeline's own de-normalization, one frame
        return self.pipe.vae.decode(z, return_dict=False)[0][:, :, 0]

    def call(self, rows: Sequence[Row], shape: Shape, callback: StepCallback) -> np.ndarray:
        cfg = shape.guidance > 1.0
        out = self.pipe(
            image=[row.image for row in rows],
            height=shape.height,
            width=shape.width,
            true_cfg_scale=shape.guidance,
            negative_prompt=[" "] * len(rows) if cfg else None,
            **self._common(rows, shape, callback),
        )
        return np.asarray(out.images)


ADAPTERS: tuple[type[Adapter], ...] = (StableDiffusionAdapter, InstructPix2PixAdapter, QwenImageEditAdapter)


def adapter_for(pipe: Any) -> Adapter:
    """The adapter of a loaded pipeline; ConfigError for a pipeline class this family does not serve."""
    name = type(pipe).__name__
    for cls in ADAPTERS:
        if name in cls.pipeline_classes:
            return cls(pipe)
    known = ", ".join(c for a in ADAPTERS for c in a.pipeline_classes)
    raise ConfigError(f"{name} is not served (supported diffusers pipelines: {known})")
