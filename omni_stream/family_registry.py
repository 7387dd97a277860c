"""Where families are found: each one's own declaration, so that nothing outside a family's folder lists it.

A family folder under ``omni_stream/models/`` holds a ``declaration.py`` whose ``FAMILIES`` is a tuple of
:class:`~omni_stream.family.FamilyDeclaration` (a folder may declare several). The registry finds them by listing
the subpackages of :mod:`omni_stream.models` (no list to edit), then the ``omni_stream.families`` entry-point group
(other packages: an entry's value is the ``module:attr`` of a declaration or a tuple of them; an entry that names a
bare loader still registers it under the entry's name), then whatever :func:`declare_family` and
:func:`register_family` were given at run time (tests, plugins). From the declarations it answers:

- which loader serves a ``config.json`` ``model_type`` (:func:`resolve_family`);
- how messages name a family (:func:`family_label`);
- which tiny checkpoint each kind serves when no model is given (:func:`embedded_checkpoint`, at most one family
  per kind declares one; :func:`default_kinds`, in :class:`~omni_stream.family.ModelKind` order);
- which checkpoint kinds ``omni-stream make-checkpoint --kind`` writes (:func:`checkpoint_writers`);
- the serving layer's defaults that families provide by role, each a typed :class:`ServingRole` (:data:`VAD`,
  :data:`TURN_MODEL`; :func:`serving_default`).

Declarations are read once per process on first use; ``"module[:attr]"`` targets are imported only when asked for.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from omni_stream.errors import ConfigError
from omni_stream.family import FamilyDeclaration, FamilyLoader, ModelKind, Target

if TYPE_CHECKING:
    from omni_stream.turns.detector import TurnModelFactory
    from omni_stream.turns.vad import VadFactory

T = TypeVar("T")

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "omni_stream.families"
DECLARATION_MODULE = "declaration"


@dataclass(slots=True)
class _Registry:
    declarations: dict[str, FamilyDeclaration] = field(default_factory=dict)  # by name, in the order found
    loaders: dict[str, FamilyLoader | str] = field(default_factory=dict)  # model_type -> loader (run-time ones)
    found: bool = False


_REGISTRY = _Registry()


def _import(target: Target, default_attr: str) -> Any:
    if not isinstance(target, str):
        return target
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr or default_attr)


def _declarations_of(value: object, where: str) -> tuple[FamilyDeclaration, ...]:
    found = value if isinstance(value, tuple) else (value,)
    if not found or not all(isinstance(d, FamilyDeclaration) for d in found):
        raise ConfigError(f"{where} must be a FamilyDeclaration or a tuple of them, got {type(value).__name__}")
    return found


def _builtin() -> Iterable[FamilyDeclaration]:
    import omni_stream.models as models

    for info in sorted(pkgutil.iter_modules(models.__path__), key=lambda m: m.name):
        if not info.ispkg:
            continue
        name = f"{models.__name__}.{info.name}.{DECLARATION_MODULE}"
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # a folder without a declaration declares nothing
                continue
            raise
        yield from _declarations_of(getattr(module, "FAMILIES", None), f"{name}.FAMILIES")


def _entry_points() -> Iterable[FamilyDeclaration]:
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            value = ep.load()
        except Exception as exc:  # a broken plugin must not stop the others: its model type says why when asked for
            log.warning("cannot import the omni_stream.families entry %s (%s): %s", ep.name, ep.value, exc)
            _REGISTRY.loaders.setdefault(ep.name, ep.value)
            continue
        if isinstance(value, FamilyDeclaration | tuple):
            yield from _declarations_of(value, f"entry point {ep.name}")
        else:  # a bare loader, registered under the entry's name
            _REGISTRY.loaders.setdefault(ep.name, value)


def _find() -> None:
    if _REGISTRY.found:
        return
    _REGISTRY.found = True
    for declaration in (*_builtin(), *_entry_points()):
        _REGISTRY.declarations.setdefault(declaration.name, declaration)


def declarations() -> tuple[FamilyDeclaration, ...]:
    """Every declared family: the package's folders, entry points, then run-time declarations."""
    _find()
    return tuple(_REGISTRY.declarations.values())


def declare_family(declaration: FamilyDeclaration) -> None:
    """Add (or replace, by name) a family declared at run time; its model types take precedence."""
    _find()
    _REGISTRY.declarations.pop(declaration.name, None)
    _REGISTRY.declarations[declaration.name] = declaration
    for model_type in declaration.model_types:
        _REGISTRY.loaders.pop(model_type, None)


def register_family(model_type: str, loader: FamilyLoader | str) -> None:
    """Map a ``config.json`` ``model_type`` (or a backend name) to a loader callable or its ``"module[:attr]"`` path
    (a family with nothing else to declare)."""
    _REGISTRY.loaders[model_type] = loader


def _declaring(model_type: str) -> FamilyDeclaration | None:
    # the latest declaration wins: run-time ones come after the package's
    for declaration in reversed(declarations()):
        if model_type in declaration.model_types:
            return declaration
    return None


