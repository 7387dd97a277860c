"""Client events of ``WS /v1/realtime`` (OpenAI Realtime GA subset): JSON text -> typed, validated events.

Parsing is pure and checks each message on its own (shapes, types, ranges, base64); what depends on the session
(known voices, loaded models, item ids) is checked by the state machine in
:mod:`omni_stream.realtime.agent.protocol`. Every problem is a :class:`RealtimeError` with an OpenAI error
``code`` and, for a bad field, its ``param`` path (``session.audio.input.format.rate``).

``session.update`` merges: a field left out keeps its value, so patches hold :data:`UNSET` for absent fields
(``turn_detection: null`` is a value: manual commit).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field, replace
from enum import Enum, StrEnum
from typing import Any, TypeAlias

from omni_stream.errors import InvalidRequestError
from omni_stream.realtime.agent.limits import (
    MAX_APPEND_BYTES,
    MAX_METADATA_KEY_CHARS,
    MAX_METADATA_VALUE_CHARS,
    MAX_TEXT_CHARS,
)
from omni_stream.realtime.agent.truncation import Truncation, TruncationType
from omni_stream.realtime.chat.tool_fields import parse_tool_choice, parse_tools
from omni_stream.realtime.common.body_limit import parse_json
from omni_stream.realtime.common.json_fields import FieldError, boolean, integer, number, obj, string, type_name
from omni_stream.text.tools import FunctionTool, ToolChoice
from omni_stream.turns.rules import Eagerness, TurnRule, TurnType
from omni_stream.turns.vad import VadParams
from omni_stream.vision.frames import split_data_url


class RealtimeError(Exception):
    """A client event the session refuses: sent as an ``error`` event; the connection stays open."""

    def __init__(
        self, code: str, message: str, param: str | None = None, *, event_id: str | None = None, kind: str = ""
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.event_id = event_id
        self.type = kind or "invalid_request_error"


class _Unset(Enum):
    UNSET = "unset"


UNSET = _Unset.UNSET
"""A field the patch does not change."""


class AudioFormat(StrEnum):
    """Wire audio formats: PCM16 LE mono at 24 kHz, or 8 kHz G.711 mu-law / a-law (one byte a sample)."""

    PCM = "audio/pcm"
    PCMU = "audio/pcmu"
    PCMA = "audio/pcma"

    @property
    def rate(self) -> int:
        return 24000 if self is AudioFormat.PCM else 8000

    @property
    def bytes_per_sample(self) -> int:
        return 2 if self is AudioFormat.PCM else 1

    def wire(self) -> dict[str, Any]:
        return {"type": self.value, "rate": 24000} if self is AudioFormat.PCM else {"type": self.value}


_LEGACY_FORMATS = {"pcm16": AudioFormat.PCM, "g711_ulaw": AudioFormat.PCMU, "g711_alaw": AudioFormat.PCMA}


class SessionType(StrEnum):
    REALTIME = "realtime"  # a voice agent: turns get responses
    TRANSCRIPTION = "transcription"  # speech in, transcripts out, no responses


class Modality(StrEnum):
    AUDIO = "audio"  # speech plus its transcript
    TEXT = "text"


@dataclass(slots=True, frozen=True)
class TurnDetection:
    """``server_vad`` (the detector's parameters) or ``semantic_vad`` (an eagerness), and what a turn does."""

    vad: VadParams = field(default_factory=VadParams)
    create_response: bool = True
    interrupt_response: bool = True
    type: TurnType = TurnType.SERVER_VAD
    eagerness: Eagerness = Eagerness.AUTO

    @property
    def rule(self) -> TurnRule:
        if self.type is TurnType.SEMANTIC_VAD:
            return TurnRule.semantic_vad(self.eagerness)
        return TurnRule.server_vad(self.vad)

    def wire(self) -> dict[str, Any]:
        if self.type is TurnType.SEMANTIC_VAD:
            return {
                "type": "semantic_vad",
                "eagerness": self.eagerness.value,
                "create_response": self.create_response,
                "interrupt_response": self.interrupt_response,
            }
        return {
            "type": "server_vad",
            "threshold": self.vad.threshold,
            "prefix_padding_ms": self.vad.prefix_padding_ms,
            "silence_duration_ms": self.vad.silence_duration_ms,
            "create_response": self.create_response,
            "interrupt_response": self.interrupt_response,
            "idle_timeout_ms": None,
        }


@dataclass(slots=True, frozen=True)
class TranscriptionConfig:
    """Input transcription settings; ``model`` is reported back, the loaded ASR model serves it."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None

    def wire(self) -> dict[str, Any]:
        return {"model": self.model, "language": self.language, "prompt": self.prompt}


@dataclass(slots=True, frozen=True)
class SessionPatch:
    """The fields one ``session.update`` sets (UNSET: unchanged). ``max_output_tokens`` None means "inf"."""

    type: SessionType | _Unset = UNSET
    instructions: str | _Unset = UNSET
    output_modalities: Modality | _Unset = UNSET
    voice: str | _Unset = UNSET
    input_format: AudioFormat | _Unset = UNSET
    output_format: AudioFormat | _Unset = UNSET
    turn_detection: TurnDetection | _Unset | None = UNSET
    transcription: TranscriptionConfig | _Unset | None = UNSET
    max_output_tokens: int | _Unset | None = UNSET
    preemptive_response: bool | _Unset = UNSET
    truncation: Truncation | _Unset = UNSET
    tools: tuple[FunctionTool, ...] | _Unset = UNSET
    tool_choice: ToolChoice | _Unset = UNSET


@dataclass(slots=True, frozen=True)
class ResponseOptions:
    """``response.create`` overrides for one response (UNSET: the session's value)."""

    output_modalities: Modality | _Unset = UNSET
    instructions: str | _Unset = UNSET
    voice: str | _Unset = UNSET
    output_format: AudioFormat | _Unset = UNSET
    max_output_tokens: int | _Unset | None = UNSET
    metadata: dict[str, str] | None = None
    tools: tuple[FunctionTool, ...] | _Unset = UNSET
    tool_choice: ToolChoice | _Unset = UNSET
    out_of_band: bool = False  # conversation "none": the response is not added to the conversation
    input: tuple[NewItem | NewFunctionCall | NewFunctionOutput | ItemReference, ...] | None = (
        None  # None: the conversation
    )


class PartType(StrEnum):
    INPUT_TEXT = "input_text"
    INPUT_AUDIO = "input_audio"
    INPUT_IMAGE = "input_image"  # a picture the user shows (a base64 data URL's payload, decoded with the item)
    OUTPUT_TEXT = "output_text"
    OUTPUT_AUDIO = "output_audio"  # an assistant's speech (audio and its transcript), replayed into the conversation


@dataclass(slots=True, frozen=True)
class NewPart:
    """One content part of a client-created item: text, audio bytes in the session's input format, or a picture
    (``image``: its base64, from a ``data:`` URL; decoded, and checked against the frame limits, with the item)."""

    type: PartType
    text: str = ""
    audio: bytes = b""
    transcript: str | None = None
    image: str = ""


@dataclass(slots=True, frozen=True)
class NewItem:
    """A ``message`` item from ``conversation.item.create``."""

    role: str  # "user" | "system" | "assistant"
    content: tuple[NewPart, ...]
    id: str | None = None


@dataclass(slots=True, frozen=True)
class NewFunctionCall:
    """A ``function_call`` item from the client (a call made elsewhere, replayed into the conversation)."""

    call_id: str
    name: str
    arguments: str
    id: str | None = None


@dataclass(slots=True, frozen=True)
class NewFunctionOutput:
    """A ``function_call_output`` item: the result of the call ``call_id``."""

    call_id: str
    output: str
    id: str | None = None


@dataclass(slots=True, frozen=True)
class ItemReference:
    """``{"type": "item_reference", "id"}`` in a response's ``input``: an item of the conversation."""

    id: str


# --- the client events --------------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class SessionUpdate:
    event_id: str | None
    patch: SessionPatch


@dataclass(slots=True, frozen=True)
class InputAudioAppend:
    event_id: str | None
    audio: bytes  # wire bytes in the session's input format


@dataclass(slots=True, frozen=True)
class InputAudioCommit:
    event_id: str | None


@dataclass(slots=True, frozen=True)
class InputAudioClear:
    event_id: str | None


@dataclass(slots=True, frozen=True)
class OutputAudioClear:
    event_id: str | None


@dataclass(slots=True, frozen=True)
class ItemCreate:
    event_id: str | None
    item: NewItem | NewFunctionCall | NewFunctionOutput
    previous_item_id: str | None = None  # None: at the end; "root": at the start


@dataclass(slots=True, frozen=True)
class ItemDelete:
    event_id: str | None
    item_id: str


@dataclass(slots=True, frozen=True)
class ItemRetrieve:
    event_id: str | None
    item_id: str


@dataclass(slots=True, frozen=True)
class ItemTruncate:
    event_id: str | None
    item_id: str
    content_index: int
    audio_end_ms: int


@dataclass(slots=True, frozen=True)
class ResponseCreate:
    event_id: str | None
    options: ResponseOptions = field(default_factory=ResponseOptions)


@dataclass(slots=True, frozen=True)
class ResponseCancel:
    event_id: str | None
    response_id: str | None = None


ClientEvent: TypeAlias = (
    SessionUpdate
    | InputAudioAppend
    | InputAudioCommit
    | InputAudioClear
    | OutputAudioClear
    | ItemCreate
    | ItemDelete
    | ItemRetrieve
    | ItemTruncate
    | ResponseCreate
    | ResponseCancel
)


# --- parsing ------------------------------------------------------------------------------------------------


def _opt_str(value: Any, param: str) -> str | None:
    return None if value is None else string(value, param, limit=4096)


def _max_tokens(value: Any, param: str) -> int | None:
    if value == "inf":
        return None
    return integer(value, param, 1, 4096)


def parse_format(value: Any, param: str) -> AudioFormat:
    """``{"type": "audio/pcm", "rate": 24000}`` | ``{"type": "audio/pcmu"}`` | ``{"type": "audio/pcma"}``."""
    if isinstance(value, str) and value in _LEGACY_FORMATS:  # the beta API's names
        return _LEGACY_FORMATS[value]
    body = obj(value, param)
    _known(body, FORMAT_KEYS, param)
    kind = body.get("type")
    try:
        fmt = AudioFormat(str(kind))
    except ValueError:
        allowed = ", ".join(f.value for f in AudioFormat)
        raise RealtimeError(
            "unsupported_audio_format", f"unsupported audio format {kind!r} (supported: {allowed})", f"{param}.type"
        ) from None
    rate = body.get("rate", fmt.rate)
    if rate != fmt.rate:
        raise RealtimeError(
            "unsupported_audio_format",
            f"{fmt.value} audio must be at {fmt.rate} Hz, got rate {rate!r}",
            f"{param}.rate",
        )
    return fmt


def _turn_detection(value: Any, param: str) -> TurnDetection | None:
    if value is None:
        return None
    body = obj(value, param)
    kind = body.get("type", "server_vad")
    if kind == "semantic_vad":
        return _semantic_vad(body, param)
    if kind != "server_vad":
        raise RealtimeError(
            "invalid_value",
            f"turn detection {kind!r} is not supported (server_vad, semantic_vad or null)",
            f"{param}.type",
        )
    _known(body, SERVER_VAD_KEYS, param)
    defaults = VadParams()
    try:
        vad = VadParams(
            threshold=number(body.get("threshold", defaults.threshold), f"{param}.threshold"),
            prefix_padding_ms=integer(
                body.get("prefix_padding_ms", defaults.prefix_padding_ms), f"{param}.prefix_padding_ms", 0, 10_000
            ),
            silence_duration_ms=integer(
                body.get("silence_duration_ms", defaults.silence_duration_ms), f"{param}.silence_duration_ms", 0, 10_000
            ),
        )
    except InvalidRequestError as exc:  # VadParams' own range check: the message names the field's whole path
        where = f"{param}.{exc.param}"
        raise RealtimeError("invalid_value", f"'{where}': {exc.message}", where) from None
    if body.get("idle_timeout_ms") is not None:
        raise RealtimeError("invalid_value", "idle_timeout_ms is not supported", f"{param}.idle_timeout_ms")
    return TurnDetection(
        vad,
        create_response=boolean(body.get("create_response", True), f"{param}.create_response"),
        interrupt_response=boolean(body.get("interrupt_response", True), f"{param}.interrupt_response"),
    )


def _semantic_vad(body: dict[str, Any], param: str) -> TurnDetection:
    _known(body, SEMANTIC_VAD_KEYS, param, hint="semantic_vad takes eagerness, create_response and interrupt_response")
    raw = body.get("eagerness", "auto")
    try:
        eagerness = Eagerness(raw)
    except (ValueError, TypeError):
        allowed = ", ".join(e.value for e in Eagerness)
        raise RealtimeError(
            "invalid_value", f"{param}.eagerness must be one of {allowed}, got {raw!r}", f"{param}.eagerness"
        ) from None
    return TurnDetection(
        create_response=boolean(body.get("create_response", True), f"{param}.create_response"),
        interrupt_response=boolean(body.get("interrupt_response", True), f"{param}.interrupt_response"),
        type=TurnType.SEMANTIC_VAD,
        eagerness=eagerness,
    )


def _truncation(value: Any, param: str) -> Truncation:
    """``"auto"`` | ``"disabled"`` | ``{"type": "retention_ratio", "retention_ratio": 0..1}``."""
    if value in ("auto", "disabled"):
        return Truncation(TruncationType(value))
    if not isinstance(value, dict):
        raise RealtimeError(
            "invalid_value", f'{param} must be "auto", "disabled" or {{"type": "retention_ratio", ...}}', param
        )
    kind = value.get("type")
    if kind in ("auto", "disabled") and set(value) == {"type"}:
        return Truncation(TruncationType(kind))
    if kind != "retention_ratio":
        raise RealtimeError(
            "invalid_value", f"{param}.type must be auto, disabled or retention_ratio, got {kind!r}", f"{param}.type"
        )
    ratio = number(value.get("retention_ratio"), f"{param}.retention_ratio", 0.0, 1.0)
    unknown = sorted(set(value) - {"type", "retention_ratio"})
    if unknown:
        raise RealtimeError("invalid_value", f"{param}.{unknown[0]} is not supported", f"{param}.{unknown[0]}")
    return Truncation(TruncationType.RETENTION_RATIO, ratio)


def _transcription(value: Any, param: str) -> TranscriptionConfig | None:
    if value is None:
        return None
    body = obj(value, param)
    _known(body, TRANSCRIPTION_KEYS, param)
    return TranscriptionConfig(
        _opt_str(body.get("model"), f"{param}.model"),
        _opt_str(body.get("language"), f"{param}.language"),
        _opt_str(body.get("prompt"), f"{param}.prompt"),
    )


def _modalities(value: Any, param: str) -> Modality:
    if not isinstance(value, list) or not value or any(m not in ("audio", "text") for m in value):
        message = f'{param} must be ["audio"] (speech and its transcript) or ["text"]'
        raise RealtimeError("invalid_value", message, param)
    return Modality.AUDIO if "audio" in value else Modality.TEXT  # ["text", "audio"]: speech with its transcript


def _voice(value: Any, param: str) -> str:
    if isinstance(value, dict):  # {"id": "..."}
        value = value.get("id")
    return string(value, param, limit=256, non_empty=True)


# What a session object may hold: the GA request's fields and everything session.created / session.updated show
# (a client may send a session back as it got it); an unknown key is refused, as OpenAI's server refuses it, rather
# than ignored (a misspelt field would otherwise do nothing, silently).
SESSION_KEYS = frozenset({
    "type", "id", "object", "expires_at", "include", "model", "output_modalities", "instructions", "audio", "tools",
    "tool_choice", "max_output_tokens", "tracing", "truncation", "prompt", "preemptive_response",
})  # fmt: skip
AUDIO_KEYS = {
    "session.audio": frozenset({"input", "output"}),
    "session.audio.input": frozenset({"format", "transcription", "noise_reduction", "turn_detection"}),
    "session.audio.output": frozenset({"format", "voice", "speed"}),
}


FORMAT_KEYS = frozenset({"type", "rate"})
SERVER_VAD_KEYS = frozenset({
    "type", "threshold", "prefix_padding_ms", "silence_duration_ms", "idle_timeout_ms", "create_response",
    "interrupt_response",
})  # fmt: skip
SEMANTIC_VAD_KEYS = frozenset({"type", "eagerness", "create_response", "interrupt_response"})
# OpenAI's transcription options beyond the model, language and prompt (delay, keywords, languages) tune its own
# transcription models: taken and ignored, as noise_reduction is
TRANSCRIPTION_KEYS = frozenset({"model", "language", "prompt", "delay", "keywords", "languages"})
TOOL_KEYS = frozenset({"type", "name", "description", "parameters", "strict"})  # the Realtime API's flat tool
RESPONSE_KEYS = frozenset({
    "conversation", "input", "instructions", "max_output_tokens", "metadata", "output_modalities", "prompt",
    "tool_choice", "tools", "audio", "parallel_tool_calls", "reasoning",  # the last two: taken and ignored
})  # fmt: skip
RESPONSE_AUDIO_KEYS = {"response.audio": frozenset({"output"}), "response.audio.output": frozenset({"format", "voice"})}
# The beta API's names in a GA response.create: refused with the GA name, not ignored (a beta client asking for text
# with "modalities" would otherwise get speech)
BETA_RESPONSE_NAMES: dict[str, str | None] = {
    "modalities": "output_modalities",
    "voice": "audio.output.voice",
    "output_audio_format": "audio.output.format",
    "max_response_output_tokens": "max_output_tokens",
    "temperature": None,
}

# The beta API's names in a GA session.update (what the SDK's beta client sends): refused with the GA name
BETA_SESSION_NAMES: dict[str, str | None] = {
    "modalities": "output_modalities",
    "voice": "audio.output.voice",
    "output_audio_format": "audio.output.format",
    "input_audio_format": "audio.input.format",
    "turn_detection": "audio.input.turn_detection",
    "input_audio_transcription": "audio.input.transcription",
    "input_audio_noise_reduction": "audio.input.noise_reduction",
    "speed": "audio.output.speed",
    "max_response_output_tokens": "max_output_tokens",
    "temperature": None,
}


def _no_beta_names(body: dict[str, Any], names: dict[str, str | None], param: str) -> None:
    """An ``unknown_parameter`` error for a beta API name in ``body``, naming its GA replacement under ``param``."""
    for beta, ga in names.items():
        if beta in body:
            instead = f"; the GA API's is {param}.{ga}" if ga else " (the GA API has no such field)"
            name = f"{param}.{beta}"
            raise RealtimeError("unknown_parameter", f"Unknown parameter: '{name}'{instead}.", name)


def _known(body: dict[str, Any], keys: frozenset[str], param: str, hint: str = "") -> None:
    """An ``unknown_parameter`` error naming the first key of ``body`` outside ``keys`` (``hint``: what it takes)."""
    unknown = sorted(set(body) - keys)
    if unknown:
        where = f"{param}.{unknown[0]}"
        message = f"Unknown parameter: '{where}'." + (f" {hint}." if hint else "")
        raise RealtimeError("unknown_parameter", message, where)


def _no_prompt(body: dict[str, Any], where: str) -> None:
    """OpenAI's prompt templates (stored on its platform) name nothing here: refused, unless null."""
    if body.get("prompt") is not None:
        raise RealtimeError("invalid_value", "prompt templates are not supported: send instructions", f"{where}.prompt")


def _flat_tools(value: Any, field: str) -> tuple[FunctionTool, ...]:
    """A Realtime ``tools`` list (flat function tools); a function tool's keys are checked first (another type
    is refused by the parser, naming its type)."""
    if isinstance(value, list):
        for i, tool in enumerate(value):
            if isinstance(tool, dict) and tool.get("type", "function") == "function":
                _known(tool, TOOL_KEYS, f"{field}[{i}]")
    tools: tuple[FunctionTool, ...] = _tool_field(parse_tools, value, flat=True, field=field)
    return tools


def parse_session(value: Any, *, max_instructions: int) -> SessionPatch:
    """The patch of a ``session.update``'s ``session`` object."""
    body = obj(value, "session")
    _no_beta_names(body, BETA_SESSION_NAMES, "session")
    _known(body, SESSION_KEYS, "session")
    fields: dict[str, Any] = {}
    if "type" in body:
        try:
            fields["type"] = SessionType(body["type"])
        except ValueError:
            message = "session.type must be 'realtime' or 'transcription'"
            raise RealtimeError("invalid_value", message, "session.type") from None
    if "instructions" in body:
        fields["instructions"] = string(body["instructions"], "session.instructions", limit=max_instructions)
    if "output_modalities" in body:
        fields["output_modalities"] = _modalities(body["output_modalities"], "session.output_modalities")
    if body.get("max_output_tokens") is not None:
        fields["max_output_tokens"] = _max_tokens(body["max_output_tokens"], "session.max_output_tokens")
    if "truncation" in body:
        fields["truncation"] = _truncation(body["truncation"], "session.truncation")
    if "preemptive_response" in body:
        fields["preemptive_response"] = boolean(body["preemptive_response"], "session.preemptive_response")
    _no_prompt(body, "session")
    if "tools" in body:
        fields["tools"] = _flat_tools(body["tools"], "session.tools")
    if "tool_choice" in body:
        fields["tool_choice"] = _tool_field(
            parse_tool_choice, body["tool_choice"], flat=True, field="session.tool_choice"
        )
    audio = obj(body.get("audio", {}), "session.audio")
    audio_in = obj(audio.get("input", {}), "session.audio.input")
    audio_out = obj(audio.get("output", {}), "session.audio.output")
    for part, where in (
        (audio, "session.audio"),
        (audio_in, "session.audio.input"),
        (audio_out, "session.audio.output"),
    ):
        _known(part, AUDIO_KEYS[where], where)
    if audio_in.get("format") is not None:
        fields["input_format"] = parse_format(audio_in["format"], "session.audio.input.format")
    if "turn_detection" in audio_in:
        fields["turn_detection"] = _turn_detection(audio_in["turn_detection"], "session.audio.input.turn_detection")
    if "transcription" in audio_in:
        fields["transcription"] = _transcription(audio_in["transcription"], "session.audio.input.transcription")
    if audio_out.get("format") is not None:
        fields["output_format"] = parse_format(audio_out["format"], "session.audio.output.format")
    if audio_out.get("voice") is not None:
        fields["voice"] = _voice(audio_out["voice"], "session.audio.output.voice")
    speed = audio_out.get("speed", 1.0)
    if speed != 1.0:
        raise RealtimeError("invalid_value", "only speed 1.0 is supported", "session.audio.output.speed")
    return SessionPatch(**fields)


def decode_audio_field(value: Any, param: str, max_bytes: int) -> bytes:
    """Base64 audio of at most ``max_bytes`` decoded bytes."""
    if not isinstance(value, str):
        raise RealtimeError("invalid_value", f"{param} must be a base64 string", param)
    if len(value) // 4 * 3 > max_bytes + 2:
        mib = max_bytes / (1024 * 1024)
        raise RealtimeError("invalid_value", f"{param} is larger than {mib:g} MiB of audio per append", param)
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise RealtimeError("invalid_value", f"{param} is not valid base64", param) from None
    if len(data) > max_bytes:
        raise RealtimeError("invalid_value", f"{param} is larger than {max_bytes} bytes of audio per append", param)
    return data


def _part(value: Any, param: str, max_bytes: int, max_text: int) -> NewPart:
    body = obj(value, param)
    kind = body.get("type")
    if kind in ("input_text", "text", "output_text"):
        part_type = PartType.OUTPUT_TEXT if kind == "output_text" else PartType.INPUT_TEXT
        return NewPart(part_type, text=string(body.get("text"), f"{param}.text", limit=max_text))
    if kind == "input_audio":
        audio = decode_audio_field(body.get("audio"), f"{param}.audio", max_bytes)
        transcript = body.get("transcript")
        return NewPart(PartType.INPUT_AUDIO, audio=audio, transcript=_opt_str(transcript, f"{param}.transcript"))
    if kind == "input_image":  # OpenAI GA: {"type": "input_image", "image_url": "data:image/png;base64,...", "detail"}
        detail = body.get("detail", "auto")
        if detail not in ("auto", "low", "high"):
            raise RealtimeError("invalid_value", f"{param}.detail must be auto, low or high", f"{param}.detail")
        try:
            image = split_data_url(body.get("image_url"), f"{param}.image_url")
        except InvalidRequestError as exc:
            raise RealtimeError("invalid_value", exc.message, exc.param) from None
        return NewPart(PartType.INPUT_IMAGE, image=image)
    if kind == "output_audio":
        audio = b"" if body.get("audio") is None else decode_audio_field(body["audio"], f"{param}.audio", max_bytes)
        transcript = string(body.get("transcript", ""), f"{param}.transcript", limit=max_text)
        return NewPart(PartType.OUTPUT_AUDIO, audio=audio, transcript=transcript)
    kinds = "input_text, input_audio, input_image, output_text, output_audio"
    raise RealtimeError("invalid_value", f"content type {kind!r} is not supported ({kinds})", param)


def _tool_field(parse: Any, value: Any, **kwargs: Any) -> Any:
    """A tool field's parse; its InvalidRequestError as an ``invalid_value`` error naming the field."""
    try:
        return parse(value, **kwargs)
    except InvalidRequestError as exc:
        raise RealtimeError("invalid_value", exc.message, exc.param) from None


def _item_id(body: dict[str, Any], param: str) -> str | None:
    item_id = body.get("id")
    return None if item_id is None else string(item_id, f"{param}.id", limit=64, non_empty=True)


def parse_item(
    value: Any, max_bytes: int, max_text: int = MAX_TEXT_CHARS, param: str = "item"
) -> NewItem | NewFunctionCall | NewFunctionOutput:
    """A ``conversation.item.create`` item (or one of a response's ``input``); text parts hold at most ``max_text``
    characters."""
    body = obj(value, param)
    kind = body.get("type", "message")
    if kind == "function_call":
        return NewFunctionCall(
            string(body.get("call_id"), f"{param}.call_id", limit=64, non_empty=True),
            string(body.get("name"), f"{param}.name", limit=64, non_empty=True),
            string(body.get("arguments", "{}"), f"{param}.arguments", limit=1 << 20),
            _item_id(body, param),
        )
    if kind == "function_call_output":
        return NewFunctionOutput(
            string(body.get("call_id"), f"{param}.call_id", limit=64, non_empty=True),
            string(body.get("output"), f"{param}.output", limit=1 << 20),
            _item_id(body, param),
        )
    if kind != "message":
        message = f"{param}.type must be message, function_call or function_call_output, got {kind!r}"
        raise RealtimeError("invalid_value", message, f"{param}.type")
    return _message_item(body, max_bytes, max_text, param)


def _message_item(body: dict[str, Any], max_bytes: int, max_text: int, param: str) -> NewItem:
    role = body.get("role")
    if role not in ("user", "system", "assistant"):
        raise RealtimeError("invalid_value", f"{param}.role must be user, system or assistant", f"{param}.role")
    content = body.get("content")
    if not isinstance(content, list) or not content:
        raise RealtimeError("invalid_value", f"{param}.content must be a non-empty list", f"{param}.content")
    parts = tuple(_part(p, f"{param}.content[{i}]", max_bytes, max_text) for i, p in enumerate(content))
    if role == "assistant":  # the beta API's assistant text was "text": an assistant's is output text
        parts = tuple(
            replace(part, type=PartType.OUTPUT_TEXT) if isinstance(raw, dict) and raw.get("type") == "text" else part
            for part, raw in zip(parts, content, strict=True)
        )
    for i, part in enumerate(parts):
        allowed: tuple[PartType, ...] = (PartType.INPUT_TEXT, PartType.INPUT_AUDIO, PartType.INPUT_IMAGE)
        if role == "assistant":
            allowed = (PartType.OUTPUT_TEXT, PartType.OUTPUT_AUDIO)
        if role == "system":
            allowed = (PartType.INPUT_TEXT,)
        if part.type not in allowed:
            sent = content[i].get("type") if isinstance(content[i], dict) else None
            article = "an" if role == "assistant" else "a"
            takes = ", ".join(t.value for t in allowed)
            raise RealtimeError(
                "invalid_value",
                f"{article} {role} item cannot hold {sent!r} content (it takes {takes})",
                f"{param}.content[{i}].type",
            )
    return NewItem(role, parts, _item_id(body, param))


def _input(value: Any, max_bytes: int) -> tuple[NewItem | NewFunctionCall | NewFunctionOutput | ItemReference, ...]:
    """A response's own ``input``: new items, or references to items of the conversation."""
    if not isinstance(value, list):
        raise RealtimeError("invalid_value", "response.input must be a list of items", "response.input")
    out: list[NewItem | NewFunctionCall | NewFunctionOutput | ItemReference] = []
    for i, raw in enumerate(value):
        param = f"response.input[{i}]"
        body = obj(raw, param)
        if body.get("type") == "item_reference":
            out.append(ItemReference(string(body.get("id"), f"{param}.id", limit=64, non_empty=True)))
        else:
            out.append(parse_item(body, max_bytes, param=param))
    return tuple(out)


def _response_options(value: Any, max_instructions: int, max_bytes: int = MAX_APPEND_BYTES) -> ResponseOptions:
    if value is None:
        return ResponseOptions()
    body = obj(value, "response")
    _no_beta_names(body, BETA_RESPONSE_NAMES, "response")
    _known(body, RESPONSE_KEYS, "response")
    _no_prompt(body, "response")
    fields: dict[str, Any] = {}
    conversation = body.get("conversation", "auto")
    if conversation not in ("auto", "none"):
        message = f"response.conversation must be 'auto' or 'none', got {conversation!r}"
        raise RealtimeError("invalid_value", message, "response.conversation")
    fields["out_of_band"] = conversation == "none"
    if body.get("input") is not None:
        fields["input"] = _input(body["input"], max_bytes)
    if "tools" in body:
        fields["tools"] = _flat_tools(body["tools"], "response.tools")
    if "tool_choice" in body:
        fields["tool_choice"] = _tool_field(
            parse_tool_choice, body["tool_choice"], flat=True, field="response.tool_choice"
        )
    if "output_modalities" in body:
        fields["output_modalities"] = _modalities(body["output_modalities"], "response.output_modalities")
    if "instructions" in body:
        fields["instructions"] = string(body["instructions"], "response.instructions", limit=max_instructions)
    if body.get("max_output_tokens") is not None:
        fields["max_output_tokens"] = _max_tokens(body["max_output_tokens"], "response.max_output_tokens")
    audio = obj(body.get("audio", {}), "response.audio")
    audio_out = obj(audio.get("output", {}), "response.audio.output")
    for part, where in ((audio, "response.audio"), (audio_out, "response.audio.output")):
        _known(part, RESPONSE_AUDIO_KEYS[where], where)
    if audio_out.get("format") is not None:
        fields["output_format"] = parse_format(audio_out["format"], "response.audio.output.format")
    if audio_out.get("voice") is not None:
        fields["voice"] = _voice(audio_out["voice"], "response.audio.output.voice")
    metadata = body.get("metadata")
    if metadata is not None:
        meta = obj(metadata, "response.metadata")
        if len(meta) > 16 or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= MAX_METADATA_KEY_CHARS
            and len(v) <= MAX_METADATA_VALUE_CHARS for k, v in meta.items()
        ):  # fmt: skip
            message = (f"metadata holds at most 16 string pairs, keys of at most {MAX_METADATA_KEY_CHARS} characters "
                       f"and values of at most {MAX_METADATA_VALUE_CHARS}")  # fmt: skip
            raise RealtimeError("invalid_value", message, "response.metadata")
        fields["metadata"] = dict(meta)
    return ResponseOptions(**fields)


def parse_client_event(
    text: str | bytes | None,
    *,
    max_append_bytes: int = MAX_APPEND_BYTES,
    max_instructions: int = 32_768,
    max_text_chars: int = MAX_TEXT_CHARS,
) -> ClientEvent:
    """One client message -> its typed event; RealtimeError (``invalid_json``, ``unknown_event``, ...) otherwise.

    CPU cost grows with the message (JSON and base64 of audio): the shell runs large ones off the event loop.
    """
    if not isinstance(text, str):
        raise RealtimeError("invalid_json", "binary messages are not supported: send JSON text messages")
    try:
        body = parse_json(text)
    except FieldError as exc:  # a string no UTF-8 text holds, named by its path
        raise RealtimeError("invalid_value", exc.message, exc.param) from None
    except (ValueError, RecursionError):
        raise RealtimeError("invalid_json", "the message is not valid JSON") from None
    if not isinstance(body, dict):
        raise RealtimeError("invalid_json", "a client event must be a JSON object")
    raw_id = body.get("event_id")
    event_id = raw_id if isinstance(raw_id, str) and len(raw_id) <= 128 else None
    try:
        return _parse(body, event_id, max_append_bytes, max_instructions, max_text_chars)
    except FieldError as exc:  # a field of the wrong type or range, in the readers' words
        raise RealtimeError("invalid_value", exc.message, exc.param, event_id=event_id) from None
    except RealtimeError as exc:
        exc.event_id = event_id
        raise


def _parse(
    body: dict[str, Any], event_id: str | None, max_bytes: int, max_instructions: int, max_text: int
) -> ClientEvent:
    kind = body.get("type")
    if not isinstance(kind, str):
        got = "none" if kind is None else type_name(kind)
        raise RealtimeError(
            "invalid_value", f"a client event needs a string 'type' (e.g. 'session.update'), got {got}", "type"
        )
    if kind == "input_audio_buffer.append":
        return InputAudioAppend(event_id, decode_audio_field(body.get("audio"), "audio", max_bytes))
    if kind == "session.update":
        return SessionUpdate(event_id, parse_session(body.get("session"), max_instructions=max_instructions))
    if kind == "input_audio_buffer.commit":
        return InputAudioCommit(event_id)
    if kind == "input_audio_buffer.clear":
        return InputAudioClear(event_id)
    if kind == "output_audio_buffer.clear":
        return OutputAudioClear(event_id)
    if kind == "conversation.item.create":
        previous = body.get("previous_item_id")
        previous = None if previous is None else string(previous, "previous_item_id", limit=64)
        return ItemCreate(event_id, parse_item(body.get("item"), max_bytes, max_text), previous)
    if kind == "conversation.item.delete":
        return ItemDelete(event_id, string(body.get("item_id"), "item_id", limit=64))
    if kind == "conversation.item.retrieve":
        return ItemRetrieve(event_id, string(body.get("item_id"), "item_id", limit=64))
    if kind == "conversation.item.truncate":
        return ItemTruncate(
            event_id,
            string(body.get("item_id"), "item_id", limit=64),
            integer(body.get("content_index", 0), "content_index", 0, 1024),
            integer(body.get("audio_end_ms"), "audio_end_ms", 0, 1 << 40),
        )
    if kind == "response.create":
        return ResponseCreate(event_id, _response_options(body.get("response"), max_instructions, max_bytes))
    if kind == "response.cancel":
        rid = body.get("response_id")
        return ResponseCancel(event_id, None if rid is None else string(rid, "response_id", limit=64))
    shown = kind if len(kind) <= 64 else f"{kind[:64]}..."
    raise RealtimeError("unknown_event", f"unknown client event type {shown!r}", "type")
