"""The Starlette application: routes, error handlers, auth, and a lifespan that owns the engine."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio.to_thread
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from omni_stream.engine import AsyncEngine
from omni_stream.errors import OmniStreamError
from omni_stream.realtime import health
from omni_stream.realtime.agent import rtc as realtime_rtc
from omni_stream.realtime.agent import ws as realtime_ws
from omni_stream.realtime.chat import http as chat
from omni_stream.realtime.common.auth import ApiKeyMiddleware
from omni_stream.realtime.common.errors import http_exception_handler, internal_error_handler
from omni_stream.realtime.images import http as images
from omni_stream.realtime.replica import ReplicaHeaderMiddleware
from omni_stream.realtime.settings import Settings
from omni_stream.realtime.speech import batch as speech_batch
from omni_stream.realtime.speech import http as speech_http
from omni_stream.realtime.speech import stream as speech_ws
from omni_stream.realtime.speech import voices
from omni_stream.realtime.speech.voice_store import VoiceStore
from omni_stream.realtime.state import ServerState
from omni_stream.realtime.transcription import http as transcription
from omni_stream.realtime.video import ws as video_ws
from omni_stream.realtime.video_chat import ws as video_chat_ws
from omni_stream.runtime.gc_heap import freeze_loaded_heap, release_loaded_heap
from omni_stream.turns.vad import VadParams

log = logging.getLogger("omni_stream.realtime")

STATIC_DIR = Path(__file__).parent / "static"
EngineFactory = Callable[[], Awaitable[AsyncEngine]]


def _page(path: Path) -> Callable[[Any], Awaitable[Response]]:
    """A GET endpoint answering with the page at ``path`` (404 while it is missing)."""

    async def page(request: Any) -> Response:
        if not await anyio.Path(path).is_file():
            raise HTTPException(404)
        return FileResponse(path)

    return page


class PageAssets(StaticFiles):
    """The pages' files: what a browser loads (scripts, worklets, styles), not the folder's Python package marker."""

    def lookup_path(self, path: str) -> tuple[str, os.stat_result | None]:
        if path.endswith((".py", ".pyc")) or "__pycache__" in path:
            return "", None  # a 404, as for a file that is not there
        return super().lookup_path(path)


def _routes(static_dir: Path | None) -> list[BaseRoute]:
    routes: list[BaseRoute] = [
        Route("/health", health.health, methods=["GET"]),
        Route("/metrics", health.metrics, methods=["GET"]),
        Route("/v1/models", health.list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", health.get_model, methods=["GET"]),
        Route("/v1/audio/speech", speech_http.create_speech, methods=["POST"]),
        Route("/v1/audio/voices", voices.list_voices, methods=["GET"]),
        Route("/v1/audio/voices", voices.upload_voice, methods=["POST"]),
        Route("/v1/audio/voices/{name}", voices.delete_voice, methods=["DELETE"]),
        Route("/v1/audio/voices/", voices.delete_without_name, methods=["DELETE"]),
        Route(speech_batch.ROUTE, speech_batch.create_speech_batch, methods=["POST"]),
        WebSocketRoute("/v1/audio/speech/stream", speech_ws.speech_stream),
        Route(transcription.ROUTE, transcription.create_transcription, methods=["POST"]),
        Route(transcription.TRANSLATIONS_ROUTE, transcription.create_translation, methods=["POST"]),
        Route("/v1/chat/completions", chat.create_chat_completion, methods=["POST"]),
        Route(images.EDITS_ROUTE, images.create_edit, methods=["POST"]),
        Route(images.GENERATIONS_ROUTE, images.create_generation, methods=["POST"]),
        WebSocketRoute("/v1/realtime/video", video_ws.video_stream),
        WebSocketRoute(video_chat_ws.ROUTE, video_chat_ws.video_chat_stream),
        WebSocketRoute("/v1/realtime", realtime_ws.realtime_endpoint),
    ]
    if static_dir is not None and static_dir.is_dir():
        routes += [
            Route("/", _page(static_dir / "index.html"), methods=["GET"]),
            Route("/video", _page(static_dir / "video.html"), methods=["GET"]),
            Route("/realtime", _page(static_dir / "realtime.html"), methods=["GET"]),
            Route("/transcribe", _page(static_dir / "transcribe.html"), methods=["GET"]),
            Mount("/static", PageAssets(directory=static_dir), name="static"),
        ]
    return routes


class StartupErrors:
    """ASGI middleware: a start-up that failed for a reason the user fixes (a checkpoint that is not one, a model of
    a kind loaded twice, a path that is a file) is reported as its one-line message, not as the traceback Starlette
    puts in ``lifespan.startup.failed`` (uvicorn logs that message, then exits with status 3)."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def reworded(message: Message) -> None:
            error = self.state.startup_error
            if message["type"] == "lifespan.startup.failed" and error is not None:
                message = {**message, "message": f"omni-stream: cannot start: {error}"}
            await send(message)

        await self.app(scope, receive, reworded)