def known_families() -> tuple[str, ...]:
    """Every model type a loader is known for."""
    types = {t for d in declarations() for t in d.model_types}
    return tuple(sorted(types | set(_REGISTRY.loaders)))


def resolve_family(model_type: str) -> FamilyLoader:
    """The loader for ``model_type`` (imported on first use); ConfigError naming the known ones else."""
    _find()
    loader: FamilyLoader | str | None = _REGISTRY.loaders.get(model_type)
    if loader is None:
        declaration = _declaring(model_type)
        loader = declaration.loader if declaration is not None else None
    if loader is None:
        raise ConfigError(f"unknown model_type {model_type!r} (known: {', '.join(known_families())})")
    if isinstance(loader, str):
        try:
            loader = _import(loader, "load_family")
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"cannot import the loader of model_type {model_type!r} ({loader}): {exc}") from exc
        _REGISTRY.loaders[model_type] = loader
    assert callable(loader)
    return loader


def declared_kind(model_type: str) -> str | None:
    """The kind the family of ``model_type`` declares it serves (None: undeclared, known once it is loaded)."""
    _find()
    declaration = _declaring(model_type)
    return declaration.kind if declaration is not None else None


def family_label(model_type: str) -> str:
    """How messages name the family of ``model_type`` (its declared label; the model type itself if undeclared)."""
    declaration = _declaring(model_type)
    return declaration.label if declaration is not None else model_type


def _default_of(kind: str) -> FamilyDeclaration:
    found = [d for d in declarations() if d.embedded_default is not None and d.kind == kind]
    if not found:
        raise ConfigError(f"no embedded default model for kind {kind!r}: pass a checkpoint")
    if len(found) > 1:
        names = ", ".join(d.name for d in found)
        raise ConfigError(f"several families declare the embedded default {kind} model ({names}): keep one")
    return found[0]


def default_kinds() -> tuple[str, ...]:
    """Every kind some family declares an embedded default for (built-in kinds in ModelKind order, then others)."""
    kinds = {d.kind for d in declarations() if d.embedded_default is not None and d.kind is not None}
    order = [k.value for k in ModelKind]
    return tuple(sorted(kinds, key=lambda k: (order.index(k) if k in order else len(order), k)))


def embedded_checkpoint(kind: str, cache_dir: Path | None = None) -> Path:
    """The tiny random-weight checkpoint served for ``kind`` when no model is given (built on first use, under
    ``cache_dir``; None: ``$OMNI_STREAM_CACHE``, else the user cache directory)."""
    declaration = _default_of(kind)
    assert declaration.embedded_default is not None
    try:
        build = _import(declaration.embedded_default, "embedded_default_checkpoint")
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"no default {kind} model is available in this build ({exc}): pass a checkpoint") from exc
    return Path(build(cache_dir))


def default_available(kind: str) -> bool:
    """False when the embedded default of ``kind`` needs an optional extra this install lacks (e.g. diffusers).

    A broken module of our own still counts as available: loading it then says what is wrong.
    """
    target = _default_of(kind).embedded_default
    if not isinstance(target, str):
        return True
    try:
        importlib.import_module(target.partition(":")[0])
    except ImportError as exc:
        missing = exc.name or ""
        if missing and not missing.startswith("omni_stream"):
            log.info("no embedded default %s model in this install (%s)", kind, exc)
            return False
    return True


def checkpoint_writers() -> dict[str, Target]:
    """``make-checkpoint --kind`` names and their writers (``writer(args) -> Path``), from every declaration."""
    writers: dict[str, Target] = {}
    owners: dict[str, str] = {}
    for declaration in declarations():
        for name, writer in declaration.writers.items():
            if name in owners and owners[name] != declaration.name:
                raise ConfigError(f"checkpoint kind {name!r} is declared by {owners[name]} and {declaration.name}")
            writers[name], owners[name] = writer, declaration.name
    return writers


def checkpoint_writer(name: str) -> Callable[..., Path]:
    """The writer of ``make-checkpoint --kind name``."""
    return _import(checkpoint_writers()[name], "make")


@dataclass(slots=True, frozen=True)
class ServingRole(Generic[T]):
    """A default the serving layer asks families for: ``name`` is the key of a declaration's ``serves``, ``T`` what
    its provider returns."""

    name: str


VAD: ServingRole[VadFactory] = ServingRole("vad")
"""The realtime server's voice activity detector factory (``VadParams -> VoiceActivityDetector``)."""
TURN_MODEL: ServingRole[TurnModelFactory] = ServingRole("turn_model")
"""The end-of-turn model of ``semantic_vad`` (``() -> EndOfTurnModel``)."""


def serving_default(role: ServingRole[T]) -> T | None:
    """What the family that serves ``role`` provides for it (its declared provider's result; None when no family
    declares the role or the provider says it is unavailable here)."""
    for declaration in reversed(declarations()):
        provider = declaration.serves.get(role.name)
        if provider is not None:
            # a provider declared for a role returns that role's type (the declaration's contract)
            return cast("T | None", _import(provider, role.name)())
    return None
