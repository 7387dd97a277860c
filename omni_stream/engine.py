"""AsyncEngine: load a checkpoint by its ``model_type`` and stream speech from it.

```python
async with await AsyncEngine.from_pretrained(path) as engine:
    async with engine.speech("Hello.", voice="vivian") as stream:
        async for audio in stream: ...
```

Model families. ``config.json``'s ``model_type`` names a family; :func:`register_family` maps it to a
loader, either a callable or a ``"module"`` / ``"module:attr"`` path imported on first use (the attribute
defaults to ``load_family``), so importing the engine never imports a model. A loader runs off the event
loop as ``loader(LoadContext) -> family``, and the family object provides:

- ``info: EngineInfo``: what the checkpoint offers (tasks, voices, languages, sample rate).
- ``speech_stages(request, ctx) -> Sequence[Stage]``: validate ``request`` (raise InvalidRequestError and
  its subclasses right away, before anything streams) and return the stages of one request; the stages set
  ``ctx.input_tokens`` before the first chunk (tokenization runs off the loop there); the last stage yields
  :class:`~omni_stream.chunks.Audio` and counts ``ctx.output_tokens``.
- ``async create_voice_prompt(audio, sample_rate, ref_text=None) -> VoicePrompt`` (Base checkpoints;
  others raise UnsupportedTaskError).
- ``count_text_tokens(text) -> int``.
- ``async aclose()``: free what the family holds. The engine closes the device worker after it, which
  releases any sequence still admitted in the family's schedulers.

Model work runs on ``LoadContext.worker`` (one thread per device): schedulers attach to it, one-off and
batchable jobs go through ``submit`` / ``submit_batched``; stages await those futures with
``ctx.wait(future, what)`` so that every wait has a deadline. A batched stage holds its sequence with
``async with scheduler.session(payload, ctx)``, which also registers a synchronous release on ``ctx``:
``SpeechStream.abort()`` hands the slot back before the worker's next step, without awaiting anything.
``omni_stream.models.synthetic`` is the smallest complete family to read; :func:`omni_stream.stages.talker_stage`
is the talker stage every family shares.

Run-ahead bound. A consumer that stops reading stops its request after a bounded number of frames; what
can be generated and not yet delivered to it is, at most:

- ``max_buffered_frames`` in the talker scheduler's buffer (its high watermark: the request pauses there,
  keeping its batch slot, and resumes once the talker stage has taken it down to the low watermark);
- one item (one frame) in the talker stage's hands, handed over to the codec stage: speech pipelines run
  with :data:`SPEECH_CHANNEL_SIZE` = 0, so no edge buffers anything, a sender waits for its receiver;
- one codec window in the codec stage, either being filled or handed over as an audio chunk to the consumer.

So ``max_buffered_frames + 1 + the family's largest codec window`` frames: with the defaults 25 + 1 + 8 =
34 frames (2.7 s of 80 ms frames) for the synthetic family, 25 + 1 + 25 = 51 (4.1 s) for Qwen3-TTS; a
request whose ``initial_codec_chunk_frames`` exceeds the steady window raises the last term to it.

Deadlines. Every wait of a request on the device worker is bounded by the engine's ``wait_timeout`` and the
request's ``timeout``; a wait for a stalled reader by the request's ``timeout`` alone (:mod:`omni_stream.pipeline`).
``create_voice_prompt`` is bounded by ``wait_timeout``; closing a stream waits at
most ``pipeline.JOIN_TIMEOUT`` for its stages, closing the engine at most ``worker.CLOSE_TIMEOUT`` for the
step in progress. Loading has no deadline: reading weights may take minutes.
"""

from __future__ import annotations

import importlib
import json
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import anyio
import numpy as np

from omni_stream.chunks import Audio
from omni_stream.context import RequestContext
from omni_stream.errors import ConfigError, EngineClosed, InvalidRequestError
from omni_stream.metrics import EngineMetrics
from omni_stream.pipeline import Pipeline, PipelineStream, Stage
from omni_stream.requests import SpeechRequest, TaskType, Timings, VoicePrompt
from omni_stream.worker import DeviceWorker


@dataclass(slots=True, frozen=True)
class EngineInfo:
    """What a loaded checkpoint offers; ``sample_rate`` in Hz."""

    model_name: str
    model_type: str
    task_types: tuple[TaskType, ...]
    voices: tuple[str, ...]
    languages: tuple[str, ...]
    sample_rate: int
    default_task: TaskType


