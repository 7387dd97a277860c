"""Video generation: the request type, its prompt-steering channel, the family protocol of ``kind == "video"`` and
the ``video`` pipeline.

A video family generates a clip a chunk at a time (chunk-autoregressive diffusion) and streams each finished chunk
as one :class:`VideoChunk` (uint8 frames ``(n, h, w, 3)``, the last chunk ``final``), so a viewer can watch the
first chunk while the next ones are generated.

Steering. A :class:`VideoRequest` carries a :class:`PromptSteering` channel: while the video streams, the caller
puts :class:`PromptUpdate` items into it (bounded; a full channel refuses) and the stage takes them between chunks,
so an update applies from the next chunk generated after it arrived. :class:`PromptSchedule` is the pure policy that
turns updates into the prompt each chunk is generated with: a hard switch (``transition_chunks=0``) or a linear blend
that reaches the new prompt in its ``transition_chunks``-th chunk; a newer update supersedes an older one, starting
from the blend reached so far. Every chunk records its :class:`ChunkPrompt` (the blend and the update events it
started, continued and completed).

Importing this module registers the kind's protocol and the ``video`` pipeline.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

import numpy as np

from omni_stream.chunks import VideoChunk
from omni_stream.context import RequestContext
from omni_stream.errors import InvalidRequestError
from omni_stream.family import ModelInfo, ModelKind
from omni_stream.pipeline import Stage
from omni_stream.pipeline_specs import Kind, ModelSet, PipelineSpec, Plan, StagePlan
from omni_stream.requests import next_request_id
from omni_stream.validation.fields import check_seed, optional_text, real, whole

PromptMix = tuple[tuple[str, float], ...]
"""A blend of prompts: ``((prompt, weight), ...)``, weights summing to 1 (the text embeddings are mixed linearly)."""

MAX_MIX_TERMS = 4  # prompts one blend may hold; interrupted blends beyond that fold into the newest terms
STEERING_CAPACITY = 8  # prompt updates a request may have queued between two chunks


@dataclass(slots=True, frozen=True)
class VideoInfo(ModelInfo):
    """A video model: its chunk size (frames: the family's own fact, Helios' 33), size rules and the defaults of a
    request. Sizes in pixels."""

    frames_per_chunk: int
    size_multiple: int = 16  # width and height must be multiples of this
    max_width: int = 1280
    max_height: int = 1280
    max_num_frames: int = 33 * 16
    max_fps: int = 60
    max_steps: int = 100
    default_width: int = 640
    default_height: int = 384
    default_fps: int = 16
    default_num_frames: int = 99
    default_steps: int = 50
    default_guidance: float = 5.0
    supports_image: bool = True


@dataclass(slots=True, frozen=True)
class PromptUpdate:
    """Steer the video to ``prompt`` from the next chunk on; ``transition_chunks``: 0 switches at once, N blends
    over N chunks (the N-th uses ``prompt`` alone)."""

    event_id: str
    prompt: str
    transition_chunks: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise InvalidRequestError("a prompt update needs a non-empty prompt", "prompt")
        if self.transition_chunks < 0:
            raise InvalidRequestError("transition_chunks must be >= 0", "transition_chunks")


class PromptSteering:
    """The bounded channel of prompt updates of one request (event-loop side only; no locks).

    The caller :meth:`offer` s updates while the video streams; the stage :meth:`take` s them between chunks.
    ``capacity`` updates may wait (default :data:`STEERING_CAPACITY`); beyond that ``offer`` refuses.
    """

    __slots__ = ("_queue", "capacity", "closed")

    def __init__(self, capacity: int = STEERING_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.closed = False
        self._queue: deque[PromptUpdate] = deque()

    def offer(self, update: PromptUpdate) -> bool:
        """Queue ``update`` for the next chunk; False when the channel is full or the video is done."""
        if self.closed or len(self._queue) >= self.capacity:
            return False
        self._queue.append(update)
        return True

    def take(self) -> list[PromptUpdate]:
        """Every queued update, oldest first (the stage calls this between chunks)."""
        updates = list(self._queue)
        self._queue.clear()
        return updates

    def close(self) -> None:
        """No more updates will be taken (the last chunk is generated)."""
        self.closed = True
        self._queue.clear()

    def __len__(self) -> int:
        return len(self._queue)


@dataclass(slots=True, frozen=True)
class VideoRequest:
    """Text (and optionally a first frame) to video. ``None`` fields take the model's defaults (:class:`VideoInfo`).

    ``width``/``height`` in pixels, ``fps`` frames per second, ``num_frames`` frames in all (the last chunk is cut
    to it), ``image``: a uint8 ``(h, w, 3)`` first-frame reference (resized to the video's size).
    """

    prompt: str
    width: int | None = None
    height: int | None = None
    fps: int | None = None
    num_frames: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    negative_prompt: str | None = None
    seed: int | None = None
    image: np.ndarray | None = None
    steering: PromptSteering = field(default_factory=PromptSteering, compare=False)
    request_id: str = field(default_factory=lambda: next_request_id("video"))

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise InvalidRequestError("prompt must be a non-empty string", "prompt")
        for name in ("width", "height", "fps", "num_frames", "num_inference_steps"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, whole(getattr(self, name), name, low=1))
        if self.guidance_scale is not None:
            g = real(self.guidance_scale, "guidance_scale")
            if g < 0:
                raise InvalidRequestError(f"guidance_scale must be a finite number >= 0, got {g!r}", "guidance_scale")
            object.__setattr__(self, "guidance_scale", g)
        optional_text(self.negative_prompt, "negative_prompt")
        object.__setattr__(self, "seed", check_seed(self.seed))
        if self.image is not None:
            img = self.image
            if not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
                raise InvalidRequestError("image must be uint8 RGB pixels of shape (h, w, 3)", "image_reference")


def resolve_request(info: VideoInfo, request: VideoRequest) -> VideoRequest:
    """``request`` with every default filled from ``info``; InvalidRequestError (naming the field) when out of range."""
    if request.steering.closed:  # its updates would be refused, silently: offer() says False and nothing more
        raise InvalidRequestError(
            "this VideoRequest has run already and its steering channel is closed: run a new one "
            "(dataclasses.replace(request, steering=PromptSteering()) copies its fields)",
            "steering",
        )
    resolved = replace(
        request,
        width=request.width or info.default_width,
        height=request.height or info.default_height,
        fps=request.fps or info.default_fps,
        num_frames=request.num_frames or info.default_num_frames,
        num_inference_steps=request.num_inference_steps or info.default_steps,
        guidance_scale=info.default_guidance if request.guidance_scale is None else float(request.guidance_scale),
    )
    m = info.size_multiple
    for name, limit in (("width", info.max_width), ("height", info.max_height)):
        value = getattr(resolved, name)
        if value % m or value > limit:
            raise InvalidRequestError(f"{name} must be a multiple of {m} up to {limit}, got {value}", name)
    assert resolved.fps is not None and resolved.num_frames is not None and resolved.num_inference_steps is not None
    if resolved.fps > info.max_fps:
        raise InvalidRequestError(f"fps must be between 1 and {info.max_fps}, got {resolved.fps}", "fps")
    if resolved.num_frames > info.max_num_frames:
        raise InvalidRequestError(
            f"num_frames must be between 1 and {info.max_num_frames}, got {resolved.num_frames}", "num_frames"
        )
    if resolved.num_inference_steps > info.max_steps:
        raise InvalidRequestError(
            f"num_inference_steps must be between 1 and {info.max_steps}, got {resolved.num_inference_steps}",
            "num_inference_steps",
        )
    if resolved.image is not None and not info.supports_image:
        raise InvalidRequestError(f"{info.model_name} takes no image reference", "image_reference")
    return resolved


def chunk_count(num_frames: int, frames_per_chunk: int) -> int:
    """Chunks a video of ``num_frames`` frames takes (the last one is cut to fit)."""
    return max(1, -(-num_frames // frames_per_chunk))


# --- prompt steering policy -----------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class ChunkPrompt:
    """The prompt one chunk is generated with: ``mix`` (``((prompt, weight), ...)``), the newest ``prompt`` in it,
    and the update events this chunk ``started``, had ``active`` (blending in) and ``completed`` (target reached,
    or superseded by a newer update)."""

    mix: PromptMix
    started: tuple[str, ...] = ()
    active: tuple[str, ...] = ()
    completed: tuple[str, ...] = ()

    @property
    def prompt(self) -> str:
        return self.mix[-1][0]

    @property
    def weight(self) -> float:
        """The newest prompt's weight (1.0: the chunk uses it alone)."""
        return self.mix[-1][1]


def blend(source: PromptMix, target: str, weight: float) -> PromptMix:
    """``(1 - weight) * source + weight * target``, terms of one prompt merged, the newest last, pruned."""
    terms: dict[str, float] = {}
    for prompt, w in source:
        terms[prompt] = terms.get(prompt, 0.0) + (1.0 - weight) * w
    terms.pop(target, None)
    kept = [(p, w) for p, w in terms.items() if w > 1e-9][-(MAX_MIX_TERMS - 1) :]
    rest = 1.0 - weight - sum(w for _, w in kept)
    # What pruning dropped goes to the target, so the weights still sum to 1.
    return (*kept, (target, weight + max(0.0, rest)))


@dataclass(slots=True)
class _Transition:
    event_id: str
    target: str
    source: PromptMix
    chunks: int  # 0: at once
    done: int = 0


class PromptSchedule:
    """Which prompt each chunk is generated with, as updates arrive (pure; one per request)."""

    __slots__ = ("current", "transition")

    def __init__(self, prompt: str) -> None:
        self.current: PromptMix = ((prompt, 1.0),)
        self.transition: _Transition | None = None

    def next_chunk(self, updates: Sequence[PromptUpdate] = ()) -> ChunkPrompt:
        """The next chunk's prompt, after ``updates`` (oldest first) arrived since the previous chunk."""
        started: list[str] = []
        completed: list[str] = []
        if updates:
            if self.transition is not None:
                completed.append(self.transition.event_id)  # superseded mid-blend
            completed += [u.event_id for u in updates[:-1]]  # superseded before they began
            newest = updates[-1]
            self.transition = _Transition(newest.event_id, newest.prompt, self.current, newest.transition_chunks)
            started.append(newest.event_id)
        active: list[str] = []
        t = self.transition
        if t is not None:
            t.done += 1
            weight = 1.0 if t.chunks == 0 else min(1.0, t.done / t.chunks)
            self.current = blend(t.source, t.target, weight)
            active.append(t.event_id)
            if weight >= 1.0:
                self.current = ((t.target, 1.0),)
                completed.append(t.event_id)
                self.transition = None
        return ChunkPrompt(self.current, tuple(started), tuple(active), tuple(completed))


# --- chunks, the family protocol, the pipeline ------------------------------------------------------------------


@runtime_checkable
class VideoFamily(Protocol):
    """``kind == "video"``: ``video_stage`` returns, for a request the engine resolved (:func:`resolve_request`
    against ``info``), one stage yielding :class:`VideoChunk` (the last ``final``), which reads ``request.steering``
    between chunks and counts ``ctx.tokens("video")`` (prompt tokens in, frames out). Closing it frees the request at
    once."""

    info: VideoInfo

    def video_stage(self, request: VideoRequest, ctx: RequestContext) -> Stage[object, VideoChunk]: ...

    async def aclose(self) -> None: ...


def video_family(models: ModelSet) -> VideoFamily:
    family = models.get(ModelKind.VIDEO)
    assert isinstance(family, VideoFamily)  # checked when it was loaded
    return family


def resolve_video(models: ModelSet, request: VideoRequest, voices: object = None) -> VideoRequest:
    """The engine's resolution of a video request against the loaded video model (:func:`resolve_request`)."""
    return resolve_request(video_family(models).info, request)


def build_video(models: ModelSet, request: VideoRequest, ctx: RequestContext) -> Plan:
    return Plan((StagePlan("video", video_family(models).video_stage(request, ctx)),))


VIDEO = PipelineSpec(
    "video",
    VideoRequest,
    (ModelKind.VIDEO,),
    build_video,
    description="text (+ image) -> video",
    resolve=resolve_video,
)

KIND = Kind(ModelKind.VIDEO, VideoFamily, (VIDEO,))  # listed in omni_stream.kinds
