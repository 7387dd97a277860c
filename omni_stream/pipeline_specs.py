"""Pipelines as declarations: which stages a request runs, and the models behind them.

A :class:`PipelineSpec` names the request type it serves, the kinds of model it needs (one model per kind in an
engine), how a request is resolved against the loaded models (its ``resolve``: every rule about the request's
content, checked once, :mod:`omni_stream.validation`) and a builder that turns one resolved request into a
:class:`Plan`: the stages (each served by one model's family, or a model-free stage such as sentence splitting),
which of them the consumer sees, and the pipeline's source.
The engine picks the first spec that accepts a request (:mod:`omni_stream.kinds` lists each kind's specs).

```python
CHAT_SPEECH = PipelineSpec(
    "chat+speech", ChatRequest, (ModelKind.TEXT, ModelKind.SPEECH), build_chat_speech, accepts=speaks
)
```

Each model keeps its own scheduler on the device worker; stages of different models join by bounded channels
(``Plan.channel_size``, 0 by default: a sender waits for its receiver), so backpressure crosses models: a stalled
audio reader pauses the speech request, whose full input pauses the text request at its scheduler's watermark.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from omni_stream.context import RequestContext
from omni_stream.errors import ConfigError, InvalidRequestError
from omni_stream.family import Family, ModelKind, SpeechFamily, TextFamily
from omni_stream.pipeline import AnyStage, Pipeline, stage_name
from omni_stream.requests import ChatRequest, SpeechRequest
from omni_stream.speech.text_stream import speak_units, text_units
from omni_stream.validation.speech import resolve_speech
from omni_stream.validation.text import resolve_chat
from omni_stream.validation.voices import VoiceCatalog

R = TypeVar("R")


class MissingModelError(InvalidRequestError):
    """The request needs a kind of model the engine has not loaded."""


class ModelSet:
    """The engine's loaded families by kind, with typed accessors for the built-in kinds."""

    __slots__ = ("_by_kind",)

    def __init__(self, families: Sequence[Family] = ()) -> None:
        self._by_kind: dict[str, Family] = {}
        for family in families:
            self.add(family)

    def add(self, family: Family) -> None:
        kind = family.info.kind
        if kind in self._by_kind:
            raise ConfigError(
                f"{family.info.model_name}: a {kind} model is loaded already ({self._by_kind[kind].info.model_name});"
                " an engine holds one model of each kind"
            )
        self._by_kind[kind] = family

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self._by_kind)

    def __contains__(self, kind: object) -> bool:
        return kind in self._by_kind

    def __iter__(self) -> Iterator[Family]:
        return iter(self._by_kind.values())

    def __len__(self) -> int:
        return len(self._by_kind)

    def get(self, kind: str) -> Family:
        family = self._by_kind.get(kind)
        if family is None:
            loaded = ", ".join(self._by_kind) or "none"
            raise MissingModelError(f"no {kind} model loaded (loaded: {loaded})", "model")
        return family

    def speech(self) -> SpeechFamily:
        # Checked when it was loaded; a runtime Protocol check here cost ~30 us a request (a burst's loop time).
        return cast(SpeechFamily, self.get(ModelKind.SPEECH))

    def text(self) -> TextFamily:
        return cast(TextFamily, self.get(ModelKind.TEXT))


@dataclass(slots=True, frozen=True)
class StagePlan:
    """One stage of a plan; ``emit``: the consumer sees its chunks (the last stage's always)."""

    name: str
    stage: AnyStage
    emit: bool = False


@dataclass(slots=True, frozen=True)
class Plan:
    """What one request runs: its stages, the pipeline's source (streamed input), chunks per edge."""

    stages: tuple[StagePlan, ...]
    source: AsyncIterator[object] | None = None
    channel_size: int = 0

    def pipeline(self, tagged: bool = True) -> Pipeline:
        """The pipeline to run; ``tagged``: StageOutput items of the emitting stages, else the last stage's chunks."""
        return Pipeline(
            [s.stage for s in self.stages],
            channel_size=self.channel_size,
            names=[s.name for s in self.stages],
            emit=[s.emit for s in self.stages] if tagged else None,
        )


def _always(request: object) -> bool:
    return True


def _as_is(models: ModelSet, request: R, voices: VoiceCatalog | None) -> R:
    return request


