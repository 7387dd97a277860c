"""The kinds of model an engine serves, in one explicit list, and the pipeline that serves a request.

Each kind (:class:`~omni_stream.pipeline_specs.Kind`) names the role protocol its families implement and the
pipelines of its requests; its folder declares it (``speech`` and ``text`` in :mod:`omni_stream.pipeline_specs`,
the others in their ``spec`` modules) and :data:`KINDS` lists them: importing a module registers nothing. A
package adds kinds of its own through the ``omni_stream.kinds`` entry-point group (an entry's value: the
``module:attr`` of a Kind or a tuple of them), read on first use; code (a test) calls :func:`register_kind`, or
:func:`register_pipeline` for one more pipeline of an existing request type. What is added is tried before the
built-in pipelines.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from omni_stream.errors import ConfigError, InvalidRequestError
from omni_stream.family import Family, ModelInfo
from omni_stream.images.spec import KIND as IMAGE_KIND
from omni_stream.pipeline_specs import SPEECH_KIND, TEXT_KIND, Kind, ModelSet, PipelineSpec
from omni_stream.requests import TextRequest
from omni_stream.transcription.spec import KIND as TRANSCRIPTION_KIND
from omni_stream.video.spec import KIND as VIDEO_KIND

log = logging.getLogger(__name__)

KINDS: tuple[Kind, ...] = (SPEECH_KIND, TEXT_KIND, TRANSCRIPTION_KIND, IMAGE_KIND, VIDEO_KIND)
ENTRY_POINT_GROUP = "omni_stream.kinds"


@dataclass(slots=True)
class _Registry:
    kinds: dict[str, Kind] = field(default_factory=lambda: {k.name: k for k in KINDS})
    added: list[PipelineSpec[Any]] = field(default_factory=list)  # register_pipeline's, newest first
    cached: list[PipelineSpec[Any]] | None = None  # the order requests try them in (rebuilt after a registration)
    entry_points_read: bool = False

    def pipelines(self) -> list[PipelineSpec[Any]]:
        self.read_entry_points()
        if self.cached is None:
            self.cached = self._order()
        return self.cached

    def read_entry_points(self) -> None:
        if self.entry_points_read:
            return
        self.entry_points_read = True
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                value = ep.load()
            except Exception as exc:  # a broken plugin must not stop the engine: its kind stays unknown
                log.warning("cannot import the omni_stream.kinds entry %s (%s): %s", ep.name, ep.value, exc)
                continue
            for kind in value if isinstance(value, tuple) else (value,):
                if not isinstance(kind, Kind):
                    raise ConfigError(f"entry point {ep.name} ({ep.value}) must name a Kind or a tuple of them")
                self.kinds.setdefault(kind.name, kind)
        self.cached = None

    def _order(self) -> list[PipelineSpec[Any]]:
        builtin = [p for k in KINDS for p in k.pipelines if self.kinds.get(k.name) is k]
        plugin = [p for k in self.kinds.values() if k not in KINDS for p in reversed(k.pipelines)]
        found: dict[str, PipelineSpec[Any]] = {}
        for spec in (*self.added, *reversed(plugin), *builtin):
            found.setdefault(spec.name, spec)  # a name added later hides the earlier one
        return list(found.values())


_REGISTRY = _Registry()


def register_kind(kind: Kind) -> None:
    """Add a kind of model (or replace one by name): its families are checked against ``kind.protocol`` when they
    load, and its pipelines are tried before the built-in ones."""
    _REGISTRY.read_entry_points()
    _REGISTRY.kinds[kind.name] = kind
    _REGISTRY.cached = None


def register_pipeline(spec: PipelineSpec[Any]) -> None:
    """Add a pipeline (tried before every other; one of the same name is replaced)."""
    _REGISTRY.added[:] = [spec, *(p for p in _REGISTRY.added if p.name != spec.name)]
    _REGISTRY.cached = None


def kind_protocol(kind: str) -> type:
    """The role protocol of ``kind`` (:class:`~omni_stream.family.Family` for a kind nobody declared)."""
    _REGISTRY.read_entry_points()
    found = _REGISTRY.kinds.get(kind)
    return found.protocol if found is not None else Family


def check_family(family: object) -> None:
    """Raise ConfigError unless ``family`` has a ModelInfo and implements its kind's protocol."""
    info = getattr(family, "info", None)
    if not isinstance(info, ModelInfo):
        raise ConfigError(f"{type(family).__name__} has no ModelInfo 'info'")
    protocol = kind_protocol(info.kind)
    if not isinstance(family, protocol):
        raise ConfigError(
            f"{type(family).__name__} is a {info.kind!r} model but does not implement {protocol.__name__}"
        )


def find_pipeline(request: object, models: ModelSet, name: str | None = None) -> PipelineSpec[Any]:
    """The pipeline ``name``, or the first that serves ``request``; InvalidRequestError when none does."""
    pipelines = _REGISTRY.pipelines()
    if name is not None:
        for spec in pipelines:
            if spec.name == name:
                if not spec.serves(request, models):
                    raise InvalidRequestError(f"pipeline {name!r} does not serve a {type(request).__name__}")
                return spec
        raise InvalidRequestError(f"unknown pipeline {name!r} (known: {', '.join(p.name for p in pipelines)})")
    if isinstance(request, TextRequest):
        raise InvalidRequestError("wrap a TextRequest in a ChatRequest (or use engine.chat())", "messages")
    for spec in pipelines:
        if spec.serves(request, models):
            return spec
    raise InvalidRequestError(f"no pipeline serves a {type(request).__name__}")
