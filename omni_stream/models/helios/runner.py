"""Helios one chunk at a time, every session's chunk a step job: one transformer call per step for all sessions.

``HeliosPipeline.__call__`` generates every chunk of a video in one loop, so one call would hold the device (and
every other model on it) until the whole clip is done, and a reader that stalls could only stall the worker. We
run the unmodified pipeline once per chunk instead, handing it the request's history the way its own loop would:

- chunk 0 is a plain call with ``num_frames`` = one chunk (33 frames);
- chunk k > 0 passes the latents generated so far as ``video_latents`` (the pipeline's video-to-video input, with
  its noising off) and the first latent frame as ``image_latents`` (the prefix its loop keeps), so the call
  rebuilds exactly the history window its loop would have at chunk k. Only the last ``sum(history_sizes)`` (19)
  latent frames are ever read, so that is all a request keeps.

The same generator is drawn from in the same order, so the concatenated chunks equal one whole-video call
(``tests/test_video_helios.py`` checks it, text-to-video and image-to-video). Between chunks a request holds no
worker time: a stalled reader parks only its own request.

Sessions batched. A chunk is a :class:`~omni_stream.runtime.stepwise.StepJob` (:meth:`HeliosRunner.job`): the
family's ``video`` scheduler runs it through :attr:`HeliosRunner.model`, which parks it at every transformer call
and at the VAE decode; one worker step is one transformer call for every session of one shape parked there (their
noisy latents, timesteps, prompt embeddings and history latents stacked; each session's own steering prompt), or
one batched decode. A session joins at its next chunk and leaves after it, at its own denoising step: it never
waits for another session's whole chunk. Batched or alone, a session's frames are the same (the test checks it).

Cancellation: releasing a request's chunk kills its job before the next step (the scheduler's release). The
:class:`StepLog` records per request ``chunk`` (a chunk job began), ``denoise`` (a transformer call it was in),
``decode`` and ``release``; the step entries and :meth:`ChunkState.cancel` take one lock (the worker's), so no step
of a request ever follows its ``release`` event.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections import deque
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omni_stream.runtime.stepwise import Emit, Intercept, StepJob, StepwiseModel, own_scheduler, text_encoders
from omni_stream.video.spec import ChunkPrompt

HISTORY_FRAMES = sum((16, 2, 1))  # HeliosPipeline's default history_sizes: what one chunk reads of the past
LATENT_FRAMES_PER_CHUNK = 9  # HeliosPipeline's default num_latent_frames_per_chunk
# HeliosPipeline's image-to-video defaults (image_noise_sigma_* for the image, video_noise_sigma_* for its stand-in).
IMAGE_NOISE_SIGMA = (0.111, 0.135)
STEP_LOG_SIZE = 20_000
# HeliosTransformer3DModel.forward's per-session arguments (the frame indices are shared: equal for every session)
TRANSFORMER_ROWS = (
    "hidden_states",
    "timestep",
    "encoder_hidden_states",
    "latents_history_short",
    "latents_history_mid",
    "latents_history_long",
)
_KINDS = {"join": "chunk", "denoise": "denoise", "decode": "decode"}  # stepwise events -> this log's kinds


@dataclass(slots=True, frozen=True)
class StepEvent:
    """One entry of the step log: ``kind`` is ``chunk`` (a chunk job began), ``denoise`` (a transformer call),
    ``decode`` (a VAE decode) or ``release`` (the request was released: nothing of it runs after)."""

    seq: int
    request_id: str
    chunk: int
    kind: str


class StepLog:
    """The last :data:`STEP_LOG_SIZE` model steps of every request, in the order they began (thread-safe)."""

    def __init__(self, size: int = STEP_LOG_SIZE) -> None:
        self._events: deque[StepEvent] = deque(maxlen=size)
        self._seq = itertools.count()
        self._lock = threading.Lock()  # the worker appends while the loop (or a test) reads

    def add(self, request_id: str, chunk: int, kind: str) -> None:
        with self._lock:
            self._events.append(StepEvent(next(self._seq), request_id, chunk, kind))

    def of(self, request_id: str) -> list[StepEvent]:
        with self._lock:
            events = list(self._events)
        return [e for e in events if e.request_id == request_id]


@dataclass(eq=False)
class ChunkState:
    """One request's generation state: its generator, history latents, prompt embeddings, cancel flag.

    Created and released on the event loop; read and advanced on the worker thread, one chunk job at a time.
    ``lock``: the one that step log entries are made under (the device worker's).
    """

    request_id: str
    width: int
    height: int
    steps: int
    guidance: float
    generator: torch.Generator
    negative_prompt: str | None
    image: np.ndarray | None
    log: StepLog
    lock: AbstractContextManager[Any]
    chunk: int = 0
    cancelled: bool = False
    history: torch.Tensor | None = None  # the last HISTORY_FRAMES generated latent frames
    first: torch.Tensor | None = None  # the prefix latent frame (the first generated, or the image's)
    embeds: dict[str, torch.Tensor] = field(default_factory=dict)
    negative: torch.Tensor | None = None

    def cancel(self) -> None:
        """Log the request's release (its chunk session, released with it, stops before its next step).
        Idempotent; any thread."""
        with self.lock:
            if not self.cancelled:
                self.cancelled = True
                self.log.add(self.request_id, self.chunk, "release")


@dataclass(slots=True, frozen=True)
class ChunkResult:
    frames: np.ndarray  # uint8 (n, h, w, 3)
    prompt_tokens: int  # tokens of the prompts encoded for this chunk (new ones only)


class HeliosRunner:
    """Runs chunk jobs of a ``HeliosPipeline``: :attr:`model` is the batch model of the family's ``video`` scheduler.

    ``lock``: held while steps are logged (the device worker's lock); ``note(kind, labels)``: a copy of every
    step event (the worker's log); ``yield_point``: the worker's, called between the models' blocks.
    :meth:`generate_chunk` also runs directly (tests), as one call.
    """

    def __init__(
        self,
        pipe: Any,
        device: str,
        max_sequence_length: int = 512,
        *,
        max_batch_size: int = 32,
        lock: AbstractContextManager[Any] | None = None,
        note: Any = None,
        yield_point: Any = None,
    ) -> None:
        self.pipe = pipe
        self.device = device
        self.max_sequence_length = max_sequence_length
        self.log = StepLog()
        self.lock: AbstractContextManager[Any] = lock if lock is not None else threading.RLock()
        self.frames_per_chunk = (LATENT_FRAMES_PER_CHUNK - 1) * pipe.vae_scale_factor_temporal + 1
        self._note = note
        self._yield: Any = yield_point if yield_point is not None else (lambda: None)
        intercepts = [
            Intercept("denoise", pipe.transformer, "forward", TRANSFORMER_ROWS),
            Intercept("decode", pipe.vae, "decode", ("z",), fine=True),
        ]
        self.model: StepwiseModel[ChunkResult] = StepwiseModel(
            intercepts,
            max_batch_size=max_batch_size,
            note=self._step,
            guard=self.lock,
            yield_point=yield_point,
            also_yield=text_encoders(pipe),  # the prompt's umT5 in a join step
        )

    def _step(self, kind: str, labels: tuple[str, ...]) -> None:
        """A stepwise event (under the lock for steps): one log entry per request it concerned."""
        name = _KINDS.get(kind)
        if name is not None:
            for label in labels:
                request_id, _, chunk = label.rpartition("/")
                self.log.add(request_id, int(chunk), name)
        if self._note is not None:
            self._note(kind, labels)

    def job(self, state: ChunkState, prompt: ChunkPrompt, keep: int) -> StepJob[ChunkResult]:
        """``state``'s next chunk as a step job (its result: the :class:`ChunkResult`)."""
        run = functools.partial(self._chunk_job, state, prompt, keep)
        return StepJob(f"{state.request_id}/{state.chunk}", run)

    def _chunk_job(self, state: ChunkState, prompt: ChunkPrompt, keep: int, emit: Emit[ChunkResult]) -> ChunkResult:
        return self.generate_chunk(state, prompt, keep)

    def new_state(
        self,
        request_id: str,
        *,
        width: int,
        height: int,
        steps: int,
        guidance: float,
        seed: int | None,
        negative_prompt: str | None = None,
        image: np.ndarray | None = None,
    ) -> ChunkState:
        generator = torch.Generator(device=self.device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
        return ChunkState(
            request_id, width, height, steps, guidance, generator, negative_prompt, image, self.log, self.lock
        )

    # --- worker thread ---

    def _encode(self, text: str) -> tuple[torch.Tensor, int]:
        embeds, _ = self.pipe.encode_prompt(
            text, do_classifier_free_guidance=False, max_sequence_length=self.max_sequence_length, device=self.device
        )
        tokens = len(self.pipe.tokenizer(text, truncation=True, max_length=self.max_sequence_length).input_ids)
        return embeds, tokens

    def _prompt_embeds(self, state: ChunkState, mix: Sequence[tuple[str, float]]) -> tuple[torch.Tensor, int]:
        tokens = 0
        for text, _ in mix:
            if text not in state.embeds:
                state.embeds[text], n = self._encode(text)
                tokens += n
        for text in [t for t in state.embeds if t not in {p for p, _ in mix}]:
            del state.embeds[text]  # only the prompts of the current blend are kept
        if len(mix) == 1:
            return state.embeds[mix[0][0]], tokens
        # The text embeddings are mixed linearly (what a prompt transition interpolates).
        return sum((w * state.embeds[t] for t, w in mix), torch.zeros_like(state.embeds[mix[0][0]])), tokens

    def _image_latents(self, state: ChunkState, image: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The noised image latents and their stand-in frame, as HeliosPipeline's step "4. Prepare image" makes
        them (same helpers, same draws from the generator, in the same order)."""
        from PIL import Image as PILImage

        pipe = self.pipe
        vae = pipe.vae
        mean = torch.tensor(vae.config.latents_mean).view(1, vae.config.z_dim, 1, 1, 1).to(self.device, vae.dtype)
        std = 1.0 / torch.tensor(vae.config.latents_std).view(1, vae.config.z_dim, 1, 1, 1).to(self.device, vae.dtype)
        pixels = pipe.video_processor.preprocess(PILImage.fromarray(image), height=state.height, width=state.width)
        latents, fake = pipe.prepare_image_latents(
            pixels, mean, std, LATENT_FRAMES_PER_CHUNK, dtype=torch.float32, device=self.device,
            generator=state.generator,
        )  # fmt: skip
        g, lo, hi = state.generator, *IMAGE_NOISE_SIGMA
        sigma = torch.rand(1, device=self.device, generator=g) * (hi - lo) + lo
        latents = sigma * torch.randn(latents.shape, generator=g, device=self.device) + (1 - sigma) * latents
        sigma = torch.rand(1, device=self.device, generator=g) * (hi - lo) + lo
        fake = sigma * torch.randn(fake.shape, generator=g, device=self.device) + (1 - sigma) * fake
        return latents, fake

    @torch.no_grad()
    def generate_chunk(self, state: ChunkState, prompt: ChunkPrompt, keep: int) -> ChunkResult:
        """Generate ``state``'s next chunk with ``prompt``; its first ``keep`` frames as uint8 ``(n, h, w, 3)``."""
        pipe = own_scheduler(self.pipe)  # the call's loop state is its own: other sessions' calls interleave
        embeds, tokens = self._prompt_embeds(state, prompt.mix)
        kwargs: dict[str, Any] = {}
        cfg = state.guidance > 1.0
        if cfg and state.negative is None:
            state.negative, n = self._encode(state.negative_prompt or "")
            tokens += n
        stand_in = None
        if state.history is not None:
            kwargs.update(video_latents=state.history, add_noise_to_video_latents=False)
            kwargs.update(image_latents=state.first, add_noise_to_image_latents=False)
        elif state.image is not None:
            state.first, stand_in = self._image_latents(state, state.image)
            kwargs.update(image_latents=state.first, fake_image_latents=stand_in, add_noise_to_image_latents=False)
        final: list[torch.Tensor] = []

        def keep_latents(pipe: Any, i: int, t: Any, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
            final[:] = [tensors["latents"]]
            return {}

        (video,) = pipe(
            prompt_embeds=embeds,
            negative_prompt_embeds=state.negative if cfg else None,
            height=state.height,
            width=state.width,
            num_frames=self.frames_per_chunk,
            num_inference_steps=state.steps,
            guidance_scale=state.guidance,
            generator=state.generator,
            output_type="pt",
            return_dict=False,
            callback_on_step_end=keep_latents,
            max_sequence_length=self.max_sequence_length,
            **kwargs,
        )
        latents = final[0]
        if state.history is None:
            if state.first is None:
                state.first = latents[:, :, 0:1]  # the pipeline keeps the first frame as the prefix
            past = [stand_in] if stand_in is not None else []
            state.history = torch.cat([*past, latents], dim=2)
        else:
            state.history = torch.cat([state.history, latents], dim=2)
        state.history = state.history[:, :, -HISTORY_FRAMES:]
        state.chunk += 1
        self._yield()  # full-size elementwise passes follow, outside any model's blocks
        frames = video[0, :keep].mul(255).round_().clamp_(0, 255).to(torch.uint8)  # (n, 3, h, w), 1/4 the size
        result = ChunkResult(frames.permute(0, 2, 3, 1).contiguous().cpu().numpy(), tokens)
        self._yield()
        return result
