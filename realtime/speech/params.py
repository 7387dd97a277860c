"""Speech request fields: validation of the JSON body (HTTP) or ``session.config`` (WebSocket) into typed options.

Wire checks only: types, shapes, enums and the combinations of the streaming modes. Every problem is an
:class:`ApiError` 400 naming the field and the allowed values. What the request asks of the model (its task, voice,
language, lengths and ranges, the reference audio) is the engine's to check (:mod:`omni_stream.validation`,
:mod:`omni_stream.speech.limits`), whose errors reach the client as 400s naming the same fields. Nothing here touches
the engine, so the rules are unit-testable. :mod:`omni_stream.realtime.speech.build` turns options into a
:class:`SpeechRequest` (and loads the reference audio).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from omni_stream.errors import InvalidRequestError
from omni_stream.realtime.common.errors import ApiError, bad_request
from omni_stream.realtime.common.json_fields import (
    boolean,
    choice,
    int_field,
    number,
    optional,
    string,
    type_name,
    unicode,
)
from omni_stream.realtime.settings import SPEECH_FORMATS, STREAM_FORMATS, Settings
from omni_stream.requests import TaskType
from omni_stream.speech.limits import check_embedding
from omni_stream.speech.text_split import Granularity


class StreamMode(StrEnum):
    NONE = "none"  # one body
    AUDIO = "audio"  # raw bytes, chunked
    SSE = "sse"  # server-sent events


# Fields the WebSocket config must not carry (they belong to the HTTP body or to input.text).
WS_FORBIDDEN = ("input", "stream", "stream_format")


class TextInputMode(StrEnum):
    """How a speech WebSocket turns ``input.text`` into requests (``session.config`` ``text_input_mode``)."""

    BUFFERED = "buffered"  # by split_granularity: one request per input.done, or per sentence / clause
    COMMITMENT = "commitment"  # each committed span (text_commit) is synthesized as soon as it is committed


@dataclass(slots=True, frozen=True)
class SpeechOptions:
    """Validated speech fields, shared by HTTP and WebSocket. ``voice`` is lower-cased; ``speed`` a factor."""

    model: str | None = None
    voice: str | None = None
    response_format: str = "wav"
    speed: float = 1.0
    stream_mode: StreamMode = StreamMode.NONE
    instructions: str | None = None
    task_type: TaskType | None = None
    language: str = "Auto"
    ref_audio: str | None = None
    ref_text: str | None = None
    x_vector_only_mode: bool = False
    speaker_embedding: tuple[float, ...] | None = None
    non_streaming_mode: bool | None = None
    max_new_tokens: int | None = None
    seed: int | None = None
    initial_codec_chunk_frames: int | None = None
    sample_rate: int | None = None
    # Benchmarks only (Settings.enable_benchmark_fields): generate exactly max_new_tokens frames
    ignore_eos: bool = False
    # WebSocket only
    stream_audio: bool = False
    split_granularity: Granularity = Granularity.NONE
    text_input_mode: TextInputMode = TextInputMode.BUFFERED


# Every field a session.config may carry (besides "type"); any other key is refused, naming it.
WS_FIELDS = frozenset(
    "model voice speaker response_format speed instructions task_type language ref_audio ref_text "
    "x_vector_only_mode speaker_embedding non_streaming_mode max_new_tokens seed initial_codec_chunk_frames "
    "sample_rate ignore_eos stream_audio split_granularity text_input_mode word_timestamps extra_params".split()
)
WS_ONLY = frozenset({"stream_audio", "split_granularity", "text_input_mode"})
HTTP_FIELDS = (WS_FIELDS - WS_ONLY) | frozenset(WS_FORBIDDEN)
# Languages text_input_mode="commitment" commits by (vLLM-Omni's rule: an explicit Chinese or English).
COMMIT_LANGUAGES = ("English", "Chinese")


def _embedding(body: dict[str, Any]) -> tuple[float, ...] | None:
    value = body.get("speaker_embedding")
    if value is None:
        return None
    try:
        return tuple(check_embedding(value))
    except InvalidRequestError as exc:
        raise bad_request(exc.message, "speaker_embedding") from None


def _voice(body: dict[str, Any]) -> str | None:
    value = body.get("voice", body.get("speaker"))
    if isinstance(value, dict):
        value = value.get("id")
        if not isinstance(value, str):
            raise bad_request("'voice' as an object must be {\"id\": <string>}", "voice")
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_request(f"'voice' must be a string or {{\"id\": string}}, got {type_name(value)}", "voice")
    value = unicode(value, "voice").strip().lower()
    return value or None


def _speed(body: dict[str, Any]) -> float:
    speed = optional(body, "speed", number, 0.25, 4.0)
    return 1.0 if speed is None else speed


def _stream_mode(body: dict[str, Any], settings: Settings) -> StreamMode:
    stream = bool(optional(body, "stream", boolean))
    stream_format = optional(body, "stream_format", choice, ("sse", "audio"))
    if stream_format == "audio":
        return StreamMode.AUDIO  # wins over stream=true
    if stream_format == "sse":
        return StreamMode.SSE
    if stream:
        # stream=true alone: SSE (vLLM-Omni today), or raw bytes on a server that keeps its older meaning.
        return StreamMode.AUDIO if settings.legacy_stream_raw else StreamMode.SSE
    return StreamMode.NONE


def parse_input(body: dict[str, Any], settings: Settings | None = None) -> str:
    """The ``input`` text, stripped (a string of valid Unicode; its length is the engine's rule)."""
    if "input" not in body or body["input"] is None:
        raise bad_request("'input' is required", "input")
    return string(body["input"], "input", utf8=True).strip()


def parse_options(body: Any, settings: Settings, *, websocket: bool = False) -> SpeechOptions:
    """Validate every speech field except ``input``; ``websocket`` parses a ``session.config`` instead."""
    if not isinstance(body, dict):
        raise bad_request("Request body must be a JSON object")
    if websocket:
        for key in WS_FORBIDDEN:
            if key in body:
                raise bad_request(f"'{key}' is not allowed in session.config", key)
        for key in body:
            if key not in WS_FIELDS:
                raise bad_request(f"Unknown session.config field '{key}'", str(key))
    else:  # as the socket: a field not read is named (a typo, or another server's, would look applied)
        for key in body:
            if key in WS_ONLY:
                raise bad_request(f"'{key}' is a field of the speech WebSocket's session.config", key)
            if key not in HTTP_FIELDS:
                raise bad_request(f"Unknown field '{key}'", str(key))
    _refuse_unsupported(body)
    instructions = optional(body, "instructions", string, utf8=True)
    task = optional(body, "task_type", choice, tuple(t.value for t in TaskType))
    language = (optional(body, "language", string, utf8=True) or "Auto").strip() or "Auto"
    frames = int_field(body, "initial_codec_chunk_frames", 0, 4096)
    ref_audio = optional(body, "ref_audio", string, utf8=True) or None
    ref_text = (optional(body, "ref_text", string, utf8=True) or "").strip() or None
    embedding = _embedding(body)
    if embedding is not None and ref_audio is not None:
        raise bad_request("'speaker_embedding' and 'ref_audio' are mutually exclusive", "speaker_embedding")
    opts = SpeechOptions(
        model=optional(body, "model", string, utf8=True),
        voice=_voice(body),
        response_format=optional(body, "response_format", choice, SPEECH_FORMATS) or "wav",
        speed=_speed(body),
        stream_mode=StreamMode.NONE if websocket else _stream_mode(body, settings),
        instructions=instructions.strip() or None if instructions is not None else None,
        task_type=TaskType(task) if task is not None else None,
        language=language,  # as sent: the engine resolves it case-insensitively (and names it so in an error)
        ref_audio=ref_audio,
        ref_text=ref_text,
        x_vector_only_mode=bool(optional(body, "x_vector_only_mode", boolean)) or embedding is not None,
        speaker_embedding=embedding,
        non_streaming_mode=optional(body, "non_streaming_mode", boolean),
        max_new_tokens=int_field(body, "max_new_tokens"),
        seed=int_field(body, "seed", 0, 2**63 - 1),
        initial_codec_chunk_frames=frames or None,
        sample_rate=int_field(body, "sample_rate", 8000, 192000),
        ignore_eos=_benchmark_bool(body, "ignore_eos", settings),
        stream_audio=bool(optional(body, "stream_audio", boolean)) if websocket else False,
        split_granularity=Granularity(
            (optional(body, "split_granularity", choice, tuple(g.value for g in Granularity)) or "none")
            if websocket
            else "none"
        ),
        text_input_mode=TextInputMode(
            (optional(body, "text_input_mode", choice, tuple(m.value for m in TextInputMode)) or "buffered")
            if websocket
            else "buffered"
        ),
    )
    _check_streaming(opts, websocket)
    _check_commitment(opts)
    if opts.ignore_eos and opts.max_new_tokens is None:
        message = "'ignore_eos' requires 'max_new_tokens' (the exact number of frames to generate)"
        raise bad_request(message, "ignore_eos")
    return opts


def _refuse_unsupported(body: dict[str, Any]) -> None:
    """vLLM-Omni fields this server cannot honour: a 400 naming them, never silently ignored."""
    if bool(optional(body, "word_timestamps", boolean)):
        raise bad_request(
            "word_timestamps=true is not supported: this server has no forced aligner to compute word timings; "
            "set word_timestamps=false",
            "word_timestamps",
        )
    extra = body.get("extra_params")
    if extra is not None and (not isinstance(extra, dict) or extra):
        raise bad_request("'extra_params' (model-specific parameters) are not supported by this server", "extra_params")


def _check_commitment(opts: SpeechOptions) -> None:
    """vLLM-Omni's rules for text_input_mode='commitment': no splitting on top, an explicit commit language."""
    if opts.text_input_mode is not TextInputMode.COMMITMENT:
        return
    if opts.split_granularity is not Granularity.NONE:
        raise bad_request(
            "text_input_mode='commitment' requires split_granularity='none' "
            f"(commitment decides the spans itself), got '{opts.split_granularity.value}'",
            "text_input_mode",
        )
    if opts.language not in COMMIT_LANGUAGES:
        raise bad_request(
            "text_input_mode='commitment' requires an explicit language: 'English' or 'Chinese' "
            f"(the commit rules are per language), got '{opts.language}'",
            "language",
        )


def _benchmark_bool(body: dict[str, Any], key: str, settings: Settings) -> bool:
    # Present at all, even false or null, is refused: production servers must not look like they accept it.
    if key in body and not settings.enable_benchmark_fields:
        raise bad_request(
            f"'{key}' is a benchmark-only field; this server does not accept it (see --enable-benchmark-fields)", key
        )
    return bool(optional(body, key, boolean))


def _check_streaming(opts: SpeechOptions, websocket: bool) -> None:
    if websocket:
        if opts.stream_audio and opts.response_format != "pcm":
            raise bad_request(
                f"stream_audio=true requires response_format='pcm', got '{opts.response_format}'", "response_format"
            )
        if opts.stream_audio and opts.speed != 1.0:
            raise bad_request("Speed adjustment is not supported with stream_audio=true (speed must be 1.0)", "speed")
        return
    if opts.stream_mode is StreamMode.NONE:
        return
    if opts.response_format not in STREAM_FORMATS:
        raise bad_request(
            "Streaming (stream=true, stream_format='audio', or stream_format='sse') requires "
            f"response_format='pcm' or 'wav', got '{opts.response_format}'",
            "response_format",
        )
    if opts.speed != 1.0:
        raise bad_request("Speed adjustment is not supported when streaming (speed must be 1.0)", "speed")


def check_model(model: str | None, served: tuple[str, ...]) -> None:
    """404 unless ``model`` is absent or one of the ``served`` names."""
    if model is not None and model not in served:
        # vLLM's words, then what is served (as the realtime and health routes say)
        listed = ", ".join(f"`{name}`" for name in served)
        raise ApiError(404, f"The model `{model}` does not exist (served: {listed}).", "model", type="NotFoundError")
