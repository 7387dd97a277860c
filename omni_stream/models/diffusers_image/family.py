"""The diffusers image family (``model_type: diffusers``): a diffusers pipeline directory served as ``kind: image``.

``config.json`` is absent from a diffusers directory; :func:`omni_stream.family.read_config` reads one with a
``model_index.json`` as ``model_type: diffusers``. An optional ``omni_stream.json`` beside it overrides the
serving defaults (``model_name``, ``default_steps``, ``default_guidance``, ``default_size``, ``min_side``,
``max_side``); the tiny checkpoints this package writes carry one.

The stage (:meth:`DiffusersImageFamily.image_stage`) takes its prompt from upstream (the rewriting text stage)
or the request, prepares the inputs off the loop (resize, mask, token count), and opens a session on the
family's ``image`` scheduler: a throughput scheduler on the engine's device worker whose steps are one denoising
step (or one VAE decode) of every request of one shape (:mod:`omni_stream.models.diffusers_image.runner`), so a
speech frame waits at most one such step, and a request joins the running batch at the next step. It admits
requests by capacity (they wait, in the ``image`` waiting gauge, while a step with them would not fit in the live
speech streams' slack). The stage yields previews, then the ``n`` images. Every wait is bounded by the request's
wait budget. Leaving the stage (done, error, consumer gone) releases the session synchronously: the request is
not stepped again after the step in progress, and its latents are freed at the next step.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import torch

from omni_stream.chunks import Image, TextDelta
from omni_stream.context import RequestContext
from omni_stream.device_policy import WorkClass
from omni_stream.errors import ConfigError, StageError
from omni_stream.family import LoadContext, ModelKind
from omni_stream.images.spec import (
    USAGE_IMAGE,
    USAGE_IMAGE_INPUT,
    ImageInfo,
    ImageRequest,
    image_tokens,
    output_size,
    prompt_of,
)
from omni_stream.models.diffusers_image import async_noise
from omni_stream.models.diffusers_image.adapters import Row, Shape, adapter_for
from omni_stream.models.diffusers_image.components import load_pipeline
from omni_stream.models.diffusers_image.preview import PreviewDecoder
from omni_stream.models.diffusers_image.runner import ImageRunner, Paint
from omni_stream.pipeline import Stage
from omni_stream.runtime.weights import parse_dtype
from omni_stream.scheduler import Scheduler

log = logging.getLogger(__name__)

MODEL_TYPE = "diffusers"
SERVING_FILE = "omni_stream.json"
# Items a request's scheduler buffer holds before it pauses: every preview and image of one request fits.
HIGH_WATERMARK = 16
_SERVING_KEYS = ("model_name", "default_steps", "default_guidance", "default_size", "min_side", "max_side")


def serving_defaults(checkpoint: Path) -> dict[str, Any]:
    """``omni_stream.json`` of a checkpoint (empty when absent); ConfigError on unknown keys."""
    path = checkpoint / SERVING_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    unknown = sorted(set(data) - set(_SERVING_KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown keys {', '.join(unknown)} (known: {', '.join(_SERVING_KEYS)})")
    return dict(data)


@dataclass(slots=True, frozen=True)
class _Prepared:
    rows: tuple[Row, ...]
    original: np.ndarray | None
    mask: np.ndarray | None
    text_tokens: int
    input_tokens: int


class DiffusersImageFamily:
    """A loaded diffusers pipeline; ``runner`` (step log), ``scheduler`` and ``live()`` are public for tests."""

    def __init__(self, load: LoadContext) -> None:
        opts = load.options
        self.device = opts.device
        self.dtype = parse_dtype(opts.dtype, opts.device)
        defaults = serving_defaults(load.checkpoint)
        self.pipe = load_pipeline(load.checkpoint, opts, self.dtype)
        if torch.device(opts.device).type == "cuda":
            async_noise.install(self.pipe)  # no blocking copy of each step's noise (the module's docstring)
        self.adapter = adapter_for(self.pipe)
        self.preview = PreviewDecoder.load(self.adapter, load.checkpoint, opts.device, self.dtype)
        self.worker = load.worker
        worker = load.worker

        def note(kind: str, labels: tuple[str, ...]) -> None:
            worker.note(kind, "image", WorkClass.THROUGHPUT, *labels)

        self.runner = ImageRunner(
            self.adapter, self.preview, max_batch_size=opts.max_batch_size, note=note, yield_point=worker.yield_point
        )
        self.scheduler = Scheduler(
            self.runner.model,
            load.worker,
            high_watermark=HIGH_WATERMARK,
            metrics=load.metrics.scheduler("image"),
            name="image",
            work_class=WorkClass.THROUGHPUT,
        )
        side = self.adapter.default_side
        size = defaults.get("default_size", [side, side])
        self.info = ImageInfo(
            model_name=defaults.get("model_name", load.checkpoint.name),
            model_type=MODEL_TYPE,
            kind=ModelKind.IMAGE,
            modes=self.adapter.modes,
            size_multiple=self.adapter.size_multiple,
            min_side=int(defaults.get("min_side", self.adapter.size_multiple * 2)),
            max_side=int(defaults.get("max_side", 2048)),
            default_size=(int(size[0]), int(size[1])),
            default_steps=int(defaults.get("default_steps", self.adapter.default_steps)),
            min_edit_steps=self.adapter.min_edit_steps,
            default_guidance=float(defaults.get("default_guidance", self.adapter.default_guidance)),
            token_pixels=self.adapter.token_pixels,
            preview=self.preview.kind,
            max_prompt_tokens=self.adapter.max_prompt_tokens,
        )
        log.info(
            "loaded %s (%s, %s previews) on %s",
            self.info.model_name,
            type(self.pipe).__name__,
            self.preview.kind,
            self.device,
        )

    # --- requests -----------------------------------------------------------------------------------------

    def count_text_tokens(self, text: str) -> int:
        return self.adapter.count_tokens(text)

    def live(self) -> dict[str, int]:
        """Per-request state still held: the scheduler's (sessions, slots, queues) and started pipeline calls."""
        return {**self.scheduler.live(), "calls": self.runner.model.running}

    def _prepare(self, request: ImageRequest, prompt: str, size: tuple[int, int], seed: int) -> _Prepared:
        """Resize inputs to the output size, the mask with them; count tokens (blocking: off the loop)."""
        from PIL import Image as PILImage

        width, height = size
        picture = None
        original = mask = None
        if request.images:
            source = PILImage.fromarray(request.images[0])
            picture = source if source.size == size else source.resize(size, PILImage.Resampling.LANCZOS)
            if request.mask is not None:
                original = np.asarray(picture, dtype=np.uint8)
                m = PILImage.fromarray(np.clip(request.mask * 255.0, 0, 255).astype(np.uint8))
                mask = np.asarray(m.resize(size, PILImage.Resampling.BILINEAR), dtype=np.float32) / 255.0
        rows = tuple(Row(prompt, picture, seed + k) for k in range(request.n))
        inputs = sum(image_tokens(self.info, width, height) for _ in request.images)
        read = min(self.adapter.count_tokens(prompt), self.adapter.max_prompt_tokens)  # the encoder cuts the rest
        return _Prepared(rows, original, mask, read, inputs)

    def image_stage(self, request: ImageRequest, ctx: RequestContext) -> Stage[TextDelta, Image]:
        """The stage that paints ``request`` (checked by the engine: images.spec.check_request)."""
        size = output_size(self.info, request)
        shape = Shape(
            request.mode,
            size[0],
            size[1],
            request.steps or self.info.default_steps,
            self.info.default_guidance if request.guidance_scale is None else float(request.guidance_scale),
        )
        seed = request.seed if request.seed is not None else secrets.randbelow(2**31)
        per_image = image_tokens(self.info, *size)

        async def image(ctx: RequestContext, upstream: AsyncIterator[TextDelta]) -> AsyncIterator[Image]:
            prompt = await prompt_of(upstream, request.prompt)
            prepared = await anyio.to_thread.run_sync(self._prepare, request, prompt, size, seed)
            ctx.tokens(USAGE_IMAGE).input_tokens = prepared.text_tokens
            ctx.tokens(USAGE_IMAGE_INPUT).input_tokens = prepared.input_tokens
            paint = Paint(prepared.rows, shape, request.partial_images, prepared.original, prepared.mask)
            finals = 0
            async with self.scheduler.session(self.runner.job(ctx.request_id, paint), ctx) as stream:
                async for items in stream:
                    for item in items:
                        if not item.partial:
                            finals += 1
                            ctx.tokens(USAGE_IMAGE).output_tokens += per_image
                        yield item
            if finals < request.n:
                raise StageError(f"request {ctx.request_id}: the pipeline call ended without its images")

        return image

    async def aclose(self) -> None:
        """Nothing to free beyond the scheduler, which the engine's worker shuts down (releasing every request)."""


def load_family(load: LoadContext) -> DiffusersImageFamily:
    """Family loader for ``model_type: diffusers`` (runs off the event loop)."""
    if load.options.load_format not in ("auto", "safetensors", "dummy"):
        raise ConfigError(f"load_format must be auto, safetensors or dummy, got {load.options.load_format!r}")
    return DiffusersImageFamily(load)
