"""WS /v1/realtime/video: the anyio shell around :class:`~omni_stream.realtime.video.protocol.VideoProtocol`.

The connection runs in the one WebSocket shell (:mod:`omni_stream.realtime.common.ws_shell`: accept, the registry of
open sessions, shutdown, close codes). Inside it, one task group per connection: the receiver feeds client messages
(and the protocol's timers) to the protocol; once ``session.start`` is accepted, a generator task streams the
engine's :class:`~omni_stream.video.spec.VideoChunk` s, encodes each off the event loop
(:class:`~omni_stream.codecs.video.VideoStreamEncoder`) and sends its metadata and bytes as one pair. Both perform
the actions the protocol returns.

Buffering bound. The generator task takes chunk k + 1 from the engine only after the socket took chunk k's bytes,
and the engine's stage starts chunk k + 2 only after chunk k + 1 was taken (:mod:`omni_stream.models.helios.family`).
So a session whose reader stalls holds at most two chunks the client has not received, beyond what the socket
buffers: the one being sent (its encoded bytes, ``peak_unsent_bytes``) and one generated chunk (raw frames) in the
stage, and its request runs no model step until the reader resumes, leaves, or the stall timeout ends the session.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import numpy as np
from starlette.websockets import WebSocket

from omni_stream.chunks import VideoChunk
from omni_stream.codecs.video import VideoStreamEncoder
from omni_stream.engine import RequestStream
from omni_stream.errors import InvalidRequestError, RequestCancelled
from omni_stream.family import ModelKind
from omni_stream.realtime.common.errors import from_exception
from omni_stream.realtime.common.ws_shell import CLOSE_GRACE, Socket, is_gone, serve_websocket
from omni_stream.realtime.state import ServerState
from omni_stream.realtime.video.protocol import (
    Action,
    Close,
    SendBinary,
    SendText,
    StartGeneration,
    StopGeneration,
    VideoLimits,
    VideoProtocol,
)
from omni_stream.video.spec import VideoFamily, VideoRequest

log = logging.getLogger("omni_stream.realtime.video")

MAX_IMAGE_PIXELS = 4096 * 4096


async def video_stream(websocket: WebSocket) -> None:
    await serve_websocket(websocket, "video", _open)


async def _open(socket: Socket, state: ServerState) -> VideoSession:
    return VideoSession(socket, state)


def decode_image(url: str) -> np.ndarray:
    """The RGB pixels of a ``data:`` URL image; InvalidRequestError when it is not a decodable image."""
    from PIL import Image, UnidentifiedImageError

    header, sep, payload = url.partition(",")
    if not sep or not header.endswith(";base64"):
        raise InvalidRequestError("image_reference must be a base64 data: URL", "image_reference")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequestError("image_reference is not valid base64", "image_reference") from None
    try:
        with Image.open(io.BytesIO(raw)) as image:
            if image.width * image.height > MAX_IMAGE_PIXELS:
                raise InvalidRequestError(
                    f"image_reference is larger than {MAX_IMAGE_PIXELS} pixels", "image_reference"
                )
            return np.asarray(image.convert("RGB"), dtype=np.uint8).copy()
    except Image.DecompressionBombError:
        raise InvalidRequestError(
            f"image_reference is larger than {MAX_IMAGE_PIXELS} pixels", "image_reference"
        ) from None
    except UnidentifiedImageError:  # its message shows the buffer object, not the data: say what was expected
        raise InvalidRequestError(
            "image_reference is not an image file (PNG, JPEG, WebP, ...)", "image_reference"
        ) from None
    except OSError as exc:  # truncated or corrupt data
        raise InvalidRequestError(f"image_reference could not be decoded: {exc}", "image_reference") from None


class VideoSession:
    """One video connection; ``generated``, ``sent``, ``sent_progress``, ``peak_unsent_bytes`` and ``encoded_bytes``
    count its chunks and bytes."""

    def __init__(self, socket: Socket, state: ServerState, clock: Callable[[], float] = time.monotonic) -> None:
        self.socket = socket
        self.state = state
        self.clock = clock
        self.engine = state.ready_engine
        settings = state.settings
        frames_per_chunk = None  # the model's own chunk size: without a video model session.start is refused
        if ModelKind.VIDEO in self.engine.models:
            frames_per_chunk = self._family().info.frames_per_chunk
        self.protocol = VideoProtocol(
            self._resolve,
            models=state.served_models(ModelKind.VIDEO),
            frames_per_chunk=frames_per_chunk,
            limits=VideoLimits(
                start_timeout=settings.video_start_timeout,
                stall_timeout=settings.video_stall_timeout,
            ),
            now=clock(),
        )
        self.stream: RequestStream[VideoChunk] | None = None
        self.finished = anyio.Event()  # set once the session has ended (server shutdown waits on it)
        self.generated = 0  # chunks taken from the engine
        self.sent = 0  # chunks whose bytes the socket took
        self.sent_progress: list[int] = []  # frames the engine had generated when each chunk's bytes were sent
        self.peak_unsent_bytes = 0  # the largest encoded chunk held while the socket takes it
        self.encoded_bytes = 0  # all bytes encoded for this session (sent, being sent, or in socket buffers)
        self.closed = False
        self._scope: anyio.CancelScope | None = None
        self._encoder: VideoStreamEncoder | None = None

    def _family(self) -> VideoFamily:
        family = self.engine.models.get(ModelKind.VIDEO)
        assert isinstance(family, VideoFamily)
        return family

    def _resolve(self, request: VideoRequest) -> VideoRequest:
        return self.engine.resolve(request)

    @property
    def request_id(self) -> str | None:
        return self.protocol.request_id

    # --- life ---

    async def serve(self, socket: Socket) -> int | None:
        """The session until it ends (the protocol's actions close the socket; see ws_shell.SocketSession)."""
        try:
            async with anyio.create_task_group() as tg:
                self._scope = tg.cancel_scope
                await self._receive_loop(tg)
                tg.cancel_scope.cancel()
        except Exception as exc:
            if not is_gone(exc):
                raise
        finally:
            if self.stream is not None:
                self.stream.abort()  # the request is released before the worker's next step
                await self.stream.aclose()
            if self._encoder is not None:
                with anyio.CancelScope(shield=True):  # a cancelled session still closes its muxer (milliseconds)
                    await anyio.to_thread.run_sync(self._encoder.close)
        return None

    async def shutting_down(self, socket: Socket) -> None:
        await self._perform(self.protocol.shutdown())

    async def failed(self, socket: Socket, exc: BaseException) -> None:
        """Nothing more to say: the shell closes with 1011."""

    async def _receive_loop(self, tg: Any) -> None:
        while not self.closed:
            deadline = self.protocol.deadline()
            message = await self.socket.receive(None if deadline is None else deadline - self.clock())
            if message is None:
                await self._perform(self.protocol.timeout(self.clock()), tg)
                continue
            if message["type"] == "websocket.disconnect":
                if self.protocol.generating:
                    self.state.metrics.disconnects.labels("video").inc()
                await self._perform(self.protocol.disconnected(), tg)
                return
            text = message.get("text")
            if text is not None:
                actions = self.protocol.receive_text(text, self.clock())
            else:
                actions = self.protocol.receive_binary(message.get("bytes") or b"", self.clock())
            await self._perform(actions, tg)

    # --- actions ---

    async def _perform(self, actions: Sequence[Action], tg: Any = None) -> None:
        """Carry out ``actions`` in order; sends of one call go out back to back (a chunk's metadata and bytes).

        A closing call (one with a Close) gets :data:`CLOSE_GRACE` seconds in all: a reader that stopped reading
        takes no more bytes, and its session must still end.
        """
        if any(isinstance(a, StopGeneration) for a in actions):
            self._stop_generation()  # first: a stalled socket must not delay releasing the request
        close = next((a for a in actions if isinstance(a, Close)), None)
        with anyio.move_on_after(math.inf if close is None else CLOSE_GRACE):
            if not await self._send([a for a in actions if isinstance(a, SendText | SendBinary)]):
                self._end()  # the client is gone
                return
            for action in actions:
                if isinstance(action, StartGeneration):
                    await self._start(action, tg)
            if close is not None:
                await self._close(close.code)
        if close is not None:
            self._end()

    async def _send(self, sends: Sequence[SendText | SendBinary]) -> bool:
        """Send in order under the send lock; False when the client has gone."""
        if not sends:
            return True
        try:
            await self.socket.send([a.text if isinstance(a, SendText) else a.data for a in sends])
        except Exception as exc:
            if not is_gone(exc) and not isinstance(exc, RuntimeError):
                raise
            return False
        return True

    def _stop_generation(self) -> None:
        if self.stream is not None:
            self.stream.abort(RequestCancelled(f"request {self.stream.request_id} was stopped"))

    def _end(self) -> None:
        self.closed = True
        self._stop_generation()
        if self._scope is not None:
            self._scope.cancel()

    async def _close(self, code: int) -> None:
        await self.socket.close(code)

    async def _start(self, action: StartGeneration, tg: Any) -> None:
        request = action.request
        try:
            if action.image_reference is not None:
                image = await anyio.to_thread.run_sync(decode_image, action.image_reference)
                request = self._resolve(VideoRequest(**{**_fields(request), "image": image}))
            assert request.width is not None and request.height is not None and request.fps is not None
            self._encoder = await anyio.to_thread.run_sync(
                VideoStreamEncoder, action.format, request.width, request.height, request.fps
            )
            self.stream = self.engine.generate(request)
        except InvalidRequestError as exc:
            await self._perform(self.protocol.start_failed("invalid_request", exc.message, exc.param), tg)
            return
        except Exception as exc:
            log.exception("could not start a video request")
            await self._perform(self.protocol.start_failed("internal_error", from_exception(exc).message), tg)
            return
        self.protocol.request = request  # with its image, if any (same id, same steering channel)
        await self._perform(self.protocol.started(self.clock(), self._encoder.mime_type), tg)
        if not self.closed:
            tg.start_soon(self._generate, self.stream, self._encoder)

    async def _generate(self, stream: RequestStream[VideoChunk], encoder: VideoStreamEncoder) -> None:
        try:
            async for out in stream:
                chunk = out.chunk
                self.generated += 1
                self.protocol.progressed(self.clock())
                data = await anyio.to_thread.run_sync(encoder.encode, chunk.frames, chunk.final)
                self.peak_unsent_bytes = max(self.peak_unsent_bytes, len(data))
                self.encoded_bytes += len(data)
                made = stream.usage.get(ModelKind.VIDEO)
                actions = self.protocol.chunk_ready(chunk, data, self.clock())
                if actions:
                    await self._perform(actions)
                    self.sent += 1
                    self.sent_progress.append(made.output_tokens if made is not None else 0)
                    self.protocol.progressed(self.clock())
        except RequestCancelled:
            actions = self.protocol.generation_ended(self.clock())
        except Exception as exc:
            actions = self.protocol.generation_failed(from_exception(exc).message, self.clock())
        else:
            actions = self.protocol.generation_ended(self.clock())
        await self._perform(actions)


def _fields(request: VideoRequest) -> dict[str, Any]:
    return {name: getattr(request, name) for name in VideoRequest.__dataclass_fields__}
