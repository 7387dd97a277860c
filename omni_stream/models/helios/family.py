"""The Helios family: chunk-autoregressive video diffusion (diffusers' ``HeliosPipeline``) as a ``video`` model.

Loading (off the event loop): the diffusers-layout checkpoint (:mod:`.checkpoint`), random weights at its sizes
with ``load_format="dummy"``, and ``video_defaults.json`` when the checkpoint has one. Each request runs one stage,
which opens one session per chunk on the family's ``video`` scheduler (a throughput scheduler on the device worker:
sessions of one shape share one transformer call per denoising step, :mod:`.runner`) and yields each chunk's frames
as a :class:`~omni_stream.video.spec.VideoChunk` as soon as it is decoded. A session's next chunk queues ahead of
new sessions; a new session waits (in the ``video`` waiting gauge) while a step with it would not fit in the live
speech streams' slack.

Run-ahead bound. The stage submits chunk k + 1 only after its consumer took chunk k (the pipeline's edges hold no
chunk: a sender waits for its receiver), so a request that is not read holds at most one generated chunk in the
stage's hands and its latent history, and no worker time. Cancellation (closing the stream, ``ctx.cancel()``, a
deadline) releases the request synchronously: a chunk job in progress stops before its next denoising step.

``embedded_default_checkpoint()`` builds the tiny random-weight checkpoint served when no video model is given.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from omni_stream.context import RequestContext
from omni_stream.device_policy import WorkClass
from omni_stream.errors import ConfigError, StageError
from omni_stream.family import LoadContext, ModelKind
from omni_stream.models.helios.checkpoint import (
    embedded_default_checkpoint,
    info_fields,
    load_pipeline,
    read_defaults,
)
from omni_stream.models.helios.runner import ChunkState, HeliosRunner, StepLog
from omni_stream.pipeline import Stage
from omni_stream.runtime.cache import EMBEDDED_MARKER
from omni_stream.runtime.weights import parse_dtype
from omni_stream.scheduler import Scheduler
from omni_stream.video.spec import (
    PromptSchedule,
    VideoChunk,
    VideoInfo,
    VideoRequest,
    chunk_count,
)
from omni_stream.worker import DeviceWorker

HIGH_WATERMARK = 2  # a chunk session yields one item (its chunk); the buffer never fills

__all__ = ["HeliosFamily", "embedded_default_checkpoint", "load_family"]

log = logging.getLogger(__name__)


class HeliosFamily:
    """A loaded Helios checkpoint. ``runner`` (its pipeline and step log) is public for tests and benchmarks."""

    def __init__(self, load: LoadContext) -> None:
        opts = load.options
        ckpt = load.checkpoint
        self.worker: DeviceWorker = load.worker
        self.embedded = (ckpt / EMBEDDED_MARKER).exists()
        defaults = read_defaults(ckpt)
        known = info_fields()
        unknown = set(defaults) - known - {"max_sequence_length"}
        if unknown:
            raise ConfigError(f"{ckpt / 'video_defaults.json'}: unknown fields {', '.join(sorted(unknown))}")
        with opts.progress_bar(total=1, desc=f"loading {ckpt.name}", unit="model") as bar:
            dtype = parse_dtype(opts.dtype, opts.device)
            pipe = load_pipeline(ckpt, opts.device, dtype, opts.load_format, opts.progress)
            bar.update(1)
        worker = load.worker

        def note(kind: str, labels: tuple[str, ...]) -> None:
            worker.note(kind, "video", WorkClass.THROUGHPUT, *labels)

        self.runner = HeliosRunner(
            pipe,
            opts.device,
            int(defaults.get("max_sequence_length", 512)),
            max_batch_size=opts.max_batch_size,
            lock=worker.cond,
            note=note,
            yield_point=worker.yield_point,
        )
        self.scheduler = Scheduler(
            self.runner.model,
            worker,
            high_watermark=HIGH_WATERMARK,
            metrics=load.metrics.scheduler("video"),
            name="video",
            work_class=WorkClass.THROUGHPUT,
        )
        name = ckpt.name or "helios"
        self.info = VideoInfo(
            model_name=name,
            model_type=type(pipe).__name__,
            kind=ModelKind.VIDEO,
            frames_per_chunk=self.runner.frames_per_chunk,
            size_multiple=16,  # HeliosPipeline.check_inputs
            **{k: v for k, v in defaults.items() if k in known and k not in ("model_name", "model_type", "kind")},
        )
        self._live: set[ChunkState] = set()
        if self.embedded:
            log.warning("serving the embedded tiny video model %s: random weights, it draws noise", name)

    @property
    def step_log(self) -> StepLog:
        return self.runner.log

    def live(self) -> dict[str, int]:
        """Per-request state still held: requests with a generation state, the scheduler's, started chunk calls."""
        return {"requests": len(self._live), **self.scheduler.live(), "calls": self.runner.model.running}

    def video_stage(self, request: VideoRequest, ctx: RequestContext) -> Stage[object, VideoChunk]:
        """The stage of ``request``, resolved by the engine (video.spec.resolve_request)."""
        assert request.num_frames is not None and request.fps is not None
        assert request.width is not None and request.height is not None
        assert request.num_inference_steps is not None and request.guidance_scale is not None
        total, fps = request.num_frames, request.fps
        per_chunk = self.info.frames_per_chunk
        chunks = chunk_count(total, per_chunk)
        runner, scheduler = self.runner, self.scheduler
        width, height = request.width, request.height
        steps, guidance = request.num_inference_steps, request.guidance_scale

        async def video(ctx: RequestContext, upstream: AsyncIterator[object]) -> AsyncIterator[VideoChunk]:
            state = runner.new_state(
                request.request_id, width=width, height=height, steps=steps, guidance=guidance,
                seed=request.seed, negative_prompt=request.negative_prompt, image=request.image,
            )  # fmt: skip
            self._live.add(state)
            unregister = ctx.add_release(state.cancel)
            usage = ctx.tokens(ModelKind.VIDEO)
            schedule = PromptSchedule(request.prompt)
            try:
                for k in range(chunks):
                    prompt = schedule.next_chunk(request.steering.take())  # updates apply from this chunk on
                    final = k == chunks - 1
                    if final:
                        request.steering.close()
                    keep = min(per_chunk, total - k * per_chunk)
                    result = None
                    async with scheduler.session(runner.job(state, prompt, keep), ctx, continuing=k > 0) as chunk:
                        async for items in chunk:
                            (result,) = items
                    if result is None:
                        raise StageError(f"request {ctx.request_id}: chunk {k} ended without its frames")
                    usage.input_tokens += result.prompt_tokens
                    usage.output_tokens += keep
                    yield VideoChunk(result.frames, k, k * per_chunk, fps, prompt, final)
            finally:
                unregister()
                state.cancel()
                self._live.discard(state)
                request.steering.close()

        return video

    async def aclose(self) -> None:
        """Log every open request's release; the scheduler, shut down by the engine's worker, frees their chunks."""
        for state in list(self._live):
            state.cancel()


def load_family(load: LoadContext) -> HeliosFamily:
    """Family loader for diffusers' ``HeliosPipeline`` checkpoints (runs off the event loop)."""
    return HeliosFamily(load)
