"""``POST /v1/chat/completions`` fields: wire validation of the JSON body into typed options (pure, no engine).

Every problem is a 400 naming the field in OpenAI's error shape. What depends on the loaded model (``max_tokens``
against its context, the voice) is checked by the engine when the request is built, and reaches the client the
same way (InvalidRequestError -> 400).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omni_stream.errors import InvalidRequestError
from omni_stream.realtime.chat.tool_fields import (
    parse_response_format,
    parse_tool_calls,
    parse_tool_choice,
    parse_tools,
)
from omni_stream.realtime.common.errors import bad_request
from omni_stream.realtime.common.json_fields import (
    boolean,
    int_field,
    integer,
    number,
    obj,
    optional,
    type_name,
    unicode,
)
from omni_stream.realtime.settings import Settings
from omni_stream.requests import ChatMessage, Role, SamplingParams
from omni_stream.text.tools import AUTO, TEXT_FORMAT, FunctionTool, ResponseFormat, ToolChoice
from omni_stream.validation.sampling import sampling_from_openai
from omni_stream.vision.frames import split_data_url

ROLES = {
    "system": Role.SYSTEM,
    "developer": Role.SYSTEM,
    "user": Role.USER,
    "assistant": Role.ASSISTANT,
    "tool": Role.TOOL,
}
MODALITIES = ("text", "audio")
AUDIO_FORMATS = ("pcm16", "wav", "mp3", "flac", "opus", "aac")
STREAM_AUDIO_FORMATS = ("pcm16",)  # base64 PCM16 deltas; whole-file formats only fit a non-streamed reply
MAX_STOP = 4
DETAILS = ("auto", "low", "high")  # an image_url part's detail (OpenAI's values)
MIN_SENTENCE_CHARS, MAX_SENTENCE_CHARS = 8, 4096
MAX_TOKENS = 1 << 20  # a wire bound; the model's context is the real one
# Fields OpenAI defines that this server does not implement: sent with a non-default value they are a 400,
# never silently ignored.
UNSUPPORTED = {
    "functions": None,
    "function_call": None,
    "prediction": None,
    "web_search_options": None,
    # vLLM's extra sampling fields beside top_k and repetition_penalty (which are read)
    "min_tokens": 0,
    "min_p": 0.0,
}
# OpenAI's fields for its own service (storage, logging, routing, prompt caching, reasoning models): taken and ignored.
IGNORED = frozenset(
    {
        "metadata",
        "store",
        "user",
        "service_tier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "safety_identifier",
        "reasoning_effort",
        "verbosity",
    }
)
# Every field read here; any other is refused naming it (a vLLM or SDK extra silently dropped would look applied).
READ = frozenset(
    {
        "messages",
        "model",
        "n",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "max_completion_tokens",
        "max_tokens",
        "stream",
        "stream_options",
        "modalities",
        "audio",
        "ignore_eos",
        "temperature",
        "top_p",
        "top_k",
        "repetition_penalty",
        "seed",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
    }
)
KNOWN = READ | IGNORED | frozenset(UNSUPPORTED)
AUDIO_KEYS = frozenset({"voice", "format", "max_sentence_chars"})


@dataclass(slots=True, frozen=True)
class ChatOptions:
    """A validated chat request. ``sampling`` None: the model's defaults; ``audio_format`` None: text only."""

    messages: tuple[ChatMessage, ...]
    pictures: tuple[PictureRef, ...] = ()  # the user turns' images, decoded into the messages when the request is built
    model: str | None = None
    max_tokens: int | None = None
    sampling: SamplingParams | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    voice: str | None = None
    audio_format: str | None = None
    max_sentence_chars: int | None = None  # extension: spoken units are cut at this many characters
    ignore_eos: bool = False
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = AUTO
    parallel_tool_calls: bool = True
    response_format: ResponseFormat = TEXT_FORMAT
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None  # None: no log-probabilities, else this many alternatives

    @property
    def speaks(self) -> bool:
        return self.audio_format is not None


@dataclass(slots=True, frozen=True)
class PictureRef:
    """An ``image_url`` part of user message ``message``, still encoded: its base64 ``payload`` (a data URL's),
    decoded off the event loop when the request is built (:func:`omni_stream.realtime.chat.pictures.show`);
    ``param`` names the part in errors."""

    message: int
    payload: str
    param: str


