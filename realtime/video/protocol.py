"""WS /v1/realtime/video as a sans-I/O state machine: client messages and generation events in, actions out.

The wire follows vLLM-Omni's streaming video output:

- client: ``session.start {model, prompt, format, width, height, fps, num_frames, num_inference_steps,
  guidance_scale, seed, negative_prompt, image_reference}`` (the first message, within ``start_timeout``),
  ``session.interaction {interaction: {event_id, event: {prompt}, transition_chunks}}``, ``session.ping``,
  ``session.stop``;
- server: ``video.start {request_id, format, config}``, per chunk ``video.chunk_metadata {kind: "media",
  transport_chunk_index, generation_chunk_index, num_frames, byte_length, started/active/completed_event_ids}``
  followed by exactly one binary frame of ``byte_length`` bytes, ``session.interaction.queued {event_id}``,
  ``session.pong``, ``session.done {request_id, chunks, stopped}`` and ``error {code, message}``.

:class:`VideoProtocol` holds no socket and no clock: the shell (:mod:`omni_stream.realtime.video.ws`) feeds it
what happened (``receive_text``, ``chunk_ready``, ``timeout`` at :meth:`VideoProtocol.deadline`, ...) with the time,
and performs the :data:`Action` s it returns in order. Errors before the session started, and a stall (no
generation progress and no ping for ``stall_timeout`` s), end the connection; later bad messages only get an
``error``. Prompt updates go into the request's :class:`~omni_stream.video.spec.PromptSteering` channel; an ``event_id``
sent again with the same update is a retry (acknowledged, not applied twice), with another update a conflict.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeAlias

from omni_stream.errors import InvalidRequestError
from omni_stream.realtime.common.body_limit import parse_json, text_over
from omni_stream.realtime.common.close_codes import CloseCode
from omni_stream.realtime.common.json_fields import FieldError, integer, number, optional, string
from omni_stream.realtime.common.socket_actions import Close, SendBinary, SendText
from omni_stream.video.spec import PromptUpdate, VideoChunk, VideoRequest, chunk_count

FORMATS = ("m4s", "webm")
START_FIELDS = frozenset(
    {
        "type", "model", "prompt", "format", "width", "height", "fps", "num_frames", "num_inference_steps",
        "guidance_scale", "seed", "negative_prompt", "image_reference", "extra_params",
    }
)  # fmt: skip
MAX_TRANSITION_CHUNKS = 64
MAX_EVENT_ID_CHARS = 256


@dataclass(slots=True, frozen=True)
class StartGeneration:
    """Open the generation of ``request`` (validated) in ``format``; ``image_reference``: a data URL to decode."""

    request: VideoRequest
    format: str
    image_reference: str | None


@dataclass(slots=True, frozen=True)
class StopGeneration:
    """Stop the generation now (its request is released at once)."""


Action: TypeAlias = SendText | SendBinary | StartGeneration | StopGeneration | Close


@dataclass(slots=True, frozen=True)
class VideoLimits:
    """Timeouts (seconds) and sizes (bytes, characters) of a video session."""

    start_timeout: float = 10.0
    stall_timeout: float = 60.0
    max_start_bytes: int = 4 * 1024 * 1024  # session.start may carry a data-URL image
    max_control_bytes: int = 128 * 1024
    max_prompt_chars: int = 4096


class Phase(StrEnum):
    AWAITING_START = "awaiting_start"
    STARTING = "starting"  # session.start accepted; the shell is opening the generation
    STREAMING = "streaming"
    STOPPING = "stopping"  # session.stop asked the generation to end
    CLOSED = "closed"


class ProtocolError(Exception):
    """A client message the session refuses: ``code`` and ``message`` go into an ``error`` event."""

    def __init__(self, code: str, message: str, param: str | None = None, event_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.event_id = event_id


def _required(body: Mapping[str, Any], key: str) -> object:
    """``body[key]``; a FieldError saying it is required when it is absent or null."""
    value = body.get(key)
    if value is None:
        raise FieldError(f"'{key}' is required", key)
    return value


def _json(message: Mapping[str, Any]) -> SendText:
    return SendText(json.dumps(message, ensure_ascii=False, separators=(",", ":")))


def error_action(
    code: str, message: str, *, param: str | None = None, event_id: str | None = None, request_id: str | None = None
) -> SendText:
    body: dict[str, Any] = {"type": "error", "code": code, "message": message}
    if param is not None:
        body["param"] = param
    if event_id is not None:
        body["event_id"] = event_id
    if request_id is not None:
        body["request_id"] = request_id
    return _json(body)


def parse_message(text: str, limit: int) -> dict[str, Any]:
    """The JSON object in a text message of at most ``limit`` bytes."""
    if text_over(text, limit):
        raise ProtocolError("message_too_large", f"Message too large (max {limit} bytes)")
    try:
        body = parse_json(text)
    except FieldError as exc:  # a string no UTF-8 text holds (it would be echoed in video.start), named by its path
        raise ProtocolError("invalid_request", exc.message, exc.param) from None
    except (ValueError, RecursionError):
        raise ProtocolError("invalid_json", "Invalid JSON message") from None
    if not isinstance(body, dict):
        raise ProtocolError("invalid_message", "WebSocket messages must be JSON objects")
    if not isinstance(body.get("type"), str):
        raise ProtocolError("invalid_message", "Messages need a string 'type'")
    return body


def _image_reference(value: Any) -> str | None:
    if value is None:
        return None
    url = value.get("image_url") if isinstance(value, Mapping) else value
    if isinstance(url, Mapping):  # OpenAI's {"image_url": {"url": ...}}
        url = url.get("url")
    if not isinstance(url, str) or not url.startswith("data:"):
        raise ProtocolError(
            "invalid_request", "image_reference must be a data: URL (remote images are not fetched)", "image_reference"
        )
    return url


def parse_start(body: Mapping[str, Any], limits: VideoLimits) -> tuple[VideoRequest, str, str | None, str | None]:
    """``session.start`` -> (the request, its format, the image data URL, the model named); ProtocolError if bad."""
    unknown = sorted(set(body) - START_FIELDS)
    if unknown:
        raise ProtocolError("invalid_request", f"Unknown session.start field(s): {', '.join(unknown)}", unknown[0])
    extra = body.get("extra_params")
    if extra is not None and (not isinstance(extra, dict) or extra):  # as the speech routes: null or {} alone
        raise ProtocolError("invalid_request", "extra_params are not supported by this server", "extra_params")
    fmt = body.get("format", "m4s")
    if fmt not in FORMATS:
        raise ProtocolError("unsupported_format", f"format must be one of {', '.join(FORMATS)}, got {fmt!r}", "format")
    try:
        model = optional(body, "model", string)
        guidance = optional(body, "guidance_scale", number)
        request = VideoRequest(
            prompt=string(_required(body, "prompt"), "prompt", limit=limits.max_prompt_chars, non_empty=True),
            width=optional(body, "width", integer),
            height=optional(body, "height", integer),
            fps=optional(body, "fps", integer),
            num_frames=optional(body, "num_frames", integer),
            num_inference_steps=optional(body, "num_inference_steps", integer),
            guidance_scale=guidance,
            negative_prompt=optional(body, "negative_prompt", string, limit=limits.max_prompt_chars, non_empty=True),
            seed=optional(body, "seed", integer),
        )
    except (InvalidRequestError, FieldError) as exc:
        raise ProtocolError("invalid_request", exc.message, exc.param) from None
    return request, fmt, _image_reference(body.get("image_reference")), model


class VideoProtocol:
    """One video session's protocol state. Every method takes ``now`` (monotonic seconds) and returns actions.

    ``resolve`` validates a request against the model (raising InvalidRequestError) and fills its defaults;
    ``models``: the names session.start's ``model`` may carry (any, when empty).
    """

    def __init__(
        self,
        resolve: Callable[[VideoRequest], VideoRequest],
        *,
        models: tuple[str, ...] = (),
        frames_per_chunk: int | None = None,
        limits: VideoLimits | None = None,
        now: float = 0.0,
        next_event_id: Callable[[], str] | None = None,
    ) -> None:
        self.resolve = resolve
        self.models = models
        self.frames_per_chunk = frames_per_chunk
        self.limits = limits or VideoLimits()
        self.phase = Phase.AWAITING_START
        self.request: VideoRequest | None = None
        self.format = "m4s"
        self.chunks_sent = 0
        self.chunks_after_stop = 0  # chunks sent once session.stop had arrived (at most the one in hand)
        self.events: dict[str, PromptUpdate] = {}
        self._start_deadline = now + self.limits.start_timeout
        self._last_progress = now
        self._event_ids = iter(range(1, 1 << 62))
        self._next_event_id = next_event_id or (lambda: f"evt-{next(self._event_ids)}")

    @property
    def request_id(self) -> str | None:
        return self.request.request_id if self.request is not None else None

    @property
    def generating(self) -> bool:
        return self.phase in (Phase.STARTING, Phase.STREAMING, Phase.STOPPING)

    def deadline(self) -> float | None:
        """When :meth:`timeout` must next be called (None: no timer runs now)."""
        if self.phase is Phase.AWAITING_START:
            return self._start_deadline
        if self.phase in (Phase.STREAMING, Phase.STOPPING):
            return self._last_progress + self.limits.stall_timeout
        return None

    # --- client messages ---

    def receive_text(self, text: str, now: float) -> list[Action]:
        limit = self.limits.max_start_bytes if self.phase is Phase.AWAITING_START else self.limits.max_control_bytes
        try:
            body = parse_message(text, limit)
        except ProtocolError as exc:
            return self._refuse(exc)
        kind = body["type"]
        if self.phase is Phase.AWAITING_START:
            if kind != "session.start":
                return self._refuse(ProtocolError("session_not_started", f"Expected session.start, got: {kind}"))
            return self._start(body, now)
        if self.phase is Phase.CLOSED:
            return []
        try:
            if kind == "session.ping":
                self._last_progress = now
                return [_json({"type": "session.pong"})]
            if kind == "session.stop":
                return self._stop()
            if kind == "session.interaction":
                return self._interaction(body)
            if kind == "session.start":
                raise ProtocolError("session_already_started", "The session has started already")
            raise ProtocolError("unknown_message_type", f"Unknown message type: {kind}")
        except ProtocolError as exc:
            return self._refuse(exc)

    def receive_binary(self, data: bytes, now: float) -> list[Action]:
        return self._refuse(ProtocolError("binary_not_supported", "Binary messages are not supported: send JSON"))

    def _refuse(self, exc: ProtocolError) -> list[Action]:
        """An ``error`` event; before the session started, the connection closes too."""
        actions: list[Action] = [
            error_action(exc.code, exc.message, param=exc.param, event_id=exc.event_id, request_id=self.request_id)
        ]
        if self.phase is Phase.AWAITING_START:
            self.phase = Phase.CLOSED
            actions.append(Close(CloseCode.POLICY, exc.code))
        return actions

    def _start(self, body: Mapping[str, Any], now: float) -> list[Action]:
        try:
            request, fmt, image, model = parse_start(body, self.limits)
            if model is not None and self.models and model not in self.models:
                raise ProtocolError(
                    "model_not_found", f"Model {model!r} is not served here (served: {', '.join(self.models)})", "model"
                )
            try:
                request = self.resolve(request)
            except InvalidRequestError as exc:
                code = "model_not_found" if exc.param == "model" else "invalid_request"
                raise ProtocolError(code, exc.message, exc.param) from None
        except ProtocolError as exc:
            return self._refuse(exc)
        self.phase = Phase.STARTING
        self.request, self.format = request, fmt
        return [StartGeneration(request, fmt, image)]

    def _stop(self) -> list[Action]:
        if self.phase is not Phase.STREAMING:
            return []  # stopping already
        self.phase = Phase.STOPPING
        return [StopGeneration()]

    def _interaction(self, body: Mapping[str, Any]) -> list[Action]:
        interaction = body.get("interaction")
        if not isinstance(interaction, Mapping):
            raise ProtocolError("invalid_message", "session.interaction requires an interaction object")
        event_id = interaction.get("event_id")
        if event_id is None:
            event_id = self._next_event_id()
        elif not isinstance(event_id, str) or not event_id:
            raise ProtocolError("invalid_message", "interaction.event_id must be a non-empty string")
        elif len(event_id) > MAX_EVENT_ID_CHARS:  # it is echoed in every later chunk's event lists
            raise ProtocolError("invalid_request", f"interaction.event_id must be at most {MAX_EVENT_ID_CHARS} "
                                f"characters, got {len(event_id)}", "interaction.event_id")  # fmt: skip
        event = interaction.get("event")
        if not isinstance(event, Mapping):
            raise ProtocolError("invalid_message", "session.interaction requires an event object", event_id=event_id)
        if event.get("negative_prompt") is not None:
            message = "negative_prompt updates are not supported"
            raise ProtocolError("unsupported_interaction", message, "negative_prompt", event_id)
        try:
            prompt = string(event.get("prompt"), "interaction.event.prompt", limit=self.limits.max_prompt_chars,
                            non_empty=True)  # fmt: skip
            transition = integer(interaction.get("transition_chunks", 0), "interaction.transition_chunks", 0,
                                 MAX_TRANSITION_CHUNKS)  # fmt: skip
        except FieldError as exc:  # a field's value: named by its path in the message, as session.start's are
            raise ProtocolError("invalid_request", exc.message, exc.param, event_id) from None
        update = PromptUpdate(event_id, prompt, transition)
        queued = _json({"type": "session.interaction.queued", "request_id": self.request_id, "event_id": event_id})
        seen = self.events.get(event_id)
        if seen is not None:
            if seen == update:
                return [queued]  # a retry: acknowledged again, applied once
            raise ProtocolError("event_id_conflict", f"event_id {event_id!r} was used for another update",
                                event_id=event_id)  # fmt: skip
        if self.phase is not Phase.STREAMING or self.request is None:
            raise ProtocolError("session_not_active", "The video is stopping: no more updates", event_id=event_id)
        if not self.request.steering.offer(update):
            why = "the last chunk is being generated" if self.request.steering.closed else "too many queued updates"
            raise ProtocolError("interaction_not_queued", f"The update was not queued: {why}", event_id=event_id)
        self.events[event_id] = update
        return [queued]

    # --- generation events ---

    def started(self, now: float, mime_type: str | None = None) -> list[Action]:
        """The generation is open: announce it with ``video.start``."""
        if self.phase is not Phase.STARTING or self.request is None:
            return []
        self.phase = Phase.STREAMING
        self._last_progress = now
        r = self.request
        assert r.num_frames is not None
        config: dict[str, Any] = {
            "prompt": r.prompt,
            "width": r.width,
            "height": r.height,
            "fps": r.fps,
            "num_frames": r.num_frames,
            "num_inference_steps": r.num_inference_steps,
            "guidance_scale": r.guidance_scale,
            "seed": r.seed,
            "negative_prompt": r.negative_prompt,
            "image_reference": r.image is not None,
        }
        if self.frames_per_chunk is not None:  # the video model's (VideoInfo); a request resolved without one has none
            config["frames_per_chunk"] = self.frames_per_chunk
            config["num_chunks"] = chunk_count(r.num_frames, self.frames_per_chunk)
        if self.models:
            config["model"] = self.models[0]
        if mime_type is not None:
            config["mime_type"] = mime_type
        start = {"type": "video.start", "request_id": r.request_id, "format": self.format, "config": config}
        return [_json(start)]

    def start_failed(self, code: str, message: str, param: str | None = None) -> list[Action]:
        """The generation could not be opened (e.g. an undecodable image): error, then close."""
        self.phase = Phase.CLOSED
        return [error_action(code, message, param=param, request_id=self.request_id), Close(CloseCode.POLICY, code)]

    def chunk_ready(self, chunk: VideoChunk, data: bytes, now: float) -> list[Action]:
        """A chunk is encoded: its metadata, then its bytes (nothing once the session is closed)."""
        if self.phase not in (Phase.STREAMING, Phase.STOPPING):
            return []
        self._last_progress = now
        if self.phase is Phase.STOPPING:
            self.chunks_after_stop += 1
        meta = {
            "type": "video.chunk_metadata",
            "request_id": self.request_id,
            "kind": "media",
            "transport_chunk_index": self.chunks_sent,
            "generation_chunk_index": chunk.index,
            "num_frames": chunk.num_frames,
            "byte_length": len(data),
            "started_event_ids": list(chunk.prompt.started),
            "active_event_ids": list(chunk.prompt.active),
            "completed_event_ids": list(chunk.prompt.completed),
        }
        self.chunks_sent += 1
        return [_json(meta), SendBinary(data)]

    def progressed(self, now: float) -> None:
        """The generation moved (a chunk arrived from the engine, bytes left): the stall clock restarts."""
        self._last_progress = now

    def generation_ended(self, now: float) -> list[Action]:
        """The generation ended, completely or (after session.stop) stopped: ``session.done``, then close."""
        if self.phase not in (Phase.STREAMING, Phase.STOPPING):
            return []
        stopped = self.phase is Phase.STOPPING
        self.phase = Phase.CLOSED
        done = {"type": "session.done", "request_id": self.request_id, "chunks": self.chunks_sent, "stopped": stopped}
        return [_json(done), Close(CloseCode.NORMAL)]

    def generation_failed(self, message: str, now: float) -> list[Action]:
        if self.phase is Phase.STOPPING:
            return self.generation_ended(now)  # failing while it was being stopped is stopping
        if self.phase is not Phase.STREAMING:
            return []
        self.phase = Phase.CLOSED
        return [error_action("generation_failed", message, request_id=self.request_id), Close(CloseCode.INTERNAL)]

    # --- timers and the connection ---

    def timeout(self, now: float) -> list[Action]:
        """Call at :meth:`deadline` (or later): the start or stall error when it really passed, else nothing."""
        deadline = self.deadline()
        if deadline is None or now < deadline:
            return []
        if self.phase is Phase.AWAITING_START:
            return self._refuse(ProtocolError("start_timeout", "Timeout waiting for session.start"))
        self.phase = Phase.CLOSED
        seconds = self.limits.stall_timeout
        return [
            StopGeneration(),  # first: release the request even if the error cannot be sent
            error_action("stall_timeout", f"Stall timeout: no progress for {seconds:g} s", request_id=self.request_id),
            Close(CloseCode.INTERNAL, "stall_timeout"),
        ]

    def disconnected(self) -> list[Action]:
        """The client left: stop whatever runs."""
        running = self.generating
        self.phase = Phase.CLOSED
        return [StopGeneration()] if running else []

    def shutdown(self) -> list[Action]:
        """The server is stopping: tell the client, stop, close with 1001."""
        running = self.generating
        self.phase = Phase.CLOSED
        actions: list[Action] = [StopGeneration()] if running else []
        actions.append(error_action("server_shutdown", "Server shutting down", request_id=self.request_id))
        return [*actions, Close(CloseCode.GOING_AWAY)]
