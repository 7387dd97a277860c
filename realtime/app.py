"""The Starlette application: routes, error handlers, auth, and a lifespan that owns the engine."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio.to_thread
from omni_stream.realtime import health, realtime_rtc, realtime_ws, speech_http, speech_ws, voices
from omni_stream.realtime.auth import ApiKeyMiddleware
from omni_stream.realtime.errors import http_exception_handler, internal_error_handler
from omni_stream.realtime.settings import Settings
from omni_stream.realtime.state import ServerState
from omni_stream.realtime.voice_store import VoiceStore
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

log = logging.getLogger("omni_stream.realtime")

STATIC_DIR = Path(__file__).parent / "static"
EngineFactory = Callable[[], Awaitable[Any]]


def _routes(static_dir: Path | None) -> list[BaseRoute]:
    routes: list[BaseRoute] = [
        Route("/health", health.health, methods=["GET"]),
        Route("/metrics", health.metrics, methods=["GET"]),
        Route("/v1/models", health.list_models, methods=["GET"]),
        Route("/v1/audio/speech", speech_http.create_speech, methods=["POST"]),
        Route("/v1/audio/voices", voices.list_voices, methods=["GET"]),
        Route("/v1/audio/voices", voices.upload_voice, methods=["POST"]),
        Route("/v1/audio/voices/{name}", voices.delete_voice, methods=["DELETE"]),
        WebSocketRoute("/v1/audio/speech/stream", speech_ws.speech_stream),
        WebSocketRoute("/v1/realtime", realtime_ws.realtime_endpoint),
    ]
    if static_dir is not None and static_dir.is_dir():
        index = static_dir / "index.html"

        async def home(request: Any) -> Response:
            if not index.is_file():
                raise HTTPException(404)
            return FileResponse(index)

        async def realtime_page(request: Any) -> Response:
            return FileResponse(static_dir / "realtime.html")

        routes += [
            Route("/", home, methods=["GET"]),
            Route("/realtime", realtime_page, methods=["GET"]),
            Mount("/static", StaticFiles(directory=static_dir), name="static"),
        ]
    return routes


def create_app(engine: Any | EngineFactory, settings: Settings | None = None) -> Starlette:
    """The server app for ``engine`` (an AsyncEngine, or an async factory the lifespan awaits and then closes).

    A ready engine passed in stays owned by the caller; one built by the factory is closed at shutdown.
    """
    settings = settings or Settings()
    state = ServerState(settings=settings, voices=VoiceStore(settings.voices_dir, settings.max_voices))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        owned = callable(engine) and not hasattr(engine, "speech")
        state.stopping = anyio.Event()
        restored = await anyio.to_thread.run_sync(state.voices.load)
        if restored:
            log.info("restored %d uploaded voice(s) from %s", restored, settings.voices_dir)
        state.engine = await engine() if owned else engine
        state.ready = True
        try:
            yield
        finally:
            state.ready = False
            if owned:
                await state.engine.aclose()

    static_dir = settings.static_dir or STATIC_DIR
    app = Starlette(
        routes=[*_routes(static_dir), *realtime_rtc.routes(state)],
        middleware=[Middleware(ApiKeyMiddleware, api_key=settings.api_key)],
        exception_handlers={HTTPException: http_exception_handler, Exception: internal_error_handler},
        lifespan=lifespan,
    )
    app.state.omni = state
    return app
