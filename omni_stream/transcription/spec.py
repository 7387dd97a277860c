"""Transcription (ASR): the request type, the family protocol of ``kind == "transcription"``, and its pipeline.

A transcription family turns speech into :class:`~omni_stream.chunks.TextDelta` chunks (the last one ``final``).
``TranscriptionRequest.audio`` is either the whole utterance (float32 mono samples at ``sample_rate`` Hz, what a
turn-based voice agent has at the end of a turn) or an async iterator of :class:`~omni_stream.chunks.Audio`
chunks (a live stream); the pipeline feeds the iterator to the stage as its upstream.

Importing this module registers the kind's protocol and the ``transcription`` pipeline.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

import numpy as np

from omni_stream.chunks import Audio, TextDelta
from omni_stream.codecs.resample import MAX_RATE
from omni_stream.context import RequestContext
from omni_stream.errors import InvalidRequestError
from omni_stream.family import ModelInfo, ModelKind
from omni_stream.pipeline import Stage
from omni_stream.pipeline_specs import Kind, ModelSet, PipelineSpec, Plan, StagePlan
from omni_stream.requests import next_request_id
from omni_stream.validation.audio import mono_float
from omni_stream.validation.fields import optional_text, whole


@dataclass(slots=True, frozen=True)
class TranscriptionInfo(ModelInfo):
    """An ASR model: the ``sample_rate`` (Hz) it listens at, the languages it knows (empty: any), and the longest
    audio one request may carry (None: no bound; longer recordings go window by window,
    :mod:`omni_stream.transcription.long_form`)."""

    sample_rate: int = 16000
    languages: tuple[str, ...] = ()
    max_seconds: float | None = None


class Task(StrEnum):
    """What the text is: the speech's own words, or their English translation (Whisper's two tasks)."""

    TRANSCRIBE = "transcribe"
    TRANSLATE = "translate"


@dataclass(slots=True, frozen=True)
class TranscriptionRequest:
    """Speech to text. ``audio``: mono samples at ``sample_rate`` Hz, float in [-1, 1] or int16 PCM (stored as
    float32: :mod:`omni_stream.validation.audio`), or streamed Audio chunks (any rate). ``task``: the words, or
    their English translation (a model that cannot translate refuses it, naming ``model``)."""

    audio: np.ndarray | AsyncIterator[Audio]
    sample_rate: int = 16000
    language: str | None = None  # None: detect (or the model's only language)
    prompt: str | None = None  # text that came before (context for the decoder)
    max_tokens: int | None = None
    task: Task = Task.TRANSCRIBE
    # A recording's transcript, not a conversation's turn: it queues behind conversational requests on the model's
    # scheduler and holds at most its bulk share of batch slots (Scheduler.open's ``bulk``)
    bulk: bool = False
    request_id: str = field(default_factory=lambda: next_request_id("asr"))

    def __post_init__(self) -> None:
        if isinstance(self.audio, np.ndarray):
            object.__setattr__(self, "audio", mono_float(self.audio, "audio"))
            if self.audio.size == 0:
                raise InvalidRequestError("audio must be non-empty mono samples", "audio")
        elif not hasattr(self.audio, "__aiter__"):
            raise InvalidRequestError("audio must be samples or an async iterator of Audio", "audio")
        object.__setattr__(self, "sample_rate", whole(self.sample_rate, "sample_rate", low=1, high=MAX_RATE))
        optional_text(self.language, "language")
        optional_text(self.prompt, "prompt")
        if self.max_tokens is not None:
            object.__setattr__(self, "max_tokens", whole(self.max_tokens, "max_tokens", low=1))
        if self.task not in tuple(Task):
            raise InvalidRequestError(f"task must be 'transcribe' or 'translate', got {self.task!r}", "task")
        object.__setattr__(self, "task", Task(self.task))
        if not isinstance(self.bulk, bool):
            raise InvalidRequestError(f"bulk must be a boolean, got {type(self.bulk).__name__}", "bulk")

    @property
    def streamed(self) -> bool:
        return not isinstance(self.audio, np.ndarray)


@runtime_checkable
class TranscriptionFamily(Protocol):
    """``kind == "transcription"``: ``transcription_stage`` validates now and returns one ``Stage[Audio, TextDelta]``;
    ``check_language`` checks a language alone.

    The stage reads the request's samples (or, when streamed, its upstream Audio chunks), counts usage in
    ``ctx.tokens("transcription")`` (audio tokens in, text tokens out) and marks its last delta ``final``.
    """

    info: TranscriptionInfo

    def transcription_stage(self, request: TranscriptionRequest, ctx: RequestContext) -> Stage[Audio, TextDelta]: ...

    def check_language(self, language: str | None) -> None:
        """InvalidRequestError (param ``language``) unless requests may name ``language`` (None: detect): the
        check ``transcription_stage`` makes, for sessions that set their language before any audio."""
        ...

    async def aclose(self) -> None: ...


def transcription_family(models: ModelSet) -> TranscriptionFamily:
    """The loaded transcription model (MissingModelError without one)."""
    family = models.get(ModelKind.TRANSCRIPTION)
    assert isinstance(family, TranscriptionFamily)  # checked when it was loaded
    return family


def build_transcription(models: ModelSet, request: TranscriptionRequest, ctx: RequestContext) -> Plan:
    family = transcription_family(models)
    source = None if isinstance(request.audio, np.ndarray) else request.audio  # streamed: the stage's upstream
    return Plan((StagePlan("transcription", family.transcription_stage(request, ctx)),), source=source)


TRANSCRIPTION = PipelineSpec(
    "transcription", TranscriptionRequest, (ModelKind.TRANSCRIPTION,), build_transcription, description="audio -> text"
)

KIND = Kind(ModelKind.TRANSCRIPTION, TranscriptionFamily, (TRANSCRIPTION,))  # listed in omni_stream.kinds
