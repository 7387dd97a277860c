"""WS /v1/video/chat/stream: the anyio shell around
:class:`~omni_stream.realtime.video_chat.protocol.VideoChatProtocol`.

The connection runs in the one WebSocket shell (:mod:`omni_stream.realtime.common.ws_shell`: accept, the registry
of open sessions, shutdown, close codes). Inside it, one task group per connection: the receiver feeds client
messages (and the protocol's timers) to the protocol and decodes the frames it asks for in a worker thread (the
next message is read once the frame is in, so a client that floods frames is slowed to the decoder's pace, and
frames are offered in the order they came); a query task runs each reply: the audio's transcript, if any, then
the text model's reply (with its speech, when the session asks for audio), whose events it feeds back to the
protocol. The two call the protocol one transition at a time (a lock), so events go out in the protocol's order;
messages over 64 KiB (a frame's base64, audio) are parsed in a worker thread too. Leaving the session, however it
ends, aborts the running requests (released before the next model step).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, Self, runtime_checkable

import anyio
import numpy as np
from anyio.abc import TaskGroup
from starlette.websockets import WebSocket

from omni_stream.chunks import Audio, TextDelta
from omni_stream.codecs.pcm import to_int16
from omni_stream.codecs.resample import resample
from omni_stream.codecs.wav import wav_header
from omni_stream.engine import RequestStream
from omni_stream.errors import InvalidRequestError, RequestCancelled
from omni_stream.family import ModelKind
from omni_stream.realtime.common.errors import from_exception
from omni_stream.realtime.common.ws_shell import CLOSE_GRACE, Socket, is_gone, serve_websocket
from omni_stream.realtime.state import ServerState
from omni_stream.realtime.video_chat.protocol import (
    AUDIO_RATE,
    Action,
    CacheFrame,
    CancelQuery,
    Close,
    DecodeFrame,
    OpenCache,
    Query,
    SendText,
    StartQuery,
    VideoChatLimits,
    VideoChatProtocol,
)
from omni_stream.transcription.spec import TranscriptionRequest, transcription_family
from omni_stream.vision.frames import decode_base64

log = logging.getLogger("omni_stream.realtime.video_chat")

ROUTE = "/v1/video/chat/stream"
LABEL = "video_chat"  # the stream gauge's and the disconnect counter's transport label
PARSE_OFF_LOOP_CHARS = 64 * 1024  # client messages longer than this are parsed in a worker thread


class FrameCache(Protocol):
    """A text model's cache of one session's frames (Qwen2.5-VL's ``FrameSession``): ``async with`` it open.
    ``aclose`` frees it even when its caller is cancelled meanwhile (an anyio scope or a plain ``task.cancel()``),
    and one whose ``__aenter__`` was cancelled closes itself once open."""

    @property
    def frames(self) -> tuple[np.ndarray, ...]: ...

    async def __aenter__(self) -> Self: ...

    async def add_frame(self, image: np.ndarray) -> None: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class CachesFrames(Protocol):
    """A text family that keeps sessions' frames in its cache."""

    def frame_session(self, *, max_frames: int, system: str | None) -> FrameCache: ...


async def video_chat_stream(websocket: WebSocket) -> None:
    await serve_websocket(websocket, LABEL, _open)


async def _open(socket: Socket, state: ServerState) -> VideoChatSession:
    return VideoChatSession(socket, state)


def wav_file(audio: Audio) -> bytes:
    """A whole PCM16 WAV file of ``audio`` (mono)."""
    samples = audio.samples if audio.samples.ndim == 1 else audio.samples.mean(axis=1)
    pcm = to_int16(np.ascontiguousarray(samples, dtype=np.float32)).tobytes()
    return wav_header(audio.sample_rate, 1, len(pcm)) + pcm


def asr_input(pcm: bytes, rate: int) -> np.ndarray:
    """PCM16 at 16 kHz -> float32 at the transcription model's rate (a worker-thread job)."""
    x = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
    return x if rate == AUDIO_RATE else resample(x, AUDIO_RATE, rate)


class VideoChatSession:
    """One video chat connection; ``streams`` the engine requests running now (by query id)."""

    def __init__(self, socket: Socket, state: ServerState, clock: Callable[[], float] = time.monotonic) -> None:
        self.socket = socket
        self.state = state
        self.clock = clock
        self.engine = state.ready_engine
        settings = state.settings
        self.limits = VideoChatLimits(
            config_timeout=settings.ws_config_timeout,
            idle_timeout=settings.video_chat_idle_timeout,
            max_reply_tokens=settings.video_chat_max_tokens,
            frames=settings.frame_limits,
        )
        models = self.engine.models
        text = models.get(ModelKind.TEXT) if ModelKind.TEXT in models else None
        self.caches = text if isinstance(text, CachesFrames) else None
        self.protocol = VideoChatProtocol(
            models=state.served_models(ModelKind.TEXT),
            speaks=ModelKind.SPEECH in models,
            hears=ModelKind.TRANSCRIPTION in models,
            caches=self.caches is not None,
            limits=self.limits,
            now=clock(),
        )
        self.streams: dict[int, list[RequestStream[Any]]] = {}
        self.finished = anyio.Event()  # set once the session has ended (server shutdown waits on it)
        self.closed = False
        self._scope: anyio.CancelScope | None = None
        self._tg: TaskGroup | None = None
        self._lock = anyio.Lock()  # one protocol transition at a time (see _step)
        self.cache: FrameCache | None = None  # the text model's frame session, once open

    # --- life ---

    async def serve(self, socket: Socket) -> int | None:
        """The session until it ends (the protocol's actions close the socket; see ws_shell.SocketSession)."""
        try:
            async with anyio.create_task_group() as tg:
                self._scope, self._tg = tg.cancel_scope, tg
                await self._receive_loop()
                tg.cancel_scope.cancel()
        except Exception as exc:
            if not is_gone(exc):
                raise
        finally:
            for query_id in list(self.streams):
                self._cancel(query_id)
            cache, self.cache = self.cache, None
            if cache is not None:
                await cache.aclose()  # shielded: the session's rows are freed however it ends
        return None

    async def shutting_down(self, socket: Socket) -> None:
        await self._step(self.protocol.shutdown)

    async def failed(self, socket: Socket, exc: BaseException) -> None:
        """Nothing more to say: the shell closes with 1011."""

    async def _receive_loop(self) -> None:
        while not self.closed:
            deadline = self.protocol.deadline()
            message = await self.socket.receive(None if deadline is None else deadline - self.clock())
            if message is None:
                await self._step(self.protocol.timeout, self.clock())
                continue
            if message["type"] == "websocket.disconnect":
                if self.streams:
                    self.state.metrics.disconnects.labels(LABEL).inc()
                await self._step(self.protocol.disconnected)
                return
            text = message.get("text")
            if text is not None:
                heavy = len(text) > PARSE_OFF_LOOP_CHARS  # a frame's base64, audio: parsed in a worker thread
                await self._step(self.protocol.receive_text, text, self.clock(), heavy=heavy)
            else:
                await self._step(self.protocol.receive_binary, message.get("bytes") or b"", self.clock())

    # --- actions ---

    async def _step(self, transition: Callable[..., list[Action]], *args: Any, heavy: bool = False) -> None:
        """Apply one protocol transition (``heavy``: in a worker thread) and perform its actions, one transition at a
        time: the receiver's and the query task's never interleave, so their events go out in the protocol's
        order. A frame to decode is decoded after the lock is released (its result is a transition of its own)."""
        async with self._lock:
            actions = await anyio.to_thread.run_sync(transition, *args) if heavy else transition(*args)
            await self._perform([a for a in actions if not isinstance(a, DecodeFrame | OpenCache | CacheFrame)])
        for action in actions:  # model work, after the lock (each result is a transition of its own)
            if self.closed:
                break
            if isinstance(action, DecodeFrame):
                await self._decode(action)
            elif isinstance(action, OpenCache):
                await self._open_cache(action)
            elif isinstance(action, CacheFrame) and self.cache is not None:
                try:
                    await self.cache.add_frame(action.frame.pixels)
                except InvalidRequestError as exc:
                    await self._step(self.protocol.frame_not_cached, exc)

    async def _perform(self, actions: Sequence[Action]) -> None:
        """Carry out ``actions`` in order. A closing call gets :data:`CLOSE_GRACE` seconds in all: a reader that
        stopped reading takes no more bytes, and its session must still end."""
        for action in actions:
            if isinstance(action, CancelQuery):
                self._cancel(action.query_id)  # first: a stalled socket must not delay releasing the request
        close = next((a for a in actions if isinstance(a, Close)), None)
        with anyio.move_on_after(math.inf if close is None else CLOSE_GRACE):
            for action in actions:
                if isinstance(action, SendText):
                    if not await self._send(action.text):
                        self._end()  # the client is gone
                        return
                elif isinstance(action, StartQuery):
                    assert self._tg is not None
                    self.streams[action.query.query_id] = []
                    self._tg.start_soon(self._run_query, action.query)
            if close is not None:
                await self.socket.close(close.code)
        if close is not None:
            self._end()

    async def _send(self, text: str) -> bool:
        try:
            await self.socket.send_text(text)
        except Exception as exc:
            if not is_gone(exc) and not isinstance(exc, RuntimeError):
                raise
            return False
        return True

    async def _decode(self, action: DecodeFrame) -> None:
        try:
            frame = await anyio.to_thread.run_sync(decode_base64, action.data, self.limits.frames, "data")
        except InvalidRequestError as exc:
            await self._step(self.protocol.frame_refused, exc)
            return
        await self._step(self.protocol.frame_decoded, frame)

    async def _open_cache(self, action: OpenCache) -> None:
        """Open the text model's frame session; without one free, queries show their frames in whole prompts."""
        assert self.caches is not None
        cache = self.caches.frame_session(max_frames=action.max_frames, system=action.system)
        try:
            with anyio.CancelScope(shield=True):  # opened and recorded together: serve() closes what was opened
                await cache.__aenter__()
                self.cache = cache
        except InvalidRequestError as exc:
            log.info("video chat without a frame session: %s", exc.message)
            return
        await self._step(self.protocol.cache_opened)

    def _cancel(self, query_id: int) -> None:
        for stream in self.streams.pop(query_id, ()):
            stream.abort(RequestCancelled(f"request {stream.request_id} was stopped"))

    def _end(self) -> None:
        self.closed = True
        for query_id in list(self.streams):
            self._cancel(query_id)
        if self._scope is not None:
            self._scope.cancel()

    # --- a query ---

    async def _run_query(self, query: Query) -> None:
        qid = query.query_id
        try:
            transcript = await self._transcribe(query) if query.audio else ""
            if qid not in self.streams:
                return  # stopped meanwhile
            frames = self.cache.frames if query.cached and self.cache is not None else ()
            stream = self.engine.generate(query.request(transcript, frames or None))
            self.streams[qid].append(stream)
            await self._step(self.protocol.query_started, qid)
            async with stream:
                async for out in stream:
                    chunk = out.chunk
                    if out.stage == "text" and isinstance(chunk, TextDelta):
                        await self._step(self.protocol.query_text, qid, chunk.text)
                        if out.last:
                            await self._step(self.protocol.query_text_done, qid)
                    elif isinstance(chunk, Audio) and chunk.samples.size:
                        wav = await anyio.to_thread.run_sync(wav_file, chunk)
                        await self._step(self.protocol.query_audio, qid, wav)
        except RequestCancelled:
            return  # stopped: a newer query, the client gone, or the server stopping
        except InvalidRequestError as exc:
            await self._step(self.protocol.query_failed, qid, "invalid_request", exc.message, exc.param)
            return
        except Exception as exc:
            log.exception("a video chat query failed")
            await self._step(self.protocol.query_failed, qid, "generation_failed", from_exception(exc).message)
            return
        finally:
            self.streams.pop(qid, None)
        await self._step(self.protocol.query_done, qid)

    async def _transcribe(self, query: Query) -> str:
        """The transcript of the audio streamed before the query."""
        rate = transcription_family(self.engine.models).info.sample_rate
        audio = await anyio.to_thread.run_sync(asr_input, query.audio, rate)
        stream = self.engine.generate(TranscriptionRequest(audio, rate))
        self.streams[query.query_id].append(stream)
        parts = []
        async with stream:
            async for out in stream:
                if isinstance(out.chunk, TextDelta):
                    parts.append(out.chunk.text)
        return "".join(parts)
