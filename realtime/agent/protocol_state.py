"""The realtime protocol's state and what every part of it shares: session ids, server events, the response in
progress, and the steps one part of the protocol takes in another (see :mod:`omni_stream.realtime.agent.protocol`).
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import numpy as np

from omni_stream.realtime.agent.audio import RATE, InputDecoder, OutputEncoder
from omni_stream.realtime.agent.buffer import InputBuffer
from omni_stream.realtime.agent.events import (
    AudioFormat,
    Modality,
    RealtimeError,
    ResponseCreate,
    SessionType,
    TurnDetection,
)
from omni_stream.realtime.agent.items import Content, Conversation, Item
from omni_stream.realtime.agent.outputs import (
    Capabilities,
    Limits,
    Outputs,
    ServerEvent,
    SessionConfig,
    StartResponse,
)
from omni_stream.requests import ChatMessage
from omni_stream.text.tools import AUTO, FunctionTool, ToolChoice

DEFAULT_INSTRUCTIONS = "You are a helpful voice assistant. Answer briefly."


class Phase(StrEnum):
    OPEN = "open"
    CLOSED = "closed"  # expired or ended: every input is ignored


class ResponseStatus(StrEnum):
    WAITING = "waiting"  # for transcripts of the items it answers
    RUNNING = "running"
    DONE = "done"


@dataclass(slots=True)
class Speculation:
    """A transcription of the turn so far, started at a pause (stream positions ``start``..``end``), kept from the
    client: it becomes the turn's transcription if the turn ends at that pause, else it is dropped."""

    id: str  # the transcription's item id for the driver (never an item of the conversation)
    start: int
    end: int
    parts: list[str] = field(default_factory=list)
    done: bool = False
    usage: tuple[int, int] = (0, 0)  # audio tokens in, text tokens out
    failed: str | None = None


@dataclass(slots=True)
class ResponseState:
    id: str
    item: Item
    modality: Modality
    voice: str | None
    format: AudioFormat
    max_tokens: int | None
    instructions: str
    metadata: dict[str, str] | None
    encoder: OutputEncoder | None
    waiting: set[tuple[str, int]]
    status: ResponseStatus = ResponseStatus.WAITING
    samples: int = 0  # model-rate samples sent
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = AUTO
    out_of_band: bool = False  # not part of the conversation (response.conversation "none")
    context: list[ChatMessage] | None = None  # its own input (None: the conversation)
    calls: dict[int, list[str]] = field(default_factory=dict)  # index -> [call id, name, arguments so far]
    call_items: list[Item] = field(default_factory=list)  # the function_call items, once the reply has ended
    opened: bool = False  # its message item announced (at its first content, or at its end when it has no call)

    @property
    def content(self) -> Content:
        return self.item.content[0]


def samples_ms(samples: int, rate: int = RATE) -> int:
    """Whole milliseconds of ``samples`` at ``rate`` Hz (default: the wire rate, 24 kHz)."""
    return samples * 1000 // rate


def session_ids() -> Callable[[str], str]:
    """Ids ``prefix_<session token><n>`` (unique per process run and session)."""
    token = secrets.token_hex(6)
    counter = itertools.count(1)
    return lambda prefix: f"{prefix}_{token}{next(counter)}"