def _content(value: Any, where: str, pictures: list[PictureRef] | None = None, message: int = 0) -> str:
    """A message's text; with ``pictures`` (a user turn), its ``image_url`` parts are taken too, in order."""
    if isinstance(value, str):
        return unicode(value, where)
    if isinstance(value, list):
        if not value:
            raise bad_request(f"'{where}' must hold at least one part", where)
        parts = []
        for i, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "image_url" and pictures is not None:
                pictures.append(_picture(part, f"{where}[{i}].image_url", message))
                continue
            if kind != "text" or not isinstance(part.get("text"), str):
                shape = '{"type": "text", "text": ...}' + (" or an image_url part" if pictures is not None else "")
                raise bad_request(f"'{where}[{i}]' must be a text part {shape}", where)
            parts.append(unicode(part["text"], where))
        return "".join(parts)
    if value is None:
        raise bad_request(f"'{where}' is required", where)
    raise bad_request(f"'{where}' must be a string or a list of text parts, got {type_name(value)}", where)


def _picture(part: dict[str, Any], where: str, message: int) -> PictureRef:
    """OpenAI's ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,...", "detail": ...}}``; only
    data URLs (nothing is fetched). ``detail`` is checked and otherwise left to the resolution cap (Settings'
    ``frame_limits.max_side``), which every picture is scaled to."""
    body = part.get("image_url")
    if isinstance(body, str):  # some clients send the URL itself
        body = {"url": body}
    if not isinstance(body, dict):
        raise bad_request(f"'{where}' must be an object with a 'url'", where)
    detail = body.get("detail", "auto")
    if detail not in DETAILS:
        raise bad_request(f"'{where}.detail' must be one of {', '.join(DETAILS)}, got {detail!r}", where)
    return PictureRef(message, _fields(split_data_url, body.get("url"), f"{where}.url"), f"{where}.url")


def _message(message: dict[str, Any], i: int, pictures: list[PictureRef]) -> ChatMessage:
    role = ROLES[message["role"]]
    where = f"messages[{i}]"
    if role is Role.USER:
        return ChatMessage(role, _content(message.get("content"), f"{where}.content", pictures, i))
    if role is Role.ASSISTANT:
        calls = _fields(parse_tool_calls, message.get("tool_calls"), f"{where}.tool_calls")
        content = message.get("content")
        # null content: empty (a turn that only called, or one some frameworks echo back with a refusal), as vLLM
        text = "" if content is None else _content(content, f"{where}.content")
        return ChatMessage(role, text, tool_calls=calls)
    if role is Role.TOOL:
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise bad_request(f"'{where}.tool_call_id' must name the call this tool message answers", where)
        return ChatMessage(role, _content(message.get("content"), f"{where}.content"), tool_call_id=call_id)
    return ChatMessage(role, _content(message.get("content"), f"{where}.content"))


