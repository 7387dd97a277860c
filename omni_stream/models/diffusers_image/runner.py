"""Batched diffusion calls on the device thread: one pipeline call per batch of same-shape jobs.

The family queues each request as a :class:`Job` with ``worker.submit_batched(shape, job, runner.run)``: every
job of one shape pending when the worker looks runs in one call (at most ``max_rows`` images a call; more run in
further calls). ``callback_on_step_end`` is the runner's step hook, on the device thread:

- it drops the jobs cancelled since the last step (their consumer left; :meth:`Job.cancel` is a flag the loop sets
  synchronously), and when no job of the call is left it raises, which ends the pipeline call at once and frees
  its latents: a cancelled request is never stepped again after the step in progress;
- it decodes previews for the jobs due one at this step (:func:`~omni_stream.images.spec.preview_steps`) and hands
  them, and after the call the final images, to the loop with ``loop.call_soon_threadsafe`` into the job's
  channel, which holds every item a job can get (previews + images + one failure), so a hand-over never blocks.

A job cancelled while others of its call continue gets nothing more and is not logged as stepped again, but its
row stays in the batch tensors until the call ends: diffusers fixes a call's batch when it starts.

``record=True`` logs ``("step", step, request_ids)`` per finished step (1-based), ``("drop", request_id, step)``,
``("interrupted", step)`` and ``("done", request_ids)``; ``on_step(step, request_ids)`` (tests) runs after each
logged step on the device thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni_stream.chunks import Image
from omni_stream.images.spec import composite, preview_steps
from omni_stream.models.diffusers_image.adapters import Adapter, Row, Shape
from omni_stream.models.diffusers_image.preview import PreviewDecoder, float_to_uint8

log = logging.getLogger(__name__)


class _Interrupted(Exception):
    """Raised from the step hook when no job of the call is left."""


def _put(send: Any, item: object) -> None:
    with contextlib.suppress(Exception):  # the stage has left (closed or broken channel): nobody reads it
        send.send_nowait(item)


@dataclass(slots=True, eq=False)
class Job:
    """One request's images in a batched call, and the channel its chunks go back through."""

    request_id: str
    rows: tuple[Row, ...]
    shape: Shape
    partial_images: int
    loop: asyncio.AbstractEventLoop
    send: Any  # the stage's MemoryObjectSendStream
    original: np.ndarray | None = None  # uint8 (H, W, 3) input at the output size, when a mask keeps parts of it
    mask: np.ndarray | None = None  # float32 (H, W), 1 = painted
    cancelled: bool = False  # set on the loop, read on the device thread (a plain flag: one writer, GIL-atomic)
    steps_done: int = 0
    previews: tuple[int, ...] = field(default=())

    def cancel(self) -> None:
        """Stop at the next step end (synchronous: safe in a cancelled ``finally`` and in ``ctx`` releases)."""
        self.cancelled = True

    def deliver(self, item: Image) -> None:
        """Hand a chunk to the stage (device thread)."""
        with contextlib.suppress(RuntimeError):  # loop closed: nobody waits
            self.loop.call_soon_threadsafe(_put, self.send, item)


class BatchRunner:
    """Runs jobs through one adapter's pipeline; ``running_rows`` is the call in progress (0 when idle)."""

    def __init__(self, adapter: Adapter, preview: PreviewDecoder, *, max_rows: int = 32, record: bool = False) -> None:
        self.adapter = adapter
        self.preview = preview
        self.max_rows = max(1, max_rows)
        self.record = record
        self.log: list[tuple[Any, ...]] = []
        self.on_step: Callable[[int, tuple[str, ...]], None] | None = None
        self.running_rows = 0
        self.calls = 0

    def run(self, jobs: list[Job]) -> list[None]:
        """``submit_batched``'s batch function: every job's chunks go through its channel; results are None."""
        batch: list[Job] = []
        for job in jobs:
            if job.cancelled:
                continue
            if batch and sum(len(j.rows) for j in batch) + len(job.rows) > self.max_rows:
                self._call(batch)
                batch = []
            batch.append(job)
        if batch:
            self._call(batch)
        return [None] * len(jobs)

    def _note(self, *entry: Any) -> None:
        if self.record:
            self.log.append(entry)

    def _call(self, jobs: list[Job]) -> None:
        jobs = [job for job in jobs if not job.cancelled]  # cancelled while an earlier call of the group ran
        if not jobs:
            return
        shape = jobs[0].shape
        rows = [row for job in jobs for row in job.rows]
        first_row = np.cumsum([0] + [len(job.rows) for job in jobs])[:-1].tolist()
        active = dict(enumerate(jobs))
        step_hook = self._step_hook(jobs, active, first_row, shape)
        self.running_rows, self.calls = len(rows), self.calls + 1
        try:
            images = self.adapter.call(rows, shape, step_hook)
        except _Interrupted:
            self._note("interrupted", max((j.steps_done for j in jobs), default=0) + 1)
            return
        finally:
            self.running_rows = 0
        done = []
        pixels = float_to_uint8(images)
        for k, job in active.items():
            if job.cancelled:
                continue
            start = first_row[k]
            for index in range(len(job.rows)):
                picture = pixels[start + index]
                if job.mask is not None and job.original is not None:
                    picture = composite(picture, job.original, job.mask)
                job.deliver(Image(picture, partial=False, index=index, count=len(job.rows)))
            done.append(job.request_id)
        self._note("done", tuple(done))

    def _step_hook(
        self, jobs: Sequence[Job], active: dict[int, Job], first_row: Sequence[int], shape: Shape
    ) -> Callable[[Any, int, Any, dict[str, Any]], dict[str, Any]]:
        def hook(pipe: Any, i: int, t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
            step = i + 1
            for k, job in list(active.items()):
                if job.cancelled:
                    del active[k]
                    self._note("drop", job.request_id, step)
            if not active:
                raise _Interrupted
            if step == 1:
                total = int(getattr(pipe, "num_timesteps", shape.steps))  # img2img runs fewer than it was asked
                for job in active.values():
                    job.previews = preview_steps(total, job.partial_images)
            ids = tuple(job.request_id for job in active.values())
            for job in active.values():
                job.steps_done = step
            self._note("step", step, ids)
            due = [k for k, job in active.items() if step in job.previews]
            if due:
                latents = self.adapter.unpack(kwargs["latents"][[first_row[k] for k in due]], shape)
                previews = self.preview.decode(latents, shape.width, shape.height)
                for k, picture in zip(due, previews, strict=True):
                    job = active[k]
                    if job.mask is not None and job.original is not None:
                        picture = composite(picture, job.original, job.mask)
                    job.deliver(Image(picture, partial=True, index=0, count=len(job.rows), meta={"step": str(step)}))
            if self.on_step is not None:
                self.on_step(step, ids)
            return {}

        return hook
