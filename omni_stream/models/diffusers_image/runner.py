"""Image requests as step jobs: each request's pipeline call runs a model call at a time, batched by step.

The family opens one scheduler session per request (a throughput scheduler named ``image``) whose payload is a
:class:`~omni_stream.runtime.stepwise.StepJob` made here: a call of the adapter's pipeline (a copy of it with its
own noise scheduler) for the request's rows. :class:`~omni_stream.runtime.stepwise.StepwiseModel` runs it in a
greenlet and parks it at every denoiser call and at the VAE decode, so one worker step is one denoising step (or
one decode) of every request of one shape parked there: a request joins the running batch at the next step, at
its own timestep, and leaves it when it is done or released (its greenlet is killed: nothing of it is stepped
after the step in progress, and its latents are freed).

``callback_on_step_end`` is the request's own step hook, on the worker thread in its resume: it decodes a preview
(row 0 of the request: the scheduler's estimate of the finished latents, ``Adapter.preview_latents``) after the
steps due one (:func:`~omni_stream.images.spec.preview_steps`) and emits it;
the final images are emitted after the decode. Each worker step hands the scheduler what it emitted for the
request (a tuple of :class:`~omni_stream.chunks.Image`), and the family yields them in order.

The step log (:attr:`ImageRunner.log`): ``join`` (a request started: text encoding, input latents), ``denoise``
(one batched denoiser call, the requests in it), ``decode`` (one batched VAE decode), ``done``, ``release``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from omni_stream.chunks import Image
from omni_stream.images.spec import composite, preview_steps
from omni_stream.models.diffusers_image.adapters import Adapter, Row, Shape
from omni_stream.models.diffusers_image.preview import PreviewDecoder, float_to_uint8
from omni_stream.runtime.stepwise import Emit, StepJob, StepLog, StepwiseModel, text_encoders


@dataclass(slots=True, frozen=True)
class Paint:
    """One request's work: its rows (prompt, input, seed each), shape, previews, and mask compositing inputs."""

    rows: tuple[Row, ...]
    shape: Shape
    partial_images: int
    original: np.ndarray | None = None  # uint8 (H, W, 3) input at the output size, when a mask keeps parts of it
    mask: np.ndarray | None = None  # float32 (H, W), 1 = painted


class ImageRunner:
    """The adapter's pipeline as a :class:`StepwiseModel` (``model``: the batch model of the ``image`` scheduler)."""

    def __init__(
        self,
        adapter: Adapter,
        preview: PreviewDecoder,
        *,
        max_batch_size: int = 32,
        note: Callable[[str, tuple[str, ...]], None] | None = None,
        yield_point: Callable[[], None] | None = None,
    ) -> None:
        self.adapter = adapter
        self.preview = preview
        self.model: StepwiseModel[Image] = StepwiseModel(
            adapter.intercepts(),
            max_batch_size=max_batch_size,
            note=note,
            yield_point=yield_point,
            also_yield=text_encoders(adapter.pipe),
        )

    @property
    def log(self) -> StepLog:
        return self.model.log

    def job(self, request_id: str, paint: Paint) -> StepJob[Image]:
        return StepJob(request_id, functools.partial(self._paint, paint))

    def _paint(self, paint: Paint, emit: Emit[Image]) -> None:
        """One request's pipeline call (in its greenlet): previews as its steps finish, then its images."""
        adapter = self.adapter.fork()
        shape, count = paint.shape, len(paint.rows)
        due: tuple[int, ...] = ()

        def keep_mask(picture: np.ndarray) -> np.ndarray:
            if paint.mask is None or paint.original is None:
                return picture
            return composite(picture, paint.original, paint.mask)

        def hook(pipe: Any, i: int, t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
            nonlocal due
            step = i + 1
            if step == 1:  # img2img runs fewer steps than it was asked
                due = preview_steps(int(getattr(pipe, "num_timesteps", shape.steps)), paint.partial_images)
            if step in due:
                latents = adapter.unpack(adapter.preview_latents(kwargs["latents"])[:1], shape)
                picture = self.preview.decode(latents, shape.width, shape.height)[0]
                emit(Image(keep_mask(picture), partial=True, index=0, count=count, meta={"step": str(step)}))
            return {}

        try:
            pixels = float_to_uint8(adapter.call(paint.rows, shape, hook))
        finally:
            if adapter.denoised is not None:
                adapter.denoised.clear()
        for index in range(count):
            emit(Image(keep_mask(pixels[index]), partial=False, index=index, count=count))