@dataclass(slots=True, frozen=True)
class Usage:
    """Tokens of one request: text tokens in, codec frames out (so far)."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(slots=True, frozen=True)
class LoadOptions:
    """How to load: a request pauses with ``max_buffered_frames`` frames in the talker's buffer (backpressure)."""

    device: str = "cpu"
    dtype: Any = None  # None: the family's default for the device
    load_format: str = "auto"  # "auto" | "safetensors" | "dummy" (random weights at real sizes)
    max_batch_size: int = 32
    max_buffered_frames: int = 25  # the talker scheduler's high watermark: 2 s of 80 ms frames
    progress: bool = True

    def progress_bar(self, total: int | None = None, desc: str = "loading", unit: str = "it") -> Any:
        """A tqdm bar (disabled when ``progress`` is False); use it as a context manager."""
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, disable=not self.progress, leave=False)


@dataclass(slots=True, frozen=True)
class LoadContext:
    """Everything a family loader gets: the checkpoint, its parsed config, options, worker and metrics."""

    checkpoint: Path
    config: dict[str, Any]
    options: LoadOptions
    worker: DeviceWorker
    metrics: EngineMetrics


class ModelFamily(Protocol):
    info: EngineInfo

    def speech_stages(self, request: SpeechRequest, ctx: RequestContext) -> Sequence[Stage]: ...

    async def create_voice_prompt(
        self, audio: np.ndarray, sample_rate: int, ref_text: str | None = None
    ) -> VoicePrompt: ...

    def count_text_tokens(self, text: str) -> int: ...

    async def aclose(self) -> None: ...


# Chunks that may wait on each edge of a speech pipeline: none (see "Run-ahead bound" above).
SPEECH_CHANNEL_SIZE = 0

FamilyLoader = Callable[[LoadContext], ModelFamily]

_FAMILIES: dict[str, FamilyLoader | str] = {
    "qwen3_tts": "omni_stream.models.qwen3_tts.family",
    "synthetic_tts": "omni_stream.models.synthetic",
}


def register_family(model_type: str, loader: FamilyLoader | str) -> None:
    """Map a ``config.json`` ``model_type`` to a loader callable or its ``"module[:attr]"`` path."""
    _FAMILIES[model_type] = loader


def resolve_family(model_type: str) -> FamilyLoader:
    """The loader registered for ``model_type`` (imports it on first use)."""
    try:
        loader = _FAMILIES[model_type]
    except KeyError:
        known = ", ".join(sorted(_FAMILIES))
        raise ConfigError(f"unknown model_type {model_type!r} (known: {known})") from None
    if isinstance(loader, str):
        module, _, attr = loader.partition(":")
        loader = getattr(importlib.import_module(module), attr or "load_family")
        _FAMILIES[model_type] = loader
    return loader


def _default_checkpoint() -> Path:
    try:
        family = importlib.import_module("omni_stream.models.qwen3_tts.family")
        return Path(family.embedded_default_checkpoint())
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            "no default model is available in this build: pass a checkpoint directory (model=...)"
        ) from exc


def _read_config(path: Path) -> dict[str, Any]:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"{path} is not a checkpoint directory: {config_file.name} is missing")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {config_file}: {exc}") from exc
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ConfigError(f"{config_file} has no model_type")
    return config