class ProtocolState:
    """One realtime session's state; the protocol's parts (turns, items, responses) are mixins over it."""

    def __init__(
        self,
        caps: Capabilities,
        limits: Limits | None = None,
        *,
        created_at: float = 0.0,
        ids: Callable[[str], str] | None = None,
        session_type: SessionType = SessionType.REALTIME,
    ) -> None:
        self.caps = replace(caps, semantic=caps.semantic and caps.vad)
        self.limits = limits or Limits()
        self._id = ids or session_ids()
        self._event_ids = itertools.count(1)
        self.session_id = self._id("sess")
        self.conversation_id = self._id("conv")
        self.expires_at = int(created_at + self.limits.session_seconds)
        self.phase = Phase.OPEN
        self.config = SessionConfig(
            type=session_type,
            instructions=DEFAULT_INSTRUCTIONS,
            modality=Modality.AUDIO if caps.speech else Modality.TEXT,
            voice=caps.default_voice,
            turn_detection=TurnDetection() if self.caps.vad else None,
        )
        self.conversation = Conversation(self.limits.max_items, self.limits.frames.max_conversation_pictures)
        self.buffer = InputBuffer()
        self.decoder = InputDecoder(self.config.input_format)
        self.turn_epoch = 0  # bumped whenever the driver's turn detector restarts; older turn events are stale
        self._heard = 0  # stream position up to which the turn detector has reported
        self._speech_start: int | None = None  # stream position where the current turn's audio begins
        self._turn_item: str | None = None  # id the current turn's item will get
        self.pending: dict[tuple[str, int], list[str]] = {}  # transcriptions in flight: partial texts
        self.speculation: Speculation | None = None  # the open pause's speculative transcription
        self.adopted: dict[str, str] = {}  # speculations in flight that became a committed item's: spec id -> item id
        self.preempt: StartResponse | None = None  # a response started on the open speculation, held by the driver
        self.response: ResponseState | None = None

    def _event(self, type: str, audio: bytes | None = None, **body: Any) -> ServerEvent:
        return ServerEvent(type, f"event_{next(self._event_ids)}", body, audio)

    def _error(self, exc: RealtimeError) -> ServerEvent:
        error = {"type": exc.type, "code": exc.code, "message": exc.message, "param": exc.param}
        return self._event("error", error={**error, "event_id": exc.event_id})

    # --- steps one part takes in another (each defined once, by the part named) ---

    def _add_item(self, item: Item, after: str | None) -> Outputs:  # realtime_item_edits
        raise NotImplementedError

    def _transcribe(self, item: Item, index: int, samples: np.ndarray) -> Outputs:  # realtime_turns
        raise NotImplementedError

    def _drop_speculation(self) -> Outputs:  # realtime_speculation
        raise NotImplementedError

    def _drop_preempt(self) -> Outputs:  # realtime_speculation
        raise NotImplementedError

    def _preempt(self, spec: Speculation) -> Outputs:  # realtime_speculation
        raise NotImplementedError

    def _speech_paused(self, position: int) -> Outputs:  # realtime_speculation
        raise NotImplementedError

    def _speculation_for(self, start: int, end: int) -> Speculation | None:  # realtime_speculation
        raise NotImplementedError

    def _adopt(self, spec: Speculation, item: Item) -> Outputs:  # realtime_speculation
        raise NotImplementedError

    def _speculative_result(self, item_id: str) -> Speculation | None:  # realtime_speculation
        raise NotImplementedError

    def transcription_delta(self, item_id: str, content_index: int, text: str) -> Outputs:  # realtime_turns
        raise NotImplementedError

    def transcription_done(
        self, item_id: str, content_index: int, audio_tokens: int, text_tokens: int
    ) -> Outputs:  # realtime_turns
        raise NotImplementedError

    def transcription_failed(self, item_id: str, content_index: int, message: str) -> Outputs:  # realtime_turns
        raise NotImplementedError

    def _check_voice(self, voice: str, param: str) -> str:  # realtime_protocol
        raise NotImplementedError

    def _response_settings(self, event: ResponseCreate | None) -> dict[str, Any]:  # realtime_responses
        raise NotImplementedError

    def _reply_command(
        self, rid: str, messages: list[ChatMessage], settings: dict[str, Any], *, preemptive: bool = False
    ) -> StartResponse:  # realtime_responses
        raise NotImplementedError

    def _start_response(self, rid: str, settings: dict[str, Any]) -> Outputs:  # realtime_responses
        raise NotImplementedError

    def _resolve(self, key: tuple[str, int]) -> Outputs:  # realtime_responses
        raise NotImplementedError

    def _cancel(self, reason: str) -> Outputs:  # realtime_responses
        raise NotImplementedError

    def _check_tool_choice(self, tools: tuple[FunctionTool, ...], choice: ToolChoice, param: str) -> None:  # protocol
        raise NotImplementedError