def _fields(parse: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
    """``parse(value, ...)`` with its InvalidRequestError as a 400 naming the field."""
    try:
        return parse(value, *args, **kwargs)
    except InvalidRequestError as exc:
        raise bad_request(exc.message, exc.param) from None


def parse_messages(value: Any, max_pictures: int = 0) -> tuple[tuple[ChatMessage, ...], tuple[PictureRef, ...]]:
    """The conversation: system/developer/user/assistant/tool turns with text content, at least one; assistant
    turns may carry ``tool_calls``, tool turns answer one by ``tool_call_id``; user turns may show images
    (``image_url`` parts, at most ``max_pictures`` in all), returned apart, still encoded."""
    if value is None:
        raise bad_request("'messages' is required", "messages")
    if not isinstance(value, list):
        raise bad_request(f"'messages' must be an array, got {type_name(value)}", "messages")
    if not value:
        raise bad_request("'messages' must hold at least one message", "messages")
    out: list[ChatMessage] = []
    pictures: list[PictureRef] = []
    called: set[str] = set()  # the ids of the calls made so far
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise bad_request(f"'messages[{i}]' must be an object, got {type_name(message)}", "messages")
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            allowed = ", ".join(f"'{r}'" for r in ROLES)
            raise bad_request(f"'messages[{i}].role' must be one of {allowed}, got {role!r}", f"messages[{i}].role")
        turn = _message(message, i, pictures)
        # As OpenAI: a tool result answers a call made before it (a stray one would reach the template unanswered)
        if turn.role is Role.TOOL and turn.tool_call_id not in called:
            where = f"messages[{i}].tool_call_id"
            raise bad_request(f"'{where}' {turn.tool_call_id!r} answers no call of an earlier assistant message", where)
        called.update(call.id for call in turn.tool_calls)
        out.append(turn)
    if len(pictures) > max_pictures:
        raise bad_request(f"a request shows at most {max_pictures} images, got {len(pictures)}", "messages")
    return tuple(out), tuple(pictures)


def _sampling(body: dict[str, Any]) -> SamplingParams | None:
    return sampling_from_openai(
        optional(body, "temperature", number, 0.0, 2.0),
        optional(body, "top_p", number, 0.0, 1.0),
        int_field(body, "top_k", -1, 1 << 20),  # vLLM's extra field; -1 (or 0): no top-k
        optional(body, "repetition_penalty", number, 0.0, 2.0),  # vLLM's extra field; SamplingParams wants > 0
    )


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """``{"token id": bias}`` with ids as decimal strings and biases in -100..100."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise bad_request(
            f"'logit_bias' must be an object of token ids to biases, got {type_name(value)}", "logit_bias"
        )
    out = []
    for key, bias in value.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 10):  # ids < 2**31
            raise bad_request(f"'logit_bias' keys must be token ids (digits), got {key!r}", "logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not -100 <= bias <= 100:
            raise bad_request(f"'logit_bias[{key}]' must be a number between -100 and 100, got {bias!r}", "logit_bias")
        out.append((int(key), float(bias)))
    return tuple(out)


def _logprobs(body: dict[str, Any]) -> int | None:
    wanted = bool(optional(body, "logprobs", boolean))
    top = int_field(body, "top_logprobs", 0, 20)
    if top is not None and not wanted:
        raise bad_request("'top_logprobs' needs 'logprobs' to be true", "top_logprobs")
    return (top or 0) if wanted else None


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise bad_request("'stop' must be a non-empty string or an array of them", "stop")
    if len(items) > MAX_STOP:
        raise bad_request(f"'stop' holds at most {MAX_STOP} strings, got {len(items)}", "stop")
    return tuple(unicode(s, "stop") for s in items)


def _audio(body: dict[str, Any], stream: bool) -> tuple[str | None, str | None, int | None]:
    modalities = body.get("modalities")
    if modalities is None:
        modalities = ["text"]
    if not isinstance(modalities, list) or not modalities or not all(isinstance(m, str) for m in modalities):
        raise bad_request('\'modalities\' must be an array such as ["text"] or ["text", "audio"]', "modalities")
    unknown = [m for m in modalities if m not in MODALITIES]
    if unknown:
        raise bad_request(f"Unknown modality {unknown[0]!r}: 'modalities' may hold 'text' and 'audio'", "modalities")
    if "text" not in modalities:
        raise bad_request("'modalities' must include 'text'", "modalities")
    audio = body.get("audio")
    if "audio" not in modalities:
        if audio is not None:
            raise bad_request("'audio' is set but 'modalities' does not include 'audio'", "audio")
        return None, None, None
    if not isinstance(audio, dict):
        raise bad_request("'audio' ({\"voice\", \"format\"}) is required when 'modalities' includes 'audio'", "audio")
    unknown = sorted(set(audio) - AUDIO_KEYS)
    if unknown:
        raise bad_request(
            f"Unknown field 'audio.{unknown[0]}' (voice, format, max_sentence_chars)", f"audio.{unknown[0]}"
        )
    voice = audio.get("voice")
    if voice is not None and not isinstance(voice, str):
        raise bad_request(f"'audio.voice' must be a string, got {type_name(voice)}", "audio.voice")
    fmt = audio.get("format", "pcm16")
    allowed = STREAM_AUDIO_FORMATS if stream else AUDIO_FORMATS
    if fmt not in allowed:
        choices = ", ".join(f"'{f}'" for f in allowed)
        mode = "a streamed" if stream else "a"
        raise bad_request(f"'audio.format' must be one of {choices} for {mode} reply, got {fmt!r}", "audio.format")
    # Extension: the longest unit spoken at once (characters); a long first sentence is cut so audio starts sooner.
    key = "audio.max_sentence_chars"
    max_chars = audio.get("max_sentence_chars")
    if max_chars is not None:
        max_chars = integer(max_chars, key, MIN_SENTENCE_CHARS, MAX_SENTENCE_CHARS)
    return (voice.strip().lower() or None) if voice is not None else None, fmt, max_chars


def parse_chat(body: Any, settings: Settings) -> ChatOptions:
    """Validate a chat completions body (see the module docstring)."""
    if not isinstance(body, dict):
        raise bad_request("Request body must be a JSON object")
    unknown = sorted(set(body) - KNOWN)
    if unknown:
        raise bad_request(
            f"Unknown field '{unknown[0]}': this server does not read it (of vLLM's extra fields it reads top_k, "
            "repetition_penalty and ignore_eos)",
            unknown[0],
        )
    messages, pictures = parse_messages(body.get("messages"), settings.frame_limits.max_conversation_pictures)
    for key, default in UNSUPPORTED.items():
        if body.get(key, default) not in (default, None, [], {}):
            raise bad_request(f"'{key}' is not supported by this server", key)
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):  # one message for every other value, 0 and 2 alike
        raise bad_request(f"'n' must be 1: this server returns one choice, got {n!r}", "n")
    tools = _fields(parse_tools, body.get("tools"))
    tool_choice = _fields(parse_tool_choice, body.get("tool_choice"))
    if tool_choice.forces_call and not tools:
        raise bad_request(f"'tool_choice' {tool_choice.mode.value!r} needs 'tools'", "tool_choice")
    if tool_choice.name is not None and tool_choice.name not in {t.name for t in tools}:
        raise bad_request(f"'tool_choice' names {tool_choice.name!r}, which is not among the 'tools'", "tool_choice")
    parallel = optional(body, "parallel_tool_calls", boolean)
    response_format = _fields(parse_response_format, body.get("response_format"))
    max_tokens = int_field(body, "max_completion_tokens", 1, MAX_TOKENS)
    if max_tokens is None:
        max_tokens = int_field(body, "max_tokens", 1, MAX_TOKENS)
    stream = bool(optional(body, "stream", boolean))
    options = optional(body, "stream_options", obj)
    usage = (options or {}).get("include_usage")
    include_usage = usage is not None and boolean(usage, "stream_options.include_usage")
    if options is not None and not stream:
        raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request(f"'model' must be a string, got {type_name(model)}", "model")
    voice, audio_format, max_sentence_chars = _audio(body, stream)
    ignore_eos = False
    if "ignore_eos" in body:
        if not settings.enable_benchmark_fields:
            message = "'ignore_eos' is a benchmark-only field; this server does not accept it"
            raise bad_request(f"{message} (see --enable-benchmark-fields)", "ignore_eos")
        ignore_eos = bool(optional(body, "ignore_eos", boolean))
        if ignore_eos and max_tokens is None:
            raise bad_request(
                "'ignore_eos' requires 'max_tokens' (the exact number of tokens to generate)", "ignore_eos"
            )
    return ChatOptions(
        messages=messages,
        pictures=pictures,
        model=model,
        max_tokens=max_tokens,
        sampling=_sampling(body),
        seed=int_field(body, "seed", -(2**63), 2**63 - 1),
        stop=_stop(body.get("stop")),
        stream=stream,
        include_usage=include_usage,
        voice=voice,
        audio_format=audio_format,
        max_sentence_chars=max_sentence_chars,
        ignore_eos=ignore_eos,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel is not False,
        response_format=response_format,
        presence_penalty=optional(body, "presence_penalty", number, -2.0, 2.0) or 0.0,
        frequency_penalty=optional(body, "frequency_penalty", number, -2.0, 2.0) or 0.0,
        logit_bias=_logit_bias(body.get("logit_bias")),
        logprobs=_logprobs(body),
    )