class AsyncEngine:
    """A loaded model family, its device worker and metrics. Build it with :meth:`from_pretrained`."""

    def __init__(
        self, family: ModelFamily, worker: DeviceWorker, metrics: EngineMetrics, *, wait_timeout: float | None
    ) -> None:
        self.family = family
        self.worker = worker
        self.metrics = metrics
        self.wait_timeout = wait_timeout
        self._closed = False
        self._streams: weakref.WeakSet[SpeechStream] = weakref.WeakSet()

    @classmethod
    async def from_pretrained(
        cls,
        model: str | Path | None = None,
        *,
        device: str = "cpu",
        dtype: Any = None,
        load_format: str = "auto",
        max_batch_size: int = 32,
        progress: bool = True,
        # Limits
        max_buffered_frames: int = 25,
        wait_timeout: float | None = 120.0,
    ) -> AsyncEngine:
        """Load ``model`` (a checkpoint directory; None: the embedded tiny default) off the event loop.

        ``max_buffered_frames``: frames the talker scheduler buffers for a request before pausing it (25: 2 s);
        the whole lead over the consumer adds one frame and one codec window (module docstring).
        ``wait_timeout``: seconds any single wait inside a request may take (None: unbounded).
        """
        options = LoadOptions(
            device=device,
            dtype=dtype,
            load_format=load_format,
            max_batch_size=max_batch_size,
            max_buffered_frames=max_buffered_frames,
            progress=progress,
        )
        path = Path(model) if model is not None else await anyio.to_thread.run_sync(_default_checkpoint)
        config = await anyio.to_thread.run_sync(_read_config, path)
        loader = await anyio.to_thread.run_sync(resolve_family, config["model_type"])
        worker = DeviceWorker(name=f"omni-stream-{device}").start()
        metrics = EngineMetrics()
        load = LoadContext(checkpoint=path, config=config, options=options, worker=worker, metrics=metrics)
        try:
            family = await anyio.to_thread.run_sync(loader, load)
        except BaseException:
            await worker.aclose()
            raise
        return cls(family, worker, metrics, wait_timeout=wait_timeout)

    @property
    def info(self) -> EngineInfo:
        return self.family.info

    @property
    def closed(self) -> bool:
        return self._closed

    def speech(self, request: SpeechRequest | str, /, *, timeout: float | None = None, **fields: Any) -> SpeechStream:
        """Stream speech for ``request`` (or text plus SpeechRequest fields); ``timeout`` s for the whole request.

        Invalid requests raise here, before anything streams. The stream starts on first iteration.
        """
        if self._closed:
            raise EngineClosed("engine is closed")
        if isinstance(request, str):
            request = SpeechRequest(text=request, **fields)
        elif fields:
            request = replace(request, **fields)
        if not isinstance(request, SpeechRequest):
            raise InvalidRequestError(f"expected a SpeechRequest or text, got {type(request).__name__}", "input")
        ctx = RequestContext.with_timeout(timeout, request_id=request.request_id, wait_timeout=self.wait_timeout)
        stages = self.family.speech_stages(request, ctx)
        stream = SpeechStream(request, Pipeline(stages, channel_size=SPEECH_CHANNEL_SIZE).run(ctx), self.metrics)
        self._streams.add(stream)
        return stream

    async def create_voice_prompt(
        self, audio: np.ndarray, sample_rate: int, ref_text: str | None = None
    ) -> VoicePrompt:
        """Extract a reusable cloning prompt from float32 mono ``audio`` at ``sample_rate`` Hz (Base models).

        Bounded by ``wait_timeout``: past it, DeadlineExceeded.
        """
        if self._closed:
            raise EngineClosed("engine is closed")
        with RequestContext(wait_timeout=self.wait_timeout).fail_after("voice prompt extraction"):
            prompt = await self.family.create_voice_prompt(audio, sample_rate, ref_text)
        return prompt

    def count_text_tokens(self, text: str) -> int:
        return self.family.count_text_tokens(text)

    async def aclose(self) -> None:
        """Fail open streams with EngineClosed, close the family, stop the device worker."""
        if self._closed:
            return
        self._closed = True
        for stream in list(self._streams):
            stream.abort(EngineClosed("engine closed while the request was streaming"))
        try:
            await self.family.aclose()
        finally:
            await self.worker.aclose()

    async def __aenter__(self) -> AsyncEngine:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class SpeechStream:
    """Audio chunks of one request; ``usage`` and ``timings`` fill in as it streams."""

    def __init__(self, request: SpeechRequest, stream: PipelineStream, metrics: EngineMetrics | None = None) -> None:
        self.request = request
        self._stream = stream
        self._metrics = metrics
        self._outcome: str | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def ctx(self) -> RequestContext:
        return self._stream.ctx

    @property
    def usage(self) -> Usage:
        return Usage(self.ctx.input_tokens, self.ctx.output_tokens)

    @property
    def timings(self) -> Timings:
        return self.ctx.timings

    def __aiter__(self) -> SpeechStream:
        return self

    async def __anext__(self) -> Audio:
        try:
            audio = await self._stream.__anext__()
        except StopAsyncIteration:
            self._finish("ok")
            raise
        except anyio.get_cancelled_exc_class():
            self._finish("cancelled")
            raise
        except TimeoutError:
            self._finish("deadline")
            raise
        except BaseException:
            self._finish("error")
            raise
        self.timings.record_chunk(audio.duration)
        return audio

    def _finish(self, outcome: str) -> None:
        if self._outcome is not None:
            return
        self._outcome = outcome
        self.timings.finished = self.timings.finished or time.perf_counter()
        if self._metrics is not None:
            self._metrics.observe_request(self.timings, outcome)

    def abort(self, exc: BaseException | None = None) -> None:
        """Stop generating now, without waiting; with ``exc``, the next ``__anext__`` raises it."""
        self._stream.cancel(exc)

    async def aclose(self) -> None:
        """Stop generating and free the request's batch slot before the next model step."""
        await self._stream.aclose()
        self._finish("cancelled")

    async def __aenter__(self) -> SpeechStream:
        await self._stream.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
