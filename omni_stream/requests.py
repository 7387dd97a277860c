"""Request types, sampling parameters and the per-request context (deadline, cancellation, timings)."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

import numpy as np

from omni_stream.chunks import TextDelta
from omni_stream.codecs.resample import MAX_RATE
from omni_stream.errors import InvalidRequestError
from omni_stream.speech.limits import check_instructions, check_max_new_tokens, check_text
from omni_stream.speech.text_split import Granularity
from omni_stream.text.tools import AUTO, TEXT_FORMAT, FunctionTool, ResponseFormat, ToolCall, ToolChoice, ToolMode
from omni_stream.validation.fields import check_seed, flag, instance, member, optional_text, real, whole

_ids = itertools.count(1)


def next_request_id(prefix: str = "req") -> str:
    """Process-unique, deterministic-order request id."""
    return f"{prefix}-{next(_ids)}"


class TaskType(StrEnum):
    CUSTOM_VOICE = "CustomVoice"
    VOICE_DESIGN = "VoiceDesign"
    BASE = "Base"


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """Sampling for one AR head. ``do_sample=False`` is greedy. ``top_k=0`` and ``top_p=1.0`` disable those filters."""

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "do_sample", flag(self.do_sample, "do_sample"))
        for name in ("temperature", "top_p", "repetition_penalty"):
            object.__setattr__(self, name, real(getattr(self, name), name))
        object.__setattr__(self, "top_k", whole(self.top_k, "top_k", low=0, high=MAX_TOP_K))
        if self.temperature <= 0:
            raise InvalidRequestError(f"temperature must be > 0, got {self.temperature}", "temperature")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if self.repetition_penalty <= 0:
            raise InvalidRequestError(
                f"repetition_penalty must be > 0, got {self.repetition_penalty}", "repetition_penalty"
            )


MAX_TOP_K = 2**31 - 1  # a kernel's int32; any vocabulary is smaller


GREEDY = SamplingParams(do_sample=False, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0)


@dataclass(slots=True, frozen=True)
class VoicePrompt:
    """A reusable cloning prompt extracted once per voice (Base models).

    ``x_vector`` is the speaker embedding (float32 ``[hidden]``); ``ref_codes`` the reference audio's codec
    codes (int64 ``[n_frames, n_codebooks]``) or None for x-vector-only cloning; ``ref_text`` its transcript.
    """

    x_vector: np.ndarray
    ref_codes: np.ndarray | None = None
    ref_text: str | None = None


@dataclass(slots=True, frozen=True)
class SpeechRequest:
    """One text-to-speech request, as the Python API, HTTP and WebSocket layers all build it.

    Units: ``max_new_tokens`` in codec frames (80 ms each for 12 Hz models; None: the frame budget of the
    text, :func:`omni_stream.speech.limits.frame_budget`); ``ref_audio`` float32 mono at ``ref_sample_rate`` Hz;
    ``initial_codec_chunk_frames`` frames in the first audio chunk (None = model default). ``voice`` None: the
    model's default voice. ``options``: the family's own options, an instance of its ``SpeechInfo.options``
    type (Qwen3-TTS: the code predictor's sampler, the prompt layout); None: its defaults; a family that takes none
    refuses them. Bounds: :mod:`omni_stream.speech.limits`.

    ``text`` may stream: an async iterator of :class:`TextDelta` (an LLM's output, a realtime session's text) is
    split into sentences, each synthesized as its own request while the previous one plays (``split``).
    """

    text: str | AsyncIterator[TextDelta]
    voice: str | None = None
    task_type: TaskType | None = None  # None: the checkpoint's own task
    language: str = "Auto"
    instructions: str | None = None
    # Cloning (Base): either raw reference audio, or a prompt extracted earlier (uploaded voices).
    ref_audio: np.ndarray | None = None
    ref_sample_rate: int = 24000
    ref_text: str | None = None
    x_vector_only_mode: bool = False
    voice_prompt: VoicePrompt | None = None
    # Generation. Sampling None: the checkpoint's own defaults (generation_config.json).
    max_new_tokens: int | None = None
    sampling: SamplingParams | None = None
    seed: int | None = None
    # What only the family understands (its SpeechInfo.options type), checked by the engine
    options: object | None = None
    # Streaming
    initial_codec_chunk_frames: int | None = None
    # Benchmarks only: never stop on EOS, always generate max_new_tokens frames.
    ignore_eos: bool = False
    request_id: str = field(default_factory=next_request_id)

    # Streamed text only: where units end ("sentence" | "clause" | "none": the whole stream is one unit).
    split: str = "sentence"

    def __post_init__(self) -> None:
        if isinstance(self.text, str):
            check_text(self.text)
        elif not hasattr(self.text, "__aiter__"):
            raise InvalidRequestError("input must be a string or an async iterator of TextDelta", "input")
        _check_spoken_fields(self)
        if self.task_type is not None:
            object.__setattr__(self, "task_type", member(self.task_type, TaskType, "task_type"))
        check_instructions(self.instructions)
        optional_text(self.ref_text, "ref_text")
        if self.ref_audio is not None:
            instance(self.ref_audio, np.ndarray, "ref_audio")
        rate = whole(self.ref_sample_rate, "ref_sample_rate", low=1, high=MAX_RATE)
        object.__setattr__(self, "ref_sample_rate", rate)
        if self.voice_prompt is not None:
            instance(self.voice_prompt, VoicePrompt, "voice_prompt")
        object.__setattr__(self, "max_new_tokens", check_max_new_tokens(self.max_new_tokens))
        if self.sampling is not None:
            instance(self.sampling, SamplingParams, "sampling")
        for name in ("x_vector_only_mode", "ignore_eos"):
            object.__setattr__(self, name, flag(getattr(self, name), name))

    @property
    def streamed(self) -> bool:
        """True when ``text`` is an async iterator of deltas rather than a string."""
        return not isinstance(self.text, str)

    def for_text(self, text: str, request_id: str) -> SpeechRequest:
        """This request's settings for one unit of (streamed) text."""
        return replace(self, text=text, request_id=request_id)


def _check_spoken_fields(request: SpeechRequest | SpokenReply) -> None:
    """The speech fields a SpeechRequest and a SpokenReply share, each read once (numpy numbers as Python's)."""
    for name in ("voice", "instructions"):
        optional_text(getattr(request, name), name)
    if request.language is None:  # what resolve_language reads as Auto
        object.__setattr__(request, "language", "Auto")
    optional_text(request.language, "language")
    object.__setattr__(request, "seed", check_seed(request.seed))
    if request.initial_codec_chunk_frames is not None:
        frames = whole(request.initial_codec_chunk_frames, "initial_codec_chunk_frames", low=1)
        object.__setattr__(request, "initial_codec_chunk_frames", frames)
    object.__setattr__(request, "split", member(request.split, Granularity, "split").value)


class Role(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"  # a tool's result, answering the assistant's call ``tool_call_id``


@dataclass(slots=True, frozen=True)
class ChatMessage:
    """One turn of a conversation (text content); an assistant turn may carry ``tool_calls``, a tool turn answers
    the call ``tool_call_id``. A user turn may show ``images`` (decoded uint8 RGB ``(h, w, 3)`` arrays, as
    :class:`~omni_stream.images.spec.ImageRequest` takes them), which come before its text; only a model that
    sees takes them (the engine refuses them for the others)."""

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    images: tuple[np.ndarray, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.role, Role):
            try:
                object.__setattr__(self, "role", Role(self.role))
            except ValueError:
                roles = ", ".join(r.value for r in Role)
                raise InvalidRequestError(f"unknown role {self.role!r} (one of: {roles})", "messages") from None
        if not isinstance(self.content, str):
            raise InvalidRequestError("message content must be a string", "messages")
        if self.tool_calls and self.role is not Role.ASSISTANT:
            raise InvalidRequestError("only assistant messages carry tool calls", "messages")
        if (self.role is Role.TOOL) != (self.tool_call_id is not None):
            raise InvalidRequestError("a tool message answers one call: it needs tool_call_id, and only it", "messages")
        if not isinstance(self.images, tuple):
            object.__setattr__(self, "images", tuple(self.images))
        if self.images and self.role is not Role.USER:
            raise InvalidRequestError("only user messages show images", "messages")
        for image in self.images:
            if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3 or 0 in image.shape:
                raise InvalidRequestError("a message's images must be non-empty uint8 RGB arrays (h, w, 3)", "messages")

    def template(self) -> dict[str, object]:
        """The message as chat templates (and OpenAI's wire) take it: with images, the content is a list of parts,
        one ``{"type": "image"}`` per image, then the text (the shape multimodal chat templates read)."""
        content: object = self.content
        if self.images:
            content = [{"type": "image"} for _ in self.images] + [{"type": "text", "text": self.content}]
        out: dict[str, object] = {"role": self.role.value, "content": content}
        if self.tool_calls:
            out["tool_calls"] = [c.template() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


@dataclass(slots=True, frozen=True)
class TextRequest:
    """One text-generation request: ``messages`` through the model's chat template, or a raw ``prompt``.

    ``max_tokens`` None: up to the model's context. ``sampling`` None: the model's defaults. ``stop``: strings that
    end the generation (not included in the text). ``ignore_eos``: benchmarks only, always ``max_tokens`` tokens.

    Tools (:mod:`omni_stream.text.tools`): ``tools`` are offered through the chat template unless ``tool_choice``
    is ``none``; the reply's calls arrive in ``TextDelta.tool_calls`` (finish reason ``"tool_calls"``);
    ``required`` or a named function, and a JSON ``response_format``, are enforced by constrained decoding where
    the backend is ours. ``parallel_tool_calls`` False: at most one call.

    Logits (OpenAI's semantics, over the generated tokens): ``presence_penalty`` and ``frequency_penalty`` in
    -2..2, ``logit_bias`` (token id, -100..100) pairs added to the logits; ``logprobs`` None: none, else each
    token's log-probability and that many (0-20) most likely alternatives in ``TextDelta.logprobs``.
    """

    messages: tuple[ChatMessage, ...] = ()
    prompt: str | None = None
    max_tokens: int | None = None
    sampling: SamplingParams | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = AUTO
    parallel_tool_calls: bool = True
    response_format: ResponseFormat = TEXT_FORMAT
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None
    request_id: str = field(default_factory=next_request_id)

    def __post_init__(self) -> None:
        if not isinstance(self.messages, tuple):
            object.__setattr__(self, "messages", tuple(self.messages))
        for message in self.messages:
            instance(message, ChatMessage, "messages")
        optional_text(self.prompt, "prompt")
        if isinstance(self.stop, str):  # OpenAI's ``stop`` may be one string
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop))
        if self.max_tokens is not None:
            object.__setattr__(self, "max_tokens", whole(self.max_tokens, "max_tokens"))
        if self.sampling is not None:
            instance(self.sampling, SamplingParams, "sampling")
        object.__setattr__(self, "seed", check_seed(self.seed))
        if not isinstance(self.tools, tuple):
            object.__setattr__(self, "tools", tuple(self.tools))
        for tool in self.tools:
            instance(tool, FunctionTool, "tools")
        if isinstance(self.tool_choice, str):  # "auto", "none", "required"
            object.__setattr__(self, "tool_choice", ToolChoice(member(self.tool_choice, ToolMode, "tool_choice")))
        instance(self.tool_choice, ToolChoice, "tool_choice")
        instance(self.response_format, ResponseFormat, "response_format")
        for name in ("presence_penalty", "frequency_penalty"):
            object.__setattr__(self, name, real(getattr(self, name), name))
        if self.logprobs is not None:
            object.__setattr__(self, "logprobs", whole(self.logprobs, "top_logprobs"))
        for name in ("ignore_eos", "parallel_tool_calls"):
            object.__setattr__(self, name, flag(getattr(self, name), name))
        self._check_tools()
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise InvalidRequestError(f"{name} must be between -2 and 2, got {value}", name)
        pairs = self.logit_bias.items() if isinstance(self.logit_bias, Mapping) else self.logit_bias
        pairs = tuple((whole(t, "logit_bias"), real(b, "logit_bias")) for t, b in pairs)
        object.__setattr__(self, "logit_bias", pairs)
        for token, bias in self.logit_bias:
            if token < 0 or not -100.0 <= bias <= 100.0:
                raise InvalidRequestError(
                    f"logit_bias maps token ids (>= 0) to -100..100, got {token}: {bias}", "logit_bias"
                )
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise InvalidRequestError(f"top_logprobs must be in 0..20, got {self.logprobs}", "top_logprobs")
        if (self.prompt is None) == (not self.messages):
            raise InvalidRequestError("give either messages or a prompt", "messages")
        if self.prompt is not None and not self.prompt:
            raise InvalidRequestError("prompt must be a non-empty string", "prompt")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be >= 1, got {self.max_tokens}", "max_tokens")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError("stop must hold non-empty strings", "stop")

    def _check_tools(self) -> None:
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise InvalidRequestError("tool names must be unique", "tools")
        choice = self.tool_choice
        if choice.mode is not ToolMode.AUTO and choice.mode is not ToolMode.NONE and not self.tools:
            raise InvalidRequestError(f"tool_choice {choice.mode.value!r} needs tools", "tool_choice")
        if choice.name is not None and choice.name not in names:
            raise InvalidRequestError(
                f"tool_choice names {choice.name!r}, which is not among the tools ({', '.join(names)})", "tool_choice"
            )

    @property
    def offered_tools(self) -> tuple[FunctionTool, ...]:
        """The tools the model sees (none under ``tool_choice: none``)."""
        return () if self.tool_choice.mode is ToolMode.NONE else self.tools


@dataclass(slots=True, frozen=True)
class SpokenReply:
    """How generated text is spoken: the speech fields every sentence of it gets (None: the model's default)."""

    voice: str | None = None
    language: str = "Auto"
    instructions: str | None = None
    seed: int | None = None
    initial_codec_chunk_frames: int | None = None
    split: str = "sentence"
    first_clause: bool = False  # the first unit ends at the first clause (``,;``): first audio sooner
    with_text: bool = True  # the consumer also gets the text model's deltas (else only transcripts and audio)
    # A unit longer than this many characters is cut (at a sentence end, else a space) before it is spoken; None:
    # the speech model's own limit. Lower it to bound the wait for the first audio when sentences run long.
    max_unit_chars: int | None = None
    # Benchmarks only (a server's benchmark fields): the first unit ends after this many of the text model's deltas
    # (tokens) at the latest. A random-weight model writes no clause boundary and few spaces, so its first unit
    # would be its whole reply; a real one's first clause ("Sure, ...") comes within a few tokens.
    first_unit_tokens: int | None = None
    # Set by the engine (omni_stream.validation.text.resolve_chat): the speech fields resolved once for the whole
    # reply (voice, language, task), which every unit's request copies.
    template: SpeechRequest | None = None

    def __post_init__(self) -> None:
        _check_spoken_fields(self)
        for name in ("first_clause", "with_text"):
            object.__setattr__(self, name, flag(getattr(self, name), name))
        for name in ("max_unit_chars", "first_unit_tokens"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, whole(getattr(self, name), name, low=1))

    def request(self, text: str, request_id: str) -> SpeechRequest:
        """The speech request for one unit of text."""
        if self.template is not None:
            return self.template.for_text(text, request_id)
        fields: dict = {"text": text, "request_id": request_id, "language": self.language}
        for name in ("voice", "instructions", "seed", "initial_codec_chunk_frames"):
            if getattr(self, name) is not None:
                fields[name] = getattr(self, name)
        return SpeechRequest(**fields)


@dataclass(slots=True, frozen=True)
class ChatRequest:
    """A chat turn; with ``speech`` its text is also spoken (LLM -> TTS), each sentence while the last one plays."""

    text: TextRequest
    speech: SpokenReply | None = None

    def __post_init__(self) -> None:
        instance(self.text, TextRequest, "text")
        if self.speech is not None:
            instance(self.speech, SpokenReply, "speech")

    @property
    def request_id(self) -> str:
        return self.text.request_id


@dataclass(slots=True)
class Timings:
    """Per-request timing record, monotonic seconds (``time.perf_counter``)."""

    created: float = field(default_factory=time.perf_counter)
    admitted: float | None = None
    first_output: float | None = None  # the first chunk of any kind (a text delta, say)
    first_chunk: float | None = None  # the first audio chunk
    # when the request's first output went to a downstream model whose audio the listener waits for (the first
    # spoken unit of an answer, to the speech model): its own model is needed again only as that audio plays
    handed_off: float | None = None
    finished: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    chunk_durations: list[float] = field(default_factory=list)  # seconds of audio per chunk
    steps: int = 0

    def record_chunk(self, audio_seconds: float, now: float | None = None) -> None:
        now = time.perf_counter() if now is None else now
        if self.first_chunk is None:
            self.first_chunk = now
        self.chunk_times.append(now)
        self.chunk_durations.append(audio_seconds)

    @property
    def ttfa(self) -> float | None:
        """Seconds from creation to the first chunk."""
        return None if self.first_chunk is None else self.first_chunk - self.created

    @property
    def audio_seconds(self) -> float:
        return float(sum(self.chunk_durations))


class RequestState(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    PAUSED = "paused"
    FINISHED = "finished"
    ABORTED = "aborted"
