"""What every route shares: the engine, the settings, the voice store and the HTTP counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio
from omni_stream.realtime.settings import Settings
from omni_stream.realtime.voice_store import VoiceStore
from prometheus_client import CollectorRegistry, Counter, Gauge


@dataclass(slots=True)
class HttpMetrics:
    """Serving-layer counters, in their own registry (exposed on /metrics beside the engine's)."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    requests: Any = None
    streams: Any = None
    disconnects: Any = None
    audio_sent: Any = None

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
            "Generations cancelled because the client went away, by transport.",
            ["transport"],
            registry=self.registry,
        )
        self.audio_sent = Counter(
            "omni_stream_audio_sent_seconds",
            "Seconds of streamed audio handed to the transport, by transport.",
            ["transport"],
            registry=self.registry,
        )


@dataclass(slots=True)
class ServerState:
    """Attached to ``app.state.omni``; ``engine`` is None until the lifespan has loaded it."""

    settings: Settings
    voices: VoiceStore
    engine: Any = None
    metrics: HttpMetrics = field(default_factory=HttpMetrics)
    ready: bool = False
    stopping: Any = None  # anyio.Event (made in the lifespan), set when the server begins to shut down
    sessions: set[Any] = field(default_factory=set)  # open WebSocket sessions, each with a ``finished`` event

    async def begin_shutdown(self, grace: float) -> None:
        """Ask open WebSocket sessions to close (1001) and wait up to ``grace`` s for them to finish."""
        if self.stopping is None:
            return
        self.stopping.set()
        with anyio.move_on_after(grace):
            for session in list(self.sessions):
                await session.finished.wait()

    def served_models(self) -> tuple[str, ...]:
        """The names the ``model`` field may carry."""
        names = []
        if self.settings.model_name:
            names.append(self.settings.model_name)
        if self.engine is not None and self.engine.info.model_name not in names:
            names.append(self.engine.info.model_name)
        return tuple(names)

    @property
    def model_id(self) -> str:
        """The name /v1/models lists."""
        return self.served_models()[0] if self.served_models() else "omni-stream"