@dataclass(slots=True, frozen=True)
class PipelineSpec(Generic[R]):
    """A named pipeline: the request type it serves, the model kinds it needs, how a request is resolved (defaults
    filled in, checked against the models; raises InvalidRequestError naming the field) and how one is built."""

    name: str
    request_type: type[R]
    kinds: tuple[str, ...]
    build: Callable[[ModelSet, R, RequestContext], Plan]
    accepts: Callable[[R], bool] = _always
    description: str = ""
    resolve: Callable[[ModelSet, R, VoiceCatalog | None], R] = _as_is

    def serves(self, request: object, models: ModelSet) -> bool:
        return isinstance(request, self.request_type) and self.accepts(request)

    def check(self, models: ModelSet, request: R, voices: VoiceCatalog | None) -> R:
        """``request`` resolved against ``models`` (a clear error naming a missing model first)."""
        for kind in self.kinds:
            models.get(kind)
        return self.resolve(models, request, voices)

    def plan(self, models: ModelSet, request: R, ctx: RequestContext) -> Plan:
        """The plan of a request :meth:`check` resolved."""
        return self.build(models, request, ctx)


@dataclass(slots=True, frozen=True)
class Kind:
    """A kind of model: its name (``ModelInfo.kind``), the role protocol (``runtime_checkable``) its families
    implement, and the pipelines that serve its requests (tried in order). :mod:`omni_stream.kinds` lists them."""

    name: str
    protocol: type
    pipelines: tuple[PipelineSpec[Any], ...] = ()


# --- the built-in pipelines ---------------------------------------------------------------------------------


def _speech_stages(family: SpeechFamily, request: SpeechRequest, ctx: RequestContext) -> tuple[StagePlan, ...]:
    return tuple(StagePlan(stage_name(s), s) for s in family.speech_stages(request, ctx))


def build_speech(models: ModelSet, request: SpeechRequest, ctx: RequestContext) -> Plan:
    return Plan(_speech_stages(models.speech(), request, ctx))


def build_speech_stream(models: ModelSet, request: SpeechRequest, ctx: RequestContext) -> Plan:
    family = models.speech()
    assert not isinstance(request.text, str)
    return Plan(
        (
            StagePlan("units", text_units(request.split, family.info.max_input_chars)),
            StagePlan("speech", speak_units(family, request.for_text)),
        ),
        source=aiter(request.text),
    )


def build_chat(models: ModelSet, request: ChatRequest, ctx: RequestContext) -> Plan:
    return Plan((StagePlan("text", models.text().text_stage(request.text, ctx)),))


def build_chat_speech(models: ModelSet, request: ChatRequest, ctx: RequestContext) -> Plan:
    assert request.speech is not None
    speech, text = models.speech(), models.text()
    reply = request.speech
    assert reply.template is not None, "resolve_chat resolves a spoken reply's speech fields once"
    return Plan(
        (
            StagePlan("text", text.text_stage(request.text, ctx), emit=reply.with_text),
            StagePlan(
                "units",
                text_units(
                    reply.split,
                    min(reply.max_unit_chars or 1 << 30, speech.info.max_input_chars),
                    first_clause=reply.first_clause,
                    first_unit_deltas=reply.first_unit_tokens,
                ),
            ),
            StagePlan("speech", speak_units(speech, reply.request)),
        )
    )


def _text_only(request: ChatRequest) -> bool:
    return request.speech is None


def _speaks(request: ChatRequest) -> bool:
    return request.speech is not None


def _plain(request: SpeechRequest) -> bool:
    return not request.streamed


def _streamed(request: SpeechRequest) -> bool:
    return request.streamed


def _resolve_speech(models: ModelSet, request: SpeechRequest, voices: VoiceCatalog | None) -> SpeechRequest:
    return resolve_speech(models.speech().info, voices, request)


SPEECH = PipelineSpec(
    "speech", SpeechRequest, (ModelKind.SPEECH,), build_speech, _plain, "text -> audio", _resolve_speech
)
SPEECH_STREAM = PipelineSpec(
    "speech-stream",
    SpeechRequest,
    (ModelKind.SPEECH,),
    build_speech_stream,
    _streamed,
    "streamed text -> audio",
    _resolve_speech,
)
CHAT = PipelineSpec("chat", ChatRequest, (ModelKind.TEXT,), build_chat, _text_only, "messages -> text", resolve_chat)
CHAT_SPEECH = PipelineSpec(
    "chat+speech",
    ChatRequest,
    (ModelKind.TEXT, ModelKind.SPEECH),
    build_chat_speech,
    _speaks,
    "messages -> text + audio",
    resolve_chat,
)

SPEECH_KIND = Kind(ModelKind.SPEECH, SpeechFamily, (SPEECH, SPEECH_STREAM))
TEXT_KIND = Kind(ModelKind.TEXT, TextFamily, (CHAT, CHAT_SPEECH))
