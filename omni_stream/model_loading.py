"""One model of an engine, loaded: where it comes from (:class:`ModelSource`), and :func:`load_one`, which finds its
family, refuses a second model of a kind before its weights load, and loads it off the event loop."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio

from omni_stream.errors import ConfigError
from omni_stream.family import Family, LoadContext, LoadOptions, read_config
from omni_stream.family_registry import declared_kind, embedded_checkpoint, resolve_family
from omni_stream.kinds import check_family
from omni_stream.metrics import EngineMetrics
from omni_stream.pipeline_specs import ModelSet
from omni_stream.runtime.cache import user_cache_root
from omni_stream.runtime.load_display import library_bars_off
from omni_stream.runtime.worker_streams import StreamContext
from omni_stream.worker import DeviceWorker


@dataclass(slots=True, frozen=True)
class ModelSource:
    """Where one model comes from: a checkpoint directory, or (``endpoint``) a server; ``family`` overrides the
    checkpoint's ``model_type`` (e.g. ``"vllm"`` to serve a hub-layout LM on vLLM); ``kind`` is the role it must
    fill (None: whatever its family is). ``path`` may be given as a string."""

    path: Path | None = None
    family: str | None = None
    endpoint: str | None = None
    kind: str | None = None

    def __post_init__(self) -> None:
        if self.path is not None and not isinstance(self.path, Path):
            if not isinstance(self.path, str | os.PathLike):
                raise TypeError(f"ModelSource.path must be a path or a string, got {type(self.path).__name__}")
            object.__setattr__(self, "path", Path(self.path))


def load_quietly(loader: Callable[[LoadContext], Family], load: LoadContext, on_stream: StreamContext) -> Family:
    """``loader(load)`` with the libraries' own progress bars off (the family's bar is the one display), on the
    worker's stream (:func:`omni_stream.runtime.worker_streams.loading_on`)."""
    with library_bars_off(), on_stream():
        return loader(load)


async def load_one(
    source: ModelSource,
    options: LoadOptions,
    worker: DeviceWorker,
    metrics: EngineMetrics,
    on_stream: StreamContext = contextlib.nullcontext,
    loaded: ModelSet | None = None,
) -> Family:
    path = source.path
    if path is None and source.endpoint is None:
        if source.kind is None:
            raise ConfigError("a model source needs a path, an endpoint or a kind (for the embedded default)")
        cache = options.tuning.cache_dir or user_cache_root()
        path = await anyio.to_thread.run_sync(embedded_checkpoint, source.kind, cache)
    config = await anyio.to_thread.run_sync(read_config, path) if path is not None else {}
    model_type = source.family or config.get("model_type")
    if not isinstance(model_type, str):
        raise ConfigError(f"model source {source} names no family")
    loader = await anyio.to_thread.run_sync(resolve_family, model_type)
    kind = source.kind or declared_kind(model_type)
    if kind is not None and loaded is not None and kind in loaded:  # refused before its weights load, not after
        raise ConfigError(
            f"{path or source.endpoint}: a {kind} model is loaded already ({loaded.get(kind).info.model_name}); "
            "an engine holds one model of each kind"
        )
    load = LoadContext(
        checkpoint=path if path is not None else Path("."),
        config=config,
        options=options,
        worker=worker,
        metrics=metrics,
        endpoint=source.endpoint,
    )
    family = await anyio.to_thread.run_sync(load_quietly, loader, load, on_stream)
    try:
        check_family(family)
        if source.kind is not None and family.info.kind != source.kind:
            raise ConfigError(
                f"{path or source.endpoint} holds a {family.info.kind} model ({family.info.model_type}), "
                f"not a {source.kind} model"
            )
    except BaseException:
        await family.aclose()
        raise
    return family