class StartupStopped(OmniStreamError):
    """The server was asked to stop while its models loaded."""


async def _unless_stopped(factory: EngineFactory, stopping: anyio.Event) -> AsyncEngine:
    """``await factory()``, cancelled once ``stopping`` is set (a signal while the models load): the engine's load
    closes what it had loaded, between one model and the next."""
    loaded: list[AsyncEngine] = []
    try:
        async with anyio.create_task_group() as tg:

            async def stop() -> None:
                await stopping.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(stop)
            loaded.append(await factory())
            tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:  # the load's own error, as it was raised (the watcher raises none)
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from group
        raise
    if not loaded:
        raise StartupStopped("stopped while the models were loading")
    return loaded[0]


def create_app(engine: AsyncEngine | EngineFactory, settings: Settings | None = None) -> Starlette:
    """The server app for ``engine`` (an AsyncEngine, or an async factory the lifespan awaits and then closes).

    A ready engine passed in stays owned by the caller; one built by the factory is closed at shutdown.
    """
    settings = settings or Settings()
    state = ServerState(settings=settings, voices=VoiceStore(settings.voices_dir, settings.max_voices))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            owned, loaded = await start()
        except (OmniStreamError, OSError) as exc:  # a config, a path, a file: said in one line (StartupErrors)
            state.startup_error = exc
            raise
        try:
            yield
        finally:
            state.ready = False
            release_loaded_heap()
            if owned:
                await loaded.aclose()

    async def start() -> tuple[bool, AsyncEngine]:
        state.stopping = anyio.Event()
        restored = await anyio.to_thread.run_sync(state.voices.load)
        if restored:
            log.info("restored %d uploaded voice(s) from %s", restored, settings.voices_dir)
        if settings.vad_factory is not None:  # a detector's network loads here, not in a session's first event
            await anyio.to_thread.run_sync(settings.vad_factory, VadParams())
        if settings.turn_model_factory is not None:  # so does semantic_vad's end-of-turn model (and its first run)
            await anyio.to_thread.run_sync(settings.turn_model_factory)
        owned = not isinstance(engine, AsyncEngine)
        loaded = engine if isinstance(engine, AsyncEngine) else await _unless_stopped(engine, state.stopping)
        loaded.use_voices(state.voices)  # uploaded voices: the engine resolves voice names through the store
        state.engine = loaded
        # The models' objects (millions once transformers or diffusers are imported) live as long as the server:
        # out of the collector's reach, a full collection no longer stalls the event loop (0.8 s measured with an
        # image model loaded, benchmarks/image_bench.py). The engine froze its load already; this takes in what
        # start-up made since (voices, the VAD). Counted with the engines' holds, so stopping the app leaves an
        # engine that outlives it (one passed in) frozen, and the last holder unfreezes.
        await anyio.to_thread.run_sync(freeze_loaded_heap)
        state.ready = True
        return owned, loaded

    static_dir = settings.static_dir or STATIC_DIR
    middleware = [Middleware(StartupErrors, state=state), Middleware(ApiKeyMiddleware, api_key=settings.api_key)]
    if settings.replica_id is not None:
        middleware.insert(0, Middleware(ReplicaHeaderMiddleware, replica_id=settings.replica_id))
    app = Starlette(
        routes=[*_routes(static_dir), *realtime_rtc.routes(state)],
        middleware=middleware,
        exception_handlers={HTTPException: http_exception_handler, Exception: internal_error_handler},
        lifespan=lifespan,
    )
    app.state.omni = state
    return app
