"""The diffusers image family (``model_type: diffusers``): a diffusers pipeline directory served as ``kind: image``.

``config.json`` is absent from a diffusers directory; :func:`omni_stream.family.read_config` reads one with a
``model_index.json`` as ``model_type: diffusers``. An optional ``omni_stream.json`` beside it overrides the
serving defaults (``model_name``, ``default_steps``, ``default_guidance``, ``default_size``, ``min_side``,
``max_side``); the tiny checkpoints this package writes carry one.

The stage (:meth:`DiffusersImageFamily.image_stage`) takes its prompt from upstream (the rewriting text stage)
or the request, prepares the inputs off the loop (resize, mask, token count), queues one job on the device
worker keyed by its shape (:mod:`omni_stream.models.diffusers_image.runner` batches same-shape jobs into one
pipeline call) and yields what the job's channel brings: previews, then the ``n`` images. Every wait is bounded
by the request's wait budget. Leaving the stage (done, error, consumer gone) cancels the job synchronously, so
it is not stepped again after the step in progress.

Model work runs on the engine's device worker; ``OMNI_STREAM_DIFFUSION_THREAD=1`` gives the family a thread of
its own instead, so that a pipeline call (all its steps) does not hold up the text model's steps meanwhile.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
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
from omni_stream.models.diffusers_image.adapters import Row, Shape, adapter_for
from omni_stream.models.diffusers_image.components import load_pipeline
from omni_stream.models.diffusers_image.preview import PreviewDecoder
from omni_stream.models.diffusers_image.runner import BatchRunner, Job
from omni_stream.pipeline import Stage
from omni_stream.runtime.weights import parse_dtype
from omni_stream.worker import DeviceWorker

log = logging.getLogger(__name__)

MODEL_TYPE = "diffusers"
SERVING_FILE = "omni_stream.json"
ENV_OWN_THREAD = "OMNI_STREAM_DIFFUSION_THREAD"
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


def _finish(send: Any, future: Any) -> None:
    """When the job's call is over (on the loop, after every chunk it handed over): a failure, then the end."""
    if not future.cancelled() and future.exception() is not None:
        try:
            send.send_nowait(future.exception())
        except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
    send.close()


class DiffusersImageFamily:
    """A loaded diffusers pipeline; ``runner`` (step log, ``on_step``) and ``live()`` are public for tests."""

    def __init__(self, load: LoadContext) -> None:
        opts = load.options
        self.device = opts.device
        self.dtype = parse_dtype(opts.dtype, opts.device)
        defaults = serving_defaults(load.checkpoint)
        self.pipe = load_pipeline(load.checkpoint, opts, self.dtype)
        self.adapter = adapter_for(self.pipe)
        self.preview = PreviewDecoder.load(self.adapter, load.checkpoint, opts.device, self.dtype)
        self.runner = BatchRunner(self.adapter, self.preview, max_rows=opts.max_batch_size)
        self.worker = load.worker
        self._own_worker = os.environ.get(ENV_OWN_THREAD, "0") == "1"
        if self._own_worker:
            init = _own_stream(self.device) if self.device.startswith("cuda") else None
            self.worker = DeviceWorker(name=f"{load.worker.name}-diffusion", init=init, threads=load.worker.threads)
            self.worker.start()
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
            default_guidance=float(defaults.get("default_guidance", self.adapter.default_guidance)),
            token_pixels=self.adapter.token_pixels,
            preview=self.preview.kind,
        )
        self._live: dict[str, Job] = {}
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
        """Per-request state still held: open jobs, and rows of the pipeline call in progress."""
        return {"jobs": len(self._live), "running_rows": self.runner.running_rows}

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
        return _Prepared(rows, original, mask, self.adapter.count_tokens(prompt), inputs)

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
            send, receive = anyio.create_memory_object_stream[Any](request.partial_images + request.n + 1)
            loop = asyncio.get_running_loop()
            job = Job(
                ctx.request_id, prepared.rows, shape, request.partial_images, loop, send, prepared.original,
                prepared.mask,
            )  # fmt: skip
            unregister = ctx.add_release(job.cancel)
            self._live[job.request_id] = job
            future = None
            try:
                future = self.worker.submit_batched(shape, job, self.runner.run)
                future.add_done_callback(functools.partial(_finish, send))
                finals = 0
                async with receive:
                    while finals < request.n:
                        with ctx.fail_after("a denoising step"):
                            item = await _receive(receive)
                        if item is None:
                            raise StageError(f"request {ctx.request_id}: the pipeline call ended without its images")
                        if isinstance(item, BaseException):
                            raise item
                        if not item.partial:
                            finals += 1
                            ctx.tokens(USAGE_IMAGE).output_tokens += per_image
                        yield item
            finally:
                job.cancel()
                unregister()
                if future is not None:
                    future.cancel()  # not picked up yet: the worker skips it
                self._live.pop(job.request_id, None)

        return image

    async def aclose(self) -> None:
        """Stop every open job at its next step; stop the family's own thread if it has one."""
        for job in list(self._live.values()):
            job.cancel()
        if self._own_worker:
            await self.worker.aclose()


def _own_stream(device: str) -> Any:
    """A worker init that makes a new CUDA stream current on its thread (so its kernels overlap the others')."""

    def init() -> None:
        torch.cuda.set_stream(torch.cuda.Stream(device))

    return init


async def _receive(receive: Any) -> Any:
    try:
        return await receive.receive()
    except anyio.EndOfStream:
        return None


def load_family(load: LoadContext) -> DiffusersImageFamily:
    """Family loader for ``model_type: diffusers`` (runs off the event loop)."""
    if load.options.load_format not in ("auto", "safetensors", "dummy"):
        raise ConfigError(f"load_format must be auto, safetensors or dummy, got {load.options.load_format!r}")
    return DiffusersImageFamily(load)
