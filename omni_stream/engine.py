"""AsyncEngine: load models of any family onto one device worker and stream requests through pipelines.

```python
async with await AsyncEngine.from_pretrained(tts_dir, llm=lm_dir) as engine:
    async with engine.speech("Hello.", voice="vivian") as stream:      # Audio chunks
        async for audio in stream: ...
    async with engine.generate(ChatRequest(TextRequest(messages), speech=SpokenReply("vivian"))) as out:
        async for item in out: ...                                       # StageOutput: text deltas and audio
```

An engine holds at most one model per kind (speech, text, ...; :mod:`omni_stream.family`), every model on the one
device worker, each with its own scheduler. :meth:`AsyncEngine.generate` runs any request through the first
pipeline that serves it (:mod:`omni_stream.pipeline_specs`) and streams typed :class:`StageOutput` items: its
overloads say, per request type, which chunks its pipelines yield (a ``RequestStream[TextDelta | Audio]`` for a
ChatRequest; a request of a plugin kind streams ``StageOutput[object]``; a pipeline registered for a built-in request
type must yield that type's chunks); :meth:`AsyncEngine.speech` is the typed wrapper that yields
:class:`~omni_stream.chunks.Audio`. The engine names no model family: families come from the registry by
``config.json`` ``model_type``.

Validation. Every request is resolved and checked once, before its pipeline runs, by its pipeline's ``resolve``
(:mod:`omni_stream.validation`): invalid requests raise InvalidRequestError naming the field, before anything
streams. Uploaded voices come from the catalog the engine is given (:meth:`AsyncEngine.use_voices`).

Run-ahead bound (speech). A consumer that stops reading stops its request after a bounded number of frames; what
can be generated and not yet delivered is at most ``max_buffered_frames`` in the talker scheduler's buffer (its
high watermark: the request pauses there, keeping its batch slot), one frame in the talker stage's hands (speech
pipelines run with unbuffered edges: a sender waits for its receiver), and in the codec stage one window plus the
frame after it (a window that ends on the frames received so far is handed on once the next frame says it is not
the last, :func:`omni_stream.speech.stages.codec_stage`): with the defaults 25 + 1 + 25 + 1 = 52 frames (4.2 s) for
Qwen3-TTS (a family whose longest codec window is 8 frames: 25 + 1 + 8 + 1 = 35).
Streamed text (an LLM feeding TTS) adds one more unit's speech request and one unit of text in hand
(:mod:`omni_stream.speech.text_stream`) before the text model's own watermark.

Deadlines. Every wait of a request on the device worker is bounded by the engine's ``wait_timeout`` and the
request's ``timeout``; a wait for a stalled reader by the request's ``timeout`` alone (:mod:`omni_stream.pipeline`).
Closing a stream waits at most ``pipeline.JOIN_TIMEOUT`` for its stages, closing the engine at most
``worker.CLOSE_TIMEOUT`` for the step in progress. Loading has no deadline: reading weights may take minutes.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar, overload

import anyio
import numpy as np
import torch

from omni_stream.chunks import Audio, Image, TextDelta, VideoChunk
from omni_stream.context import RequestContext
from omni_stream.device_policy import DevicePolicy
from omni_stream.errors import ConfigError, EngineClosed, InvalidRequestError, RequestCancelled
from omni_stream.family import LoadOptions, ModelKind, SpeechInfo
from omni_stream.family_registry import (
    default_available,
    default_kinds,
)
from omni_stream.images.spec import ImageRequest
from omni_stream.kinds import find_pipeline
from omni_stream.metrics import EngineMetrics
from omni_stream.model_loading import ModelSource, load_one
from omni_stream.pipeline_specs import ModelSet
from omni_stream.request_streams import EngineStream, RequestStream, SpeechStream, Usage
from omni_stream.requests import (
    ChatMessage,
    ChatRequest,
    Role,
    SpeechRequest,
    TaskType,
    TextRequest,
    VoicePrompt,
)
from omni_stream.runtime.gc_heap import freeze_loaded_heap, release_loaded_heap
from omni_stream.runtime.load_display import log_lines_above_bars, quiet_pil_fallback
from omni_stream.runtime.offload import preparer
from omni_stream.runtime.settings import Tuning
from omni_stream.runtime.worker_streams import (
    REALTIME_PRIORITY,
    current_on,
    loading_on,
    make_realtime_stream,
    realtime_streams,
    throughput_fence,
    throughput_stream,
)
from omni_stream.transcription.spec import TranscriptionRequest
from omni_stream.validation.speech import check_reference, check_task
from omni_stream.validation.voices import VoiceCatalog, voice_name
from omni_stream.video.spec import VideoRequest
from omni_stream.worker import DeviceWorker

T = TypeVar("T")

__all__ = ["AsyncEngine", "EngineStream", "ModelSource", "RequestStream", "SpeechStream", "Usage"]


class AsyncEngine:
    """Loaded models (one per kind), their device worker and metrics. Build it with :meth:`from_pretrained`."""

    def __init__(
        self,
        models: ModelSet,
        worker: DeviceWorker,
        metrics: EngineMetrics,
        *,
        wait_timeout: float | None,
        tuning: Tuning | None = None,
    ) -> None:
        self.models = models
        self.tuning = Tuning() if tuning is None else tuning
        self.worker = worker
        self.metrics = metrics
        self.wait_timeout = wait_timeout
        self.voices: VoiceCatalog | None = None  # uploaded voices (use_voices)
        self._closed = False
        self._holds_heap = False  # froze the loaded heap (gc_heap); released on close
        self._streams: weakref.WeakValueDictionary[str, EngineStream[object]] = weakref.WeakValueDictionary()

    @classmethod
    async def load(
        cls,
        sources: Mapping[str, ModelSource] | None = None,
        *,
        device: str = "cpu",
        dtype: torch.dtype | str | None = None,
        load_format: str = "auto",
        max_batch_size: int = 32,
        progress: bool = True,
        backend_args: Mapping[str, object] | None = None,
        tuning: Tuning | None = None,
        # Limits
        max_buffered_frames: int = 25,
        wait_timeout: float | None = 120.0,
        # Scheduling across models
        device_policy: DevicePolicy | None = None,
        record: bool = False,
    ) -> AsyncEngine:
        """Load every source (None: the embedded tiny default of every kind that has one), off the event loop.

        ``max_buffered_frames``: items a request's scheduler buffers before it pauses (25 speech frames: 2 s).
        ``wait_timeout``: seconds any single wait inside a request may take (None: unbounded).
        ``backend_args``: passed unchanged to families that wrap another engine (vLLM engine args).
        ``tuning``: the process switches every family reads (None: parsed once from the environment now).
        ``device_policy``: how the device worker orders the models' work (None: ``DevicePolicy.from_tuning(tuning)``);
        ``record``: the worker keeps a log of every piece of work it runs (``engine.worker.log``; tests).
        """
        timeout_ok = isinstance(wait_timeout, int | float) and not isinstance(wait_timeout, bool)
        if wait_timeout is not None and not (timeout_ok and 0 < wait_timeout < math.inf):
            raise ConfigError(f"wait_timeout must be a number of seconds > 0 (None: unbounded), got {wait_timeout!r}")
        tuning = Tuning.from_env() if tuning is None else tuning
        preparer(tuning.prepare_threads)  # this loop's prompt-preparation threads
        quiet_pil_fallback()  # before any family's module imports diffusers (omni_stream.runtime.load_display)
        options = await anyio.to_thread.run_sync(  # checking the device may initialize CUDA: off the event loop
            lambda: LoadOptions(
                device=device,
                dtype=dtype,
                load_format=load_format,
                max_batch_size=max_batch_size,
                max_buffered_frames=max_buffered_frames,
                progress=progress,
                backend_args=tuple((backend_args or {}).items()),
                tuning=tuning,
            )
        )
        if sources is None:
            # a default whose optional extra is not installed (diffusers for images) is left out, not an error; the
            # families' declarations are read (imported) off the event loop
            kinds = await anyio.to_thread.run_sync(lambda: [k for k in default_kinds() if default_available(k)])
            sources = {kind: ModelSource(kind=kind) for kind in kinds}
        policy = device_policy if device_policy is not None else DevicePolicy.from_tuning(tuning)
        realtime = await anyio.to_thread.run_sync(make_realtime_stream, device) if policy.realtime_priority else None
        side, back = throughput_stream(device, realtime) if policy.throughput_stream else (None, None)
        priority = REALTIME_PRIORITY if realtime is not None else 0
        worker = DeviceWorker(
            name=f"omni-stream-{device}",
            init=current_on(realtime),
            threads=tuning.threads,
            policy=policy,
            throughput_context=side,
            realtime_context=back,
            source_context=realtime_streams(device, priority) if policy.realtime_streams else None,
            throughput_fence=throughput_fence(device) if policy.throughput_fence and side is not None else None,
            record=record,
        ).start()
        metrics = EngineMetrics()
        models = ModelSet()
        try:
            with log_lines_above_bars(progress):
                for source in sources.values():
                    family = await load_one(source, options, worker, metrics, loading_on(realtime), models)
                    try:
                        models.add(family)
                    except ConfigError:  # a second model of a kind: it is not kept, so it is closed here
                        await family.aclose()
                        raise
        except BaseException:
            for family in models:
                await family.aclose()
            await worker.aclose()
            raise
        engine = cls(models, worker, metrics, wait_timeout=wait_timeout, tuning=tuning)
        # Before the first request: a full collection over the loaded heap stalls every thread (gc_heap).
        await anyio.to_thread.run_sync(freeze_loaded_heap)
        engine._holds_heap = True
        return engine

    @classmethod
    async def from_pretrained(
        cls,
        model: str | Path | Sequence[str | Path] | None = None,
        *,
        llm: str | Path | None = None,
        llm_family: str | None = None,
        llm_endpoint: str | None = None,
        **options: Any,
    ) -> AsyncEngine:
        """Load ``model`` (a checkpoint directory of any family, or several of different kinds) and/or a text model;
        neither: the embedded defaults.

        ``llm``: a text model's checkpoint; ``llm_family`` picks its backend (e.g. ``"vllm"``; default: its
        ``model_type``); ``llm_endpoint``: an OpenAI-compatible server instead (``llm_family`` defaults to
        ``"openai"`` then). Other keywords as :meth:`load`.
        """
        sources: dict[str, ModelSource] = {}
        models = [model] if isinstance(model, str | Path) else list(model or ())
        for i, path in enumerate(models):
            sources[f"model{i}"] = ModelSource(Path(path))
        if llm is not None or llm_endpoint is not None:
            family = llm_family or ("openai" if llm is None else None)
            sources["llm"] = ModelSource(
                Path(llm) if llm is not None else None, family, llm_endpoint, kind=ModelKind.TEXT
            )
        return await cls.load(sources or None, **options)

    # --- what is loaded ---

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def speech_info(self) -> SpeechInfo:
        """The speech model's info (voices, languages, sample rate); MissingModelError without one."""
        return self.models.speech().info

    @property
    def has_speech(self) -> bool:
        return ModelKind.SPEECH in self.models

    @property
    def has_text(self) -> bool:
        return ModelKind.TEXT in self.models

    def use_voices(self, voices: VoiceCatalog | None) -> None:
        """Resolve voice names through ``voices`` (uploaded voices) besides the speech model's own."""
        self.voices = voices

    # --- requests ---

    def resolve(self, request: T, /, *, pipeline: str | None = None) -> T:
        """``request`` as its pipeline would run it (defaults filled in), without running it; InvalidRequestError
        naming the field when it is invalid."""
        spec = find_pipeline(request, self.models, pipeline)
        return spec.check(self.models, request, self.voices)

    def voice(self, name: str) -> str:
        """The name of the voice ``name`` names, as the speech model spells it (an uploaded voice: as it was
        uploaded); InvalidRequestError naming ``voice`` and the voices there are when there is none."""
        return voice_name(self.speech_info, self.voices, name)

    @overload
    def generate(
        self, request: SpeechRequest, /, *, pipeline: str | None = None, timeout: float | None = None
    ) -> RequestStream[Audio | TextDelta]: ...

    @overload
    def generate(
        self, request: ChatRequest, /, *, pipeline: str | None = None, timeout: float | None = None
    ) -> RequestStream[TextDelta | Audio]: ...

    @overload
    def generate(
        self, request: TranscriptionRequest, /, *, pipeline: str | None = None, timeout: float | None = None
    ) -> RequestStream[TextDelta]: ...

    @overload
    def generate(
        self, request: ImageRequest, /, *, pipeline: str | None = None, timeout: float | None = None
    ) -> RequestStream[TextDelta | Image]: ...

    @overload
    def generate(
        self, request: VideoRequest, /, *, pipeline: str | None = None, timeout: float | None = None
    ) -> RequestStream[VideoChunk]: ...

    @overload
    def generate(
        self, request: object, /, *, pipeline: str | None = None, timeout: float | None = None
    ) -> RequestStream[object]: ...

    def generate(
        self, request: object, /, *, pipeline: str | None = None, timeout: float | None = None
    ) -> RequestStream[object]:
        """Stream ``request`` through its pipeline as :class:`StageOutput` items; ``timeout`` s for the whole request.

        Invalid requests raise here, before anything streams. The stream starts on first iteration. What the items
        hold by request type: speech, ``Audio`` (streamed text: each unit's transcript ``TextDelta`` before its
        audio); chat, ``TextDelta`` (and ``Audio`` when the reply is spoken); transcription, ``TextDelta``; images,
        the rewrite's ``TextDelta`` and the ``Image`` s; video, ``VideoChunk``.
        """
        spec = find_pipeline(request, self.models, pipeline)
        ctx = self._context(request, timeout)
        request = spec.check(self.models, request, self.voices)
        plan = spec.plan(self.models, request, ctx)
        stream: RequestStream[object] = RequestStream(plan.pipeline().run(ctx, plan.source), self.metrics, spec.name)
        self._track(stream)
        return stream

    def chat(
        self, request: ChatRequest | TextRequest | str, /, *, timeout: float | None = None
    ) -> RequestStream[TextDelta | Audio]:
        """Stream a chat reply (:meth:`generate` of a ChatRequest; a bare TextRequest is not spoken; a string is
        one user message)."""
        if isinstance(request, str):
            request = TextRequest(messages=(ChatMessage(Role.USER, request),))
        return self.generate(request if isinstance(request, ChatRequest) else ChatRequest(request), timeout=timeout)

    def speech(
        self,
        request: SpeechRequest | str | AsyncIterator[TextDelta],
        /,
        *,
        timeout: float | None = None,
        **fields: Any,
    ) -> SpeechStream:
        """Stream speech for ``request`` (or text, or streamed text deltas, plus SpeechRequest fields).

        Invalid requests raise here, before anything streams. The stream starts on first iteration.
        """
        if not isinstance(request, SpeechRequest):
            request = SpeechRequest(text=request, **fields)
        elif fields:
            request = replace(request, **fields)
        spec = find_pipeline(request, self.models)
        ctx = self._context(request, timeout)
        resolved: SpeechRequest = spec.check(self.models, request, self.voices)
        plan = spec.plan(self.models, resolved, ctx)
        stream = SpeechStream(resolved, plan.pipeline(tagged=False).run(ctx, plan.source), self.metrics)
        self._track(stream)
        return stream

    def abort(self, request_id: str, exc: BaseException | None = None) -> bool:
        """Stop request ``request_id`` now (its slots are free before the next step); False if it is not running.

        Its consumer's next read raises ``exc`` (default: RequestCancelled).
        """
        stream = self._streams.get(request_id)
        if stream is None or not stream.live:
            return False
        stream.abort(exc if exc is not None else RequestCancelled(f"request {request_id} was aborted"))
        return True

    def _context(self, request: object, timeout: float | None) -> RequestContext:
        if self._closed:
            raise EngineClosed("engine is closed")
        request_id = getattr(request, "request_id", None)
        if not isinstance(request_id, str):
            raise InvalidRequestError(f"a {type(request).__name__} has no request_id")
        running = self._streams.get(request_id)
        if running is not None and running.live:  # abort(request_id) could not tell the two apart
            raise InvalidRequestError(f"a request with request_id {request_id!r} is already running", "request_id")
        return RequestContext.with_timeout(
            timeout, request_id=request_id, wait_timeout=self.wait_timeout, guard=self.worker.cond
        )

    def _track(self, stream: EngineStream[object]) -> None:
        self._streams[stream.request_id] = stream

    async def create_voice_prompt(
        self, audio: np.ndarray, sample_rate: int, ref_text: str | None = None
    ) -> VoicePrompt:
        """Extract a reusable cloning prompt from float32 mono ``audio`` at ``sample_rate`` Hz (Base models).

        Bounded by ``wait_timeout``: past it, DeadlineExceeded.
        """
        if self._closed:
            raise EngineClosed("engine is closed")
        family = self.models.speech()
        check_task(family.info, TaskType.BASE)
        samples = check_reference(audio, sample_rate)
        with RequestContext(wait_timeout=self.wait_timeout).fail_after("voice prompt extraction"):
            prompt = await family.create_voice_prompt(samples, sample_rate, (ref_text or "").strip() or None)
        return prompt

    def count_text_tokens(self, text: str, kind: str = ModelKind.SPEECH) -> int:
        """Tokens of ``text`` under the ``kind`` model's tokenizer (blocking for long text: call it off the loop)."""
        family = self.models.get(kind)
        count = getattr(family, "count_text_tokens", None)
        if count is None:
            raise InvalidRequestError(f"the {kind} model does not count text tokens")
        return int(count(text))

    async def aclose(self) -> None:
        """Fail open streams with EngineClosed, close every model, stop the device worker."""
        if self._closed:
            return
        self._closed = True
        for stream in list(self._streams.values()):
            stream.abort(EngineClosed("engine closed while the request was streaming"))
        try:
            for family in self.models:
                await family.aclose()
        finally:
            await self.worker.aclose()
            if self._holds_heap:
                self._holds_heap = False
                release_loaded_heap()

    async def __aenter__(self) -> AsyncEngine:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
