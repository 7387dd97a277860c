"""WS /v1/video/chat/stream as a sans-I/O state machine: client messages, decoded frames and reply events in,
actions out.

The wire is vLLM-Omni's streaming video input (its ``docs/serving/video_stream_api.md``), so its clients work
unchanged:

- client: ``session.config`` (the first message, within ``config_timeout`` s; fields below), ``video.frame {data}``
  (a base64 JPEG, PNG or WebP picture), ``audio.chunk {data}`` (base64 PCM16 16 kHz mono), ``video.query {text,
  audio_data?}``, ``video.done`` (end the session once the running reply is over), ``ping``;
- server: ``response.start``, ``response.text.delta {delta}``, ``response.text.done {text}``,
  ``response.audio.delta {data, format: "wav"}`` (each a whole base64 WAV file of the next piece of speech),
  ``response.audio.done``, ``session.done``, ``pong`` and ``error {message}``, to which we add ``code`` and
  ``param`` (the field at fault), which its clients ignore.

``session.config`` fields (vLLM-Omni's names, ranges and defaults; its legacy aliases ``num_sample_frames``,
``evs_enabled`` and ``evs_threshold`` are read as the canonical names): ``model`` (null or the served text
model's name), ``modalities`` (``["text"]``, ``["audio"]`` or both; default both where a speech model is loaded,
else ``["text"]``; audio without a speech model is refused), ``num_frames`` (1-128, default 4: frames each query
shows the model, spread over the window, the newest last), ``max_frames`` (1-256, default 50: the window, oldest
out), ``system_prompt``, ``use_audio_in_video`` (accepted: streamed audio is always heard, as its transcript, where
the server has a transcription model), ``sampling_params_list`` (its first entry, the text stage's, may set
``temperature``, ``top_p``, ``top_k``, ``repetition_penalty``, ``max_tokens`` and ``seed``; later entries are
vLLM-Omni's speech stages and must be empty or null), ``enable_frame_filter`` (default true) and
``frame_filter_threshold`` (0-1, default 0.95): :mod:`omni_stream.vision.frames` says what they do. Any other
field is refused, naming it.

What is refused and how: a first message that is not a valid ``session.config`` (a frame before it, say) gets an
``error`` and the connection closes (1008), as vLLM-Omni ends such a session. After it, a bad message gets an
``error`` and the session goes on: a frame that is not an image, is over the byte or pixel cap, or comes faster
than the rate cap (``error`` codes ``invalid_frame``, ``frame_too_large``, ``frame_rate_exceeded``, each naming
``data``); a near-duplicate frame is dropped without a word (the scene did not change). Audio beyond
``max_audio_bytes`` gets ``audio_buffer_overflow`` and the buffered audio is cleared (vLLM-Omni's behaviour). A
query with no frame kept gets ``no_frames``. A query while another runs stops the running one (nothing more of
it is sent) and starts. With no message for ``idle_timeout`` s while no reply runs, ``error`` ``idle_timeout``
and the connection closes (1000).

A query shows the model the chat history (the last ``history_turns`` turns, text only, as vLLM-Omni keeps them)
and one user message: the sampled frames as its images (:class:`~omni_stream.requests.ChatMessage`), then the
transcript of the audio streamed since the last query (if any), then the question.

Where the text model keeps a session's frames in its cache (a frame session: Qwen2.5-VL's), the session opens one
of ``num_frames`` frames after the config, each kept frame is prefilled into it as it arrives, and a query shows
the frames the cache holds (the newest ones, up to ``num_frames``), so its prompt continues the cached rows and
only its own tokens are prefilled. Its prompt then holds no history (the frames must come right after the system
turn to continue the cache): a departure from vLLM-Omni, which keeps one turn and rebuilds the whole prompt per
query. With no frame session free (the model holds a few), the session runs as above.

:class:`VideoChatProtocol` holds no socket, no clock and no model: the shell
(:mod:`omni_stream.realtime.video_chat.ws`) feeds it messages with the time, decodes the frames it asks for (off
the event loop) and runs the queries it starts, and performs the :data:`Action` s it returns in order.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeAlias

import numpy as np

from omni_stream.errors import InvalidRequestError
from omni_stream.realtime.common.body_limit import parse_json, text_over
from omni_stream.realtime.common.close_codes import CloseCode
from omni_stream.realtime.common.json_fields import FieldError, boolean, integer, number, obj, string, type_name
from omni_stream.realtime.common.socket_actions import Close, SendText
from omni_stream.requests import ChatMessage, ChatRequest, Role, SamplingParams, SpokenReply, TextRequest
from omni_stream.vision.frames import Frame, FrameLimits, FrameRateError, FrameTooLargeError, FrameWindow

CONFIG_FIELDS = frozenset(
    {
        "type", "model", "modalities", "num_frames", "max_frames", "system_prompt", "use_audio_in_video",
        "sampling_params_list", "enable_frame_filter", "frame_filter_threshold",
    }
)  # fmt: skip
ALIASES = {
    "num_sample_frames": "num_frames",
    "evs_enabled": "enable_frame_filter",
    "evs_threshold": "frame_filter_threshold",
}
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "repetition_penalty", "max_tokens", "seed")
MODALITIES = ("text", "audio")
AUDIO_RATE = 16000  # audio.chunk: PCM16 mono at this rate


@dataclass(slots=True, frozen=True)
class VideoChatLimits:
    """Timeouts (seconds) and sizes (bytes, characters, turns) of a video chat session; ``frames``: the frame
    policy. ``max_reply_tokens``: a reply's tokens unless the config's sampling sets ``max_tokens`` (None: the
    model's context)."""

    config_timeout: float = 10.0
    idle_timeout: float = 60.0
    max_message_bytes: int = 16 * 1024 * 1024  # a frame's base64 (10 MiB of picture) and its JSON
    max_text_chars: int = 32_768
    max_audio_bytes: int = 4 * 1024 * 1024  # audio buffered between queries (vLLM-Omni's bound; 131 s)
    history_turns: int = 1
    max_reply_tokens: int | None = None
    frames: FrameLimits = field(default_factory=FrameLimits)


@dataclass(slots=True, frozen=True)
class VideoChatConfig:
    """A session's ``session.config``, read and checked."""

    modalities: tuple[str, ...]
    num_frames: int = 4
    max_frames: int = 50
    system_prompt: str | None = None
    use_audio_in_video: bool = True
    sampling: SamplingParams | None = None
    max_tokens: int | None = None
    seed: int | None = None
    enable_frame_filter: bool = True
    frame_filter_threshold: float = 0.95

    @property
    def speaks(self) -> bool:
        return "audio" in self.modalities


@dataclass(slots=True, frozen=True)
class DecodeFrame:
    """Decode a ``video.frame``'s base64 picture off the event loop (:func:`omni_stream.vision.frames.decode_base64`
    with the session's frame limits, naming ``data``), then call :meth:`VideoChatProtocol.frame_decoded` or
    :meth:`VideoChatProtocol.frame_refused`."""

    data: str


@dataclass(slots=True, frozen=True)
class OpenCache:
    """Open the text model's frame session (its cache of the session's frames: ``max_frames`` of them, questions
    starting with the ``system`` turn), then call :meth:`VideoChatProtocol.cache_opened` (left uncalled when the
    model has no session free: the queries then show their frames in whole prompts)."""

    max_frames: int
    system: str | None


@dataclass(slots=True, frozen=True)
class CacheFrame:
    """Prefill a kept frame into the frame session (off the event loop, on the device worker); a frame it refuses:
    :meth:`VideoChatProtocol.frame_not_cached`."""

    frame: Frame


@dataclass(slots=True, frozen=True)
class StartQuery:
    """Run query ``query_id``: transcribe ``audio`` (PCM16 16 kHz; empty: none) if any, then
    :meth:`Query.request` with the transcript, and feed the reply's events back."""

    query: Query


@dataclass(slots=True, frozen=True)
class CancelQuery:
    """Stop query ``query_id`` now (its request is released before the next model step)."""

    query_id: int


Action: TypeAlias = SendText | DecodeFrame | OpenCache | CacheFrame | StartQuery | CancelQuery | Close


@dataclass(slots=True, frozen=True, eq=False)
class Query:
    """One ``video.query``: what the model is shown, less the audio's transcript, which the shell makes."""

    query_id: int
    question: str
    frames: tuple[Frame, ...]
    history: tuple[ChatMessage, ...]
    audio: bytes
    config: VideoChatConfig
    max_tokens: int | None
    cached: bool = False  # the frames are the frame session's: the shell shows the model the session's frames

    def request(self, transcript: str = "", frames: tuple[np.ndarray, ...] | None = None) -> ChatRequest:
        """The chat request: the history, then the frames (``frames``, else the query's) as the user turn's images
        with the transcript and the question as its text; spoken when the session's modalities ask for audio."""
        text = " ".join(t for t in (transcript.strip(), self.question.strip()) if t)
        images = frames if frames is not None else tuple(f.pixels for f in self.frames)
        user = ChatMessage(Role.USER, text, images=images)
        system = () if not self.config.system_prompt else (ChatMessage(Role.SYSTEM, self.config.system_prompt),)
        config = self.config
        request = TextRequest(
            messages=(*system, *self.history, user),
            max_tokens=config.max_tokens if config.max_tokens is not None else self.max_tokens,
            sampling=config.sampling,
            seed=config.seed,
        )
        return ChatRequest(request, speech=SpokenReply() if config.speaks else None)


class Phase(StrEnum):
    AWAITING_CONFIG = "awaiting_config"
    OPEN = "open"
    ENDING = "ending"  # video.done came while a reply ran: session.done once it is over
    CLOSED = "closed"


class ProtocolError(Exception):
    """A client message the session refuses: ``code``, ``message`` and ``param`` go into an ``error`` event."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param


def _json(body: Mapping[str, Any]) -> SendText:
    return SendText(json.dumps(body, ensure_ascii=False, separators=(",", ":")))


def error_action(code: str, message: str, param: str | None = None) -> SendText:
    """vLLM-Omni's ``error {message}``, with our ``code`` and ``param``."""
    return _json({"type": "error", "message": message, "code": code, "param": param})


def parse_message(text: str, limit: int) -> dict[str, Any]:
    """The JSON object in a text message of at most ``limit`` bytes."""
    if text_over(text, limit):
        raise ProtocolError("message_too_large", f"Message too large (max {limit} bytes)")
    try:
        body = parse_json(text)
    except FieldError as exc:  # a string no UTF-8 text holds, named by its path
        raise ProtocolError("invalid_value", exc.message, exc.param) from None
    except (ValueError, RecursionError):
        raise ProtocolError("invalid_json", "Invalid JSON") from None
    if not isinstance(body, dict):
        raise ProtocolError("invalid_message", "Messages must be JSON objects")
    if not isinstance(body.get("type"), str):
        got = type_name(body.get("type"))
        raise ProtocolError("invalid_message", f"Messages need a string 'type', got {got}", "type")
    return body


def _modalities(value: object, speaks: bool) -> tuple[str, ...]:
    if value is None:
        return MODALITIES if speaks else ("text",)
    if not isinstance(value, list) or not value or any(m not in MODALITIES for m in value):
        raise FieldError(f"'modalities' must be a non-empty list of 'text' and 'audio', got {value!r}", "modalities")
    if "audio" in value and not speaks:
        raise FieldError("'modalities' asks for audio, and this server has no speech model loaded", "modalities")
    return tuple(dict.fromkeys(value))


def _sampling(value: object) -> tuple[SamplingParams | None, int | None, int | None]:
    """``sampling_params_list``: (sampling, max_tokens, seed) of its first entry."""
    if value is None:
        return None, None, None
    if not isinstance(value, list):
        raise FieldError(
            f"'sampling_params_list' must be a list or null, got {type_name(value)}", "sampling_params_list"
        )
    for i, later in enumerate(value[1:], 1):
        if later not in (None, {}):
            raise FieldError(
                f"'sampling_params_list[{i}]': only the text stage's sampling (the first entry) can be set here",
                f"sampling_params_list[{i}]",
            )
    if not value or value[0] is None:
        return None, None, None
    key = "sampling_params_list[0]"
    first = obj(value[0], key)
    unknown = sorted(set(first) - set(SAMPLING_FIELDS))
    if unknown:
        allowed = ", ".join(SAMPLING_FIELDS)
        raise FieldError(f"'{key}.{unknown[0]}' is not supported (allowed: {allowed})", f"{key}.{unknown[0]}")
    fields: dict[str, Any] = {}
    if "temperature" in first:
        temperature = number(first["temperature"], f"{key}.temperature", 0.0, 2.0)
        fields.update(do_sample=temperature > 0, temperature=temperature or 1.0)
    if "top_p" in first:
        fields["top_p"] = number(first["top_p"], f"{key}.top_p", 0.0, 1.0)
    if "top_k" in first:
        fields["top_k"] = max(0, integer(first["top_k"], f"{key}.top_k", -1))
    if "repetition_penalty" in first:
        fields["repetition_penalty"] = number(first["repetition_penalty"], f"{key}.repetition_penalty", 0.0)
    max_tokens = None if first.get("max_tokens") is None else integer(first["max_tokens"], f"{key}.max_tokens", 1)
    seed = None if first.get("seed") is None else integer(first["seed"], f"{key}.seed", 0, 2**63 - 1)
    try:
        sampling = SamplingParams(**fields) if fields else None
    except InvalidRequestError as exc:
        raise FieldError(exc.message, f"{key}.{exc.param}") from None
    return sampling, max_tokens, seed


def parse_config(
    body: Mapping[str, Any], *, speaks: bool, limits: VideoChatLimits
) -> tuple[VideoChatConfig, str | None]:
    """``session.config`` -> (the config, the model named); FieldError naming the field when it is bad."""
    body = dict(body)
    for old, new in ALIASES.items():
        if old in body:
            value = body.pop(old)
            body.setdefault(new, value)
    unknown = sorted(set(body) - CONFIG_FIELDS)
    if unknown:
        raise FieldError(f"Unknown session.config field '{unknown[0]}'", unknown[0])
    model = None if body.get("model") is None else string(body["model"], "model", limit=256)
    sampling, max_tokens, seed = _sampling(body.get("sampling_params_list"))
    config = VideoChatConfig(
        modalities=_modalities(body.get("modalities"), speaks),
        num_frames=integer(body.get("num_frames", 4), "num_frames", 1, 128),
        max_frames=integer(body.get("max_frames", 50), "max_frames", 1, limits.frames.max_window),
        system_prompt=None
        if body.get("system_prompt") is None
        else string(body["system_prompt"], "system_prompt", limit=limits.max_text_chars, utf8=True),
        use_audio_in_video=boolean(body.get("use_audio_in_video", True), "use_audio_in_video"),
        sampling=sampling,
        max_tokens=max_tokens,
        seed=seed,
        enable_frame_filter=boolean(body.get("enable_frame_filter", True), "enable_frame_filter"),
        frame_filter_threshold=number(body.get("frame_filter_threshold", 0.95), "frame_filter_threshold", 0.0, 1.0),
    )
    return config, model


def decode_pcm(value: object, param: str, limit: int) -> bytes:
    """Base64 PCM16 of at most ``limit`` bytes, whole samples."""
    if not isinstance(value, str):
        raise ProtocolError("invalid_audio", f"'{param}' must be a base64 string of PCM16 16 kHz mono audio", param)
    if len(value) // 4 * 3 > limit + 2:
        raise ProtocolError("audio_buffer_overflow", f"Audio buffer overflow: '{param}' is over {limit} bytes", param)
    try:
        pcm = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid_audio", f"'{param}' is not valid base64", param) from None
    if len(pcm) % 2:
        raise ProtocolError(
            "invalid_audio", f"'{param}' must hold whole PCM16 samples (an even number of bytes)", param
        )
    return pcm


class VideoChatProtocol:
    """One video chat session's protocol state (see the module docstring). Every method that can act returns the
    actions to perform, in order; those taking ``now`` take monotonic seconds.

    ``models``: the names ``session.config``'s ``model`` may carry (any, when empty); ``speaks``: a speech model is
    loaded; ``hears``: a transcription model is loaded (else ``audio.chunk`` is refused); ``caches``: the text model
    keeps a session's frames in its cache as they arrive (see the module docstring).
    """

    def __init__(
        self,
        *,
        models: tuple[str, ...] = (),
        speaks: bool = False,
        hears: bool = False,
        caches: bool = False,
        limits: VideoChatLimits | None = None,
        now: float = 0.0,
    ) -> None:
        self.models = models
        self.speaks = speaks
        self.hears = hears
        self.caches = caches
        self.caching = False  # the frame session is open: kept frames go into it
        self.limits = limits or VideoChatLimits()
        self.phase = Phase.AWAITING_CONFIG
        self.config: VideoChatConfig | None = None
        self.window: FrameWindow | None = None
        self.audio = bytearray()
        self.history: list[ChatMessage] = []
        self.query: Query | None = None  # the reply running now
        self.started = False  # its response.start was sent
        self.reply: list[str] = []  # its text so far
        self.spoke = False  # it sent audio
        self.text_done = False  # its response.text.done was sent
        self.queries = 0
        self._deadline = now + self.limits.config_timeout

    def deadline(self) -> float | None:
        """When :meth:`timeout` must next be called (None: no timer runs now)."""
        if self.phase is Phase.AWAITING_CONFIG:
            return self._deadline
        if self.phase is Phase.OPEN and self.query is None:
            return self._deadline
        return None

    # --- client messages ---

    def receive_text(self, text: str, now: float) -> list[Action]:
        self._deadline = now + self.limits.idle_timeout
        try:
            body = parse_message(text, self.limits.max_message_bytes)
            kind = body["type"]
            if self.phase is Phase.AWAITING_CONFIG:
                if kind != "session.config":
                    raise ProtocolError(
                        "session_not_configured", f"Expected session.config as the first message, got: {kind}", "type"
                    )
                return self._configure(body)
            if self.phase is not Phase.OPEN:
                return []  # video.done came: the session is ending
            if kind == "video.frame":
                return self._frame(body, now)
            if kind == "audio.chunk":
                return self._audio(body.get("data"), "data")
            if kind == "video.query":
                return self._query(body)
            if kind == "video.done":
                return self._done()
            if kind == "ping":
                return [_json({"type": "pong"})]
            if kind == "session.config":
                raise ProtocolError("session_already_configured", "session.config was sent already", "type")
            raise ProtocolError("unknown_type", f"Unknown type: {kind}", "type")
        except FieldError as exc:
            return self._refuse(ProtocolError("invalid_value", exc.message, exc.param))
        except ProtocolError as exc:
            return self._refuse(exc)

    def receive_binary(self, data: bytes, now: float) -> list[Action]:
        self._deadline = now + self.limits.idle_timeout
        message = "Binary messages are not taken: send JSON text (video.frame carries its picture as base64)"
        return self._refuse(ProtocolError("invalid_message", message))

    def _refuse(self, exc: ProtocolError) -> list[Action]:
        """An ``error``; before the config, the connection closes too."""
        actions: list[Action] = [error_action(exc.code, exc.message, exc.param)]
        if self.phase is Phase.AWAITING_CONFIG:
            self.phase = Phase.CLOSED
            actions.append(Close(CloseCode.POLICY, exc.code))
        return actions

    def _configure(self, body: Mapping[str, Any]) -> list[Action]:
        config, model = parse_config(body, speaks=self.speaks, limits=self.limits)
        if model is not None and self.models and model not in self.models:
            served = ", ".join(self.models)
            raise ProtocolError("model_not_found", f"Model {model!r} is not served here (served: {served})", "model")
        threshold = config.frame_filter_threshold if config.enable_frame_filter else None
        self.window = FrameWindow(self.limits.frames, config.max_frames, threshold)
        self.config = config
        self.phase = Phase.OPEN
        return [OpenCache(config.num_frames, config.system_prompt or None)] if self.caches else []

    def cache_opened(self) -> list[Action]:
        """The frame session :class:`OpenCache` asked for is open."""
        self.caching = self.phase is not Phase.CLOSED
        return []

    def _frame(self, body: Mapping[str, Any], now: float) -> list[Action]:
        assert self.window is not None
        data = body.get("data")
        if not isinstance(data, str) or not data:
            raise ProtocolError("invalid_frame", "'data' must be a non-empty base64 JPEG, PNG or WebP image", "data")
        try:
            self.window.check_rate(now, "data")
        except FrameRateError as exc:
            raise ProtocolError("frame_rate_exceeded", exc.message, "data") from None
        return [DecodeFrame(data)]

    def frame_decoded(self, frame: Frame) -> list[Action]:
        """A frame :class:`DecodeFrame` asked for was decoded: kept, or dropped as a near duplicate."""
        if self.window is not None and self.phase is Phase.OPEN and self.window.offer(frame) and self.caching:
            return [CacheFrame(frame)]
        return []

    def frame_not_cached(self, exc: InvalidRequestError) -> list[Action]:
        """The frame session refused a kept frame (it does not fit the session's rows, say)."""
        if self.phase is Phase.CLOSED:
            return []
        return [error_action("invalid_frame", exc.message, "data")]

    def frame_refused(self, exc: InvalidRequestError) -> list[Action]:
        """A frame :class:`DecodeFrame` asked for is not an image, or is over a cap."""
        if self.phase is Phase.CLOSED:
            return []
        code = "frame_too_large" if isinstance(exc, FrameTooLargeError) else "invalid_frame"
        return [error_action(code, exc.message, exc.param or "data")]

    def _audio(self, value: object, param: str) -> list[Action]:
        if not self.hears:
            raise ProtocolError(
                "audio_not_supported", "this server has no transcription model: audio is not heard", param
            )
        pcm = decode_pcm(value, param, self.limits.max_audio_bytes)
        if len(self.audio) + len(pcm) > self.limits.max_audio_bytes:
            self.audio.clear()
            raise ProtocolError(
                "audio_buffer_overflow",
                f"Audio buffer overflow: more than {self.limits.max_audio_bytes} bytes before a query; the buffered "
                "audio was cleared",
                param,
            )
        self.audio.extend(pcm)
        return []

    def _query(self, body: Mapping[str, Any]) -> list[Action]:
        assert self.config is not None and self.window is not None
        question = string(body.get("text", ""), "text", limit=self.limits.max_text_chars, utf8=True)
        actions: list[Action] = []
        if body.get("audio_data"):
            actions += self._audio(body["audio_data"], "audio_data")
        if not len(self.window):
            raise ProtocolError("no_frames", "No frames buffered: send video.frame before video.query")
        if self.query is not None:
            actions.append(CancelQuery(self.query.query_id))  # a new question stops the reply to the last one
        self.queries += 1
        turns = 0 if self.caching else self.limits.history_turns  # cached frames: the prompt must start with them
        query = Query(
            self.queries,
            question,
            self.window.sample(self.config.num_frames),
            tuple(self.history[-2 * turns :]) if turns else (),
            bytes(self.audio),
            self.config,
            self.limits.max_reply_tokens,
            cached=self.caching,
        )
        self.audio.clear()
        self.query, self.started, self.reply, self.spoke, self.text_done = query, False, [], False, False
        return [*actions, StartQuery(query)]

    def _done(self) -> list[Action]:
        if self.query is not None:
            self.phase = Phase.ENDING
            return []
        return self._end()

    def _end(self) -> list[Action]:
        self.phase = Phase.CLOSED
        return [_json({"type": "session.done"}), Close(CloseCode.NORMAL)]

    # --- the running query's events (the shell's; a stopped query's are ignored) ---

    def _current(self, query_id: int) -> bool:
        return self.query is not None and self.query.query_id == query_id and self.phase is not Phase.CLOSED

    def query_started(self, query_id: int) -> list[Action]:
        """The engine took the query's request: ``response.start``."""
        if not self._current(query_id):
            return []
        self.started = True
        return [_json({"type": "response.start"})]

    def query_text(self, query_id: int, delta: str) -> list[Action]:
        if not self._current(query_id) or not delta:
            return []
        self.reply.append(delta)
        return [_json({"type": "response.text.delta", "delta": delta})]

    def query_text_done(self, query_id: int) -> list[Action]:
        """The text model finished (speech of its last sentences may follow)."""
        if not self._current(query_id) or self.text_done:
            return []
        self.text_done = True
        return [_json({"type": "response.text.done", "text": "".join(self.reply)})]

    def query_audio(self, query_id: int, wav: bytes) -> list[Action]:
        """A piece of the spoken reply, as a whole WAV file."""
        if not self._current(query_id) or not wav:
            return []
        self.spoke = True
        data = base64.b64encode(wav).decode("ascii")
        return [_json({"type": "response.audio.delta", "data": data, "format": "wav"})]

    def query_done(self, query_id: int) -> list[Action]:
        """The reply is over: its closing events; the turn joins the history."""
        if not self._current(query_id):
            return []
        query = self.query
        assert query is not None
        actions = self.query_text_done(query_id)
        if self.spoke:
            actions.append(_json({"type": "response.audio.done"}))
        self.history += [ChatMessage(Role.USER, query.question), ChatMessage(Role.ASSISTANT, "".join(self.reply))]
        del self.history[: max(0, len(self.history) - 2 * max(1, self.limits.history_turns))]
        return actions + self._finish()

    def query_failed(self, query_id: int, code: str, message: str, param: str | None = None) -> list[Action]:
        """The query could not run (a refused request, a failed model): an ``error``; once it had started, its
        text so far closes it."""
        if not self._current(query_id):
            return []
        actions: list[Action] = [error_action(code, message, param)]
        if self.started:
            actions += self.query_text_done(query_id)
        return actions + self._finish()

    def _finish(self) -> list[Action]:
        self.query = None
        return self._end() if self.phase is Phase.ENDING else []

    # --- timers and the connection ---

    def timeout(self, now: float) -> list[Action]:
        """Call at :meth:`deadline` (or later): the config or idle error when it really passed, else nothing."""
        deadline = self.deadline()
        if deadline is None or now < deadline:
            return []
        if self.phase is Phase.AWAITING_CONFIG:
            return self._refuse(ProtocolError("config_timeout", "Timeout waiting for session.config"))
        self.phase = Phase.CLOSED
        seconds = self.limits.idle_timeout
        return [error_action("idle_timeout", f"Idle timeout: no message for {seconds:g} s"), Close(CloseCode.NORMAL)]

    def disconnected(self) -> list[Action]:
        """The client left: stop whatever runs."""
        self.phase = Phase.CLOSED
        return self._stop()

    def shutdown(self) -> list[Action]:
        """The server is stopping: stop, tell the client, close with 1001."""
        self.phase = Phase.CLOSED
        return [*self._stop(), error_action("server_shutdown", "Server shutting down"), Close(CloseCode.GOING_AWAY)]

    def _stop(self) -> list[Action]:
        query, self.query = self.query, None
        return [CancelQuery(query.query_id)] if query is not None else []
