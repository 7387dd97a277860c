"""What every route shares: the engine, the settings, the voice store and the HTTP counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import anyio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from omni_stream.engine import AsyncEngine
from omni_stream.family import ModelKind
from omni_stream.realtime.settings import Settings
from omni_stream.realtime.speech.voice_store import VoiceStore

if TYPE_CHECKING:
    from fastrtc import Stream  # the webrtc extra


class OpenSession(Protocol):
    """An open WebSocket or WebRTC session, as a shutdown waits for it."""

    @property
    def finished(self) -> anyio.Event:
        """Set once the session has ended."""
        ...


@dataclass(slots=True)
class HttpMetrics:
    """Serving-layer counters, in their own registry (exposed on /metrics beside the engine's)."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    requests: Counter = field(init=False)
    streams: Gauge = field(init=False)
    disconnects: Counter = field(init=False)
    audio_sent: Counter = field(init=False)
    turn_model: Histogram = field(init=False)

    def __post_init__(self) -> None:
        self.requests = Counter(
            "omni_stream_http_requests",
            "HTTP requests answered, by route and status code.",
            ["route", "status"],
            registry=self.registry,
        )
        self.streams = Gauge(
            "omni_stream_active_streams",
            "Speech responses and WebSocket sessions now open, by transport.",
            ["transport"],
            registry=self.registry,
        )
        self.disconnects = Counter(
            "omni_stream_client_disconnects",
            "Generations cancelled because the client went away, by transport (http, sse, chat, ws: the speech "
            "socket left mid-utterance, realtime: the agent's socket left mid-response or mid-transcription, video).",
            ["transport"],
            registry=self.registry,
        )
        self.audio_sent = Counter(
            "omni_stream_audio_sent_seconds",
            "Seconds of streamed audio handed to the transport, by transport.",
            ["transport"],
            registry=self.registry,
        )
        # Split so that a slow turn decision says why: waiting for a thread, contention (run well over cpu: other
        # threads held the cores or the GIL), or the model itself (cpu).
        self.turn_model = Histogram(
            "omni_stream_turn_model_seconds",
            "semantic_vad's end-of-turn model, per pause judged: wait (the pause noticed -> the model's thread "
            "starts), run (the call, wall clock), cpu (the calling thread's CPU time in it).",
            ["phase"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28),
            registry=self.registry,
        )

    def observe_turn_model(self, wait_s: float, run_s: float, cpu_s: float) -> None:
        self.turn_model.labels("wait").observe(wait_s)
        self.turn_model.labels("run").observe(run_s)
        self.turn_model.labels("cpu").observe(cpu_s)


@dataclass(slots=True)
class ServerState:
    """Attached to ``app.state.omni``; ``engine`` is None until the lifespan has loaded it."""

    settings: Settings
    voices: VoiceStore
    engine: AsyncEngine | None = None
    metrics: HttpMetrics = field(default_factory=HttpMetrics)
    ready: bool = False
    stopping: anyio.Event | None = None  # made in the lifespan, set when the server begins to shut down
    sessions: set[OpenSession] = field(default_factory=set)  # open WebSocket and WebRTC sessions
    rtc: Stream | None = None  # the fastrtc Stream behind /rtc (when the webrtc extra is installed)
    rtc_camera: Stream | None = None  # the one behind /rtc/camera (the agent that sees)
    startup_error: BaseException | None = None  # why start-up failed, where it is a user's to fix (a config, a path)

    async def begin_shutdown(self, grace: float) -> None:
        """Ask open WebSocket sessions to close (1001) and wait up to ``grace`` s for them to finish."""
        if self.stopping is None:
            return
        self.stopping.set()
        with anyio.move_on_after(grace):
            for session in list(self.sessions):
                await session.finished.wait()

    @property
    def ready_engine(self) -> AsyncEngine:
        """The loaded engine (routes run only after the lifespan has loaded it)."""
        if self.engine is None:
            raise RuntimeError("the engine is not loaded yet")
        return self.engine

    def served_models(self, kind: str = ModelKind.SPEECH) -> tuple[str, ...]:
        """The names the ``model`` field of a ``kind`` request may carry (``--served-model-name`` names speech)."""
        names = []
        if self.settings.model_name and kind == ModelKind.SPEECH:
            names.append(self.settings.model_name)
        if self.engine is not None and kind in self.engine.models:
            name = self.engine.models.get(kind).info.model_name
            if name not in names:
                names.append(name)
        return tuple(names)

    def model_ids(self) -> dict[str, str]:
        """The id /v1/models lists for each loaded kind."""
        if self.engine is None:
            return {}
        return {kind: self.served_models(kind)[0] for kind in self.engine.models.kinds}

    @property
    def model_id(self) -> str:
        """The primary model's id (speech if loaded, else the first model)."""
        ids = self.model_ids()
        return ids.get(ModelKind.SPEECH) or next(iter(ids.values()), "omni-stream")
