"""Typed chunks that flow between pipeline stages.

Every stage consumes and produces these; they are frozen and slotted so a chunk can be shared
between tasks and threads without copying or locking. Array payloads are never mutated after a
chunk is built (producers hand over fresh arrays).

:data:`Chunk` lists every kind a stage produces (a video chunk's prompt record, ``ChunkPrompt``, is the video
pipeline's own: :mod:`omni_stream.video.spec`). Every kind says whether it is the last chunk of its stage
(``final``; for images, a non-partial image), so a consumer of several stages' outputs knows when each stage is
done without waiting for the next chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Generic, TypeVar

import numpy as np
import torch

from omni_stream.text.logprobs import TokenLogprob
from omni_stream.text.tools import ToolCallDelta

if TYPE_CHECKING:
    from omni_stream.video.spec import ChunkPrompt


def _summary(value: object) -> str:
    """An array as its dtype and shape (a chunk's repr must not print every sample or pixel); else its repr."""
    if isinstance(value, np.ndarray | torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return f"{dtype}{tuple(value.shape)}"
    return repr(value)


def _repr(chunk: object) -> str:
    body = ", ".join(f"{f.name}={_summary(getattr(chunk, f.name))}" for f in fields(chunk))  # type: ignore[arg-type]
    return f"{type(chunk).__name__}({body})"


@dataclass(slots=True, frozen=True)
class TextDelta:
    """A piece of generated text (AR text stages, ASR). The last one carries ``final`` and why it ended
    (``finish_reason``: ``"stop"`` at EOS or a stop string, ``"length"`` at the token budget, ``"tool_calls"``
    when the reply called tools). ``tool_calls``: pieces of the reply's tool calls (their text is not in ``text``,
    so a spoken reply never speaks them); ``logprobs``: the tokens' log-probabilities when the request asked;
    ``cut_call`` (the last delta only): the text of a tool call the reply ran out of tokens in, which is neither a
    call nor text to speak (a chat completion's content ends with it, as vLLM's does). ``index``: the generated
    token this delta ends at (a delta that waited for the rest of a character, or for a tool call, covers several,
    so indexes may skip)."""

    text: str
    index: int = 0
    final: bool = False
    finish_reason: str | None = None
    tool_calls: tuple[ToolCallDelta, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()
    cut_call: str = ""


@dataclass(slots=True, frozen=True, repr=False)
class CodecFrames:
    """Codec codes for one or more frames of one request: ``codes`` is ``[n_frames, n_codebooks]`` int64 (CPU)."""

    codes: torch.Tensor
    start_frame: int = 0
    final: bool = False

    __repr__ = _repr

    @property
    def n_frames(self) -> int:
        return int(self.codes.shape[0])


@dataclass(slots=True, frozen=True, repr=False)
class Audio:
    """PCM audio: float32 in [-1, 1], shape ``(n,)`` mono or ``(n, channels)``; ``sample_rate`` in Hz."""

    samples: np.ndarray
    sample_rate: int
    start_sample: int = 0
    final: bool = False

    __repr__ = _repr

    def __post_init__(self) -> None:
        if self.samples.dtype != np.float32:
            raise TypeError(f"Audio.samples must be float32, got {self.samples.dtype}")
        if self.samples.ndim not in (1, 2):
            raise ValueError(f"Audio.samples must be (n,) or (n, channels), got shape {self.samples.shape}")
        rate = self.sample_rate
        if isinstance(rate, bool) or not isinstance(rate, int | np.integer) or rate <= 0:
            raise ValueError(f"Audio.sample_rate must be a positive integer, got {rate!r}")
        if not isinstance(rate, int):
            object.__setattr__(self, "sample_rate", int(rate))

    @property
    def channels(self) -> int:
        return 1 if self.samples.ndim == 1 else int(self.samples.shape[1])

    @property
    def n_samples(self) -> int:
        return int(self.samples.shape[0])

    @property
    def duration(self) -> float:
        """Seconds of audio in this chunk."""
        return self.n_samples / self.sample_rate


@dataclass(slots=True, frozen=True, repr=False)
class Image:
    """An image as uint8 ``(h, w, c)``; ``partial`` marks a preview before the final one.

    A request for several images yields them in order: ``index`` of ``count``; the stage's last chunk is the
    last image (previews show image ``index`` while it forms).
    """

    pixels: np.ndarray
    partial: bool = False
    meta: dict[str, str] = field(default_factory=dict)
    index: int = 0
    count: int = 1

    __repr__ = _repr

    @property
    def final(self) -> bool:
        return not self.partial and self.index == self.count - 1


@dataclass(slots=True, frozen=True, repr=False)
class VideoChunk:
    """One generated chunk: uint8 ``frames`` ``(n, h, w, 3)``, its ``index`` and first frame number, the playback
    rate (``fps``), the prompt it was generated with; ``final`` on the last chunk of the video."""

    frames: np.ndarray
    index: int
    start_frame: int
    fps: int
    prompt: ChunkPrompt
    final: bool = False

    __repr__ = _repr

    def __post_init__(self) -> None:
        f = self.frames
        if f.dtype != np.uint8 or f.ndim != 4 or f.shape[3] != 3 or f.shape[0] < 1:
            raise ValueError(f"VideoChunk.frames must be uint8 (n, h, w, 3), got {f.dtype} {f.shape}")

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])

    @property
    def pts(self) -> float:
        """Presentation time of the first frame, seconds."""
        return self.start_frame / self.fps

    @property
    def duration(self) -> float:
        """Seconds of video in this chunk."""
        return self.num_frames / self.fps


Chunk = TextDelta | CodecFrames | Audio | Image | VideoChunk
"""What a stage yields: text (AR text, ASR), codec codes and audio (speech), images, video chunks."""

C_co = TypeVar("C_co", covariant=True)


@dataclass(slots=True, frozen=True)
class StageOutput(Generic[C_co]):
    """One chunk a pipeline hands its consumer: which ``stage`` made it, and whether it is that stage's ``last``."""

    stage: str
    chunk: C_co
    last: bool


def is_final(chunk: object) -> bool:
    """Whether ``chunk`` is its stage's last (chunks without a ``final`` flag never are)."""
    return bool(getattr(chunk, "final", False))
