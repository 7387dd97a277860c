"""What the realtime state machine is configured with and what it returns: capabilities, limits, the session's
settings, server events, the commands a driver carries out, and usage."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np

from omni_stream.realtime.agent.audio import RATE
from omni_stream.realtime.agent.events import AudioFormat, Modality, SessionType, TranscriptionConfig, TurnDetection
from omni_stream.realtime.agent.truncation import Truncation
from omni_stream.realtime.common.socket_actions import Close
from omni_stream.requests import ChatMessage
from omni_stream.text.tools import AUTO, FunctionTool, ToolChoice
from omni_stream.turns.detector import TurnModelFactory
from omni_stream.turns.vad import VadFactory
from omni_stream.vision.limits import FrameLimits

__all__ = ["TurnModelFactory", "VadFactory"]  # the turns' own aliases, re-exported where sessions are configured


@dataclass(slots=True, frozen=True)
class Capabilities:
    """What the server can do for a session: loaded models, voices, and whether server VAD is available.

    ``voice``: the engine's voice lookup (:meth:`omni_stream.engine.AsyncEngine.voice`: the name as the model spells
    it, InvalidRequestError naming the voices there are otherwise); None: no speech model, any name is kept.
    ``language``: the transcription model's check of a language (InvalidRequestError when it does not know it);
    None: no transcription model.
    """

    model: str = "omni-stream"
    voice: Callable[[str], str] | None = None
    language: Callable[[str | None], None] | None = None  # the ASR model's check of a transcription language
    default_voice: str | None = None
    speech: bool = False
    text: bool = False
    transcription: bool = False
    vad: bool = False  # server_vad: a voice activity detector
    semantic: bool = False  # semantic_vad: an end-of-turn model beside the detector
    output_rate: int = RATE  # the speech model's sample rate (Hz)
    sees: bool = False  # the text model takes images (input_image content)


@dataclass(slots=True, frozen=True)
class Limits:
    """Sizes in bytes, durations in seconds unless named ``_ms``."""

    max_append_bytes: int = 15 * 1024 * 1024
    max_buffer_seconds: float = 300.0
    max_items: int = 256
    max_instructions: int = 32_768
    session_seconds: float = 3600.0
    vad_lookback_ms: int = 2000  # kept before the detector's report of a start (it reports late)
    frames: FrameLimits = field(default_factory=FrameLimits)  # input_image content: bytes, pixels, resolution


@dataclass(slots=True, frozen=True)
class SessionConfig:
    type: SessionType
    instructions: str
    modality: Modality
    voice: str | None
    input_format: AudioFormat = AudioFormat.PCM
    output_format: AudioFormat = AudioFormat.PCM
    turn_detection: TurnDetection | None = None
    transcription: TranscriptionConfig | None = None
    max_output_tokens: int | None = None  # None: "inf"
    preemptive_response: bool = True  # extension: answers may start at a pause, before the turn is committed
    truncation: Truncation = field(default_factory=Truncation)  # what a prompt keeps when it outgrows the context
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = AUTO


# --- outputs ------------------------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class ServerEvent:
    """One server event: ``type``, ``event_id`` and JSON fields; audio deltas carry raw wire ``audio`` bytes that
    become the base64 ``delta`` when the event is serialized (so a transport may use the bytes directly)."""

    type: str
    event_id: str
    body: dict[str, Any]
    audio: bytes | None = None

    def wire(self) -> dict[str, Any]:
        """The JSON object (without the base64 of ``audio``: see :func:`to_json_dict`)."""
        return {"type": self.type, "event_id": self.event_id, **self.body}


@dataclass(slots=True, frozen=True)
class Transcribe:
    """Transcribe ``samples`` (int16 at 24 kHz) of an item's content part; ``speculative``: the turn so far, at a
    pause (``item_id`` is the speculation's, not an item's)."""

    item_id: str
    content_index: int
    samples: np.ndarray
    language: str | None = None
    prompt: str | None = None
    speculative: bool = False


@dataclass(slots=True, frozen=True)
class ConfigureTurns:
    """Turn detection from now on: a detector for ``turn_detection`` (None: none), its stream starting at
    ``position``; its events carry ``epoch`` back (events of an older epoch are stale)."""

    turn_detection: TurnDetection | None
    epoch: int
    position: int


@dataclass(slots=True, frozen=True)
class DetectTurns:
    """Feed the turn detector ``samples`` (int16 at 24 kHz) that start at stream ``position``."""

    samples: np.ndarray
    position: int
    epoch: int


@dataclass(slots=True, frozen=True)
class CancelTranscription:
    item_id: str


@dataclass(slots=True, frozen=True)
class StartResponse:
    """Generate a reply to ``messages``: spoken in ``voice`` (``speak``) or text only; ``tools`` offered under
    ``tool_choice`` (the reply's calls come back through ``response_tool_call``)."""

    response_id: str
    messages: tuple[ChatMessage, ...]
    speak: bool
    voice: str | None
    max_tokens: int | None
    preemptive: bool = False  # started before its turn was committed: hold every output until it is adopted
    truncation: Truncation = field(default_factory=Truncation)  # the driver fits the messages to the context
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = AUTO

    def same_work(self, other: StartResponse) -> bool:
        """Whether ``other`` asks the models for exactly the same reply (ids aside)."""
        mine = (self.messages, self.speak, self.voice, self.max_tokens, self.truncation, self.tools, self.tool_choice)
        return mine == (
            other.messages,
            other.speak,
            other.voice,
            other.max_tokens,
            other.truncation,
            other.tools,
            other.tool_choice,
        )


@dataclass(slots=True, frozen=True)
class AdoptResponse:
    """The preemptive response ``preemptive_id`` is response ``response_id`` now: release its held outputs."""

    preemptive_id: str
    response_id: str


@dataclass(slots=True, frozen=True)
class CancelResponse:
    """Stop the response's generation now (its model slots back before the next step) and drop its audio."""

    response_id: str


Command: TypeAlias = (
    Transcribe
    | CancelTranscription
    | StartResponse
    | AdoptResponse
    | CancelResponse
    | Close  # the session closes with a code: the one close action every socket's protocol core asks for
    | ConfigureTurns
    | DetectTurns
)


@dataclass(slots=True)
class Outputs:
    events: list[ServerEvent] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)

    def extend(self, other: Outputs) -> Outputs:
        self.events += other.events
        self.commands += other.commands
        return self


@dataclass(slots=True, frozen=True)
class ResponseUsage:
    """Tokens of one response: text in (prompt), text out (LLM), audio out (codec frames)."""

    input_text_tokens: int = 0
    output_text_tokens: int = 0
    output_audio_tokens: int = 0

    def wire(self) -> dict[str, Any]:
        out = self.output_text_tokens + self.output_audio_tokens
        return {
            "total_tokens": self.input_text_tokens + out,
            "input_tokens": self.input_text_tokens,
            "output_tokens": out,
            "input_token_details": {"text_tokens": self.input_text_tokens, "audio_tokens": 0, "cached_tokens": 0},
            "output_token_details": {"text_tokens": self.output_text_tokens, "audio_tokens": self.output_audio_tokens},
        }
