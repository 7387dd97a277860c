"""The realtime session as a sans-I/O state machine: client events and engine results in, server events and
commands out.

``RealtimeProtocol.receive(event)`` applies one typed client event (:mod:`omni_stream.realtime.agent.events`)
and returns :class:`Outputs`: the server events to send, in order, and the :class:`Command` objects the driver
must carry out (start a transcription, start or cancel a response, feed the turn detector, close). The driver
reports back through ``turn_event``, ``transcription_*`` and ``response_*`` methods, which return outputs too.
Nothing here awaits, sends, reads or runs a model: every call is cheap enough for the event loop (the driver
decodes large appends off it), and the driver serializes the calls (one at a time, outputs handled in order).

Turns. With ``server_vad`` or ``semantic_vad`` the driver's turn detector hears the buffer as it arrives
(:mod:`.turns`); ``speech_started`` cancels a response in progress (barge-in, when ``interrupt_response``) and
the end of the turn commits it: a user item, its transcription, and (``create_response``) a response that
starts once the transcripts it depends on are in. With ``turn_detection: null`` the client commits and asks for
responses itself. A cancelled response's assistant item keeps the audio sent so far and the transcript of the
units whose audio began.

Limits: the input buffer holds at most ``Limits.max_buffer_seconds`` (more is refused with
``input_audio_buffer_overflow``, never silently dropped); while nobody speaks under server VAD only the last
``prefix_padding_ms + vad_lookback_ms`` are kept.

Modules. This one holds the session: its configuration, the dispatch of client events and its end; the parts
are mixins over :class:`~omni_stream.realtime.agent.protocol_state.ProtocolState`: input audio, turns and
transcriptions (:mod:`.turns`), speculative work at pauses (:mod:`.speculation`), conversation items
(:mod:`.item_edits`) and responses (:mod:`.responses`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from omni_stream.errors import InvalidRequestError, UnknownVoiceError
from omni_stream.realtime.agent.audio import InputDecoder
from omni_stream.realtime.agent.events import (
    UNSET,
    ClientEvent,
    InputAudioAppend,
    InputAudioClear,
    InputAudioCommit,
    ItemCreate,
    ItemDelete,
    ItemRetrieve,
    ItemTruncate,
    Modality,
    OutputAudioClear,
    RealtimeError,
    ResponseCancel,
    ResponseCreate,
    SessionPatch,
    SessionType,
    SessionUpdate,
)
from omni_stream.realtime.agent.item_edits import ItemEditing
from omni_stream.realtime.agent.outputs import Close, Outputs, SessionConfig
from omni_stream.realtime.agent.protocol_state import Phase
from omni_stream.realtime.agent.responses import Responding
from omni_stream.realtime.agent.speculation import Speculating
from omni_stream.realtime.agent.turns import TurnTaking
from omni_stream.realtime.common.close_codes import CloseCode
from omni_stream.text.grammar import schema_error
from omni_stream.text.tools import FunctionTool, ToolChoice, ToolMode
from omni_stream.turns.rules import TurnType

SHUTDOWN_MESSAGE = "the server is shutting down"


def check_tool_choice(tools: tuple[FunctionTool, ...], choice: ToolChoice, param: str) -> None:
    """A forced choice needs tools, a named one a tool of that name, and the parameters of the tools it may call
    must be schemas constrained decoding can enforce (refused now, with an ``error`` event, not when the reply runs)."""
    if choice.forces_call and not tools:
        raise RealtimeError("invalid_value", f"tool_choice {choice.mode.value!r} needs tools", param)
    if choice.name is not None and choice.name not in {t.name for t in tools}:
        raise RealtimeError("invalid_value", f"tool_choice names {choice.name!r}, which is not among the tools", param)
    if choice.forces_call:
        where = param.rsplit(".", 1)[0]  # session.tool_choice -> session
        for i, tool in enumerate(tools):
            if choice.name in (None, tool.name) and (error := schema_error(tool.parameters)) is not None:
                message = f"the parameters of tool {tool.name!r} cannot be enforced: {error}"
                raise RealtimeError("invalid_value", message, f"{where}.tools[{i}].parameters")


def _tool_wire(tool: FunctionTool) -> dict[str, Any]:
    """A tool in the Realtime API's flat shape."""
    return {"type": "function", **tool.template()["function"]}


def _choice_wire(choice: ToolChoice) -> str | dict[str, Any]:
    return {"type": "function", "name": choice.name} if choice.mode is ToolMode.FUNCTION else choice.mode.value


# OpenAI's built-in voice names: a session or response naming one the speech model lacks speaks in its default voice
OPENAI_VOICES = frozenset(
    {"alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar", "fable", "onyx", "nova"}
)


class RealtimeProtocol(TurnTaking, Speculating, ItemEditing, Responding):
    """One realtime session's state (see the module docstring)."""

    def session_wire(self) -> dict[str, Any]:
        c = self.config
        audio_in: dict[str, Any] = {
            "format": c.input_format.wire(),
            "transcription": None if c.transcription is None else c.transcription.wire(),
            "noise_reduction": None,
            "turn_detection": None if c.turn_detection is None else c.turn_detection.wire(),
        }
        base = {"id": self.session_id, "object": "realtime.session", "expires_at": self.expires_at, "include": None}
        if c.type is SessionType.TRANSCRIPTION:
            return {**base, "type": "transcription", "audio": {"input": audio_in}}
        return {
            **base,
            "type": "realtime",
            "model": self.caps.model,
            "output_modalities": [c.modality.value],
            "instructions": c.instructions,
            "audio": {
                "input": audio_in,
                "output": {"format": c.output_format.wire(), "voice": c.voice, "speed": 1.0},
            },
            "tools": [_tool_wire(t) for t in c.tools],
            "tool_choice": _choice_wire(c.tool_choice),
            "max_output_tokens": "inf" if c.max_output_tokens is None else c.max_output_tokens,
            "tracing": None,
            "truncation": c.truncation.wire(),
            "prompt": None,
            "preemptive_response": c.preemptive_response,
        }

    def start(self) -> Outputs:
        """The events a new connection gets first, and the driver's turn detector."""
        out = self._restart_turns()
        out.events.extend(
            [
                self._event("session.created", session=self.session_wire()),
                self._event(
                    "conversation.created",
                    conversation={"id": self.conversation_id, "object": "realtime.conversation"},
                ),
            ]
        )
        return out

    # --- client events ---

    def receive(self, event: ClientEvent) -> Outputs:
        """Apply one client event; a refused one gives a single ``error`` event and changes nothing."""
        if self.phase is Phase.CLOSED:
            return Outputs()
        try:
            return self._dispatch(event)
        except RealtimeError as exc:
            if exc.event_id is None:
                exc.event_id = event.event_id
            return Outputs([self._error(exc)])

    def refuse(self, exc: RealtimeError) -> Outputs:
        """The ``error`` event for a message that did not parse."""
        return Outputs() if self.phase is Phase.CLOSED else Outputs([self._error(exc)])

    def _dispatch(self, event: ClientEvent) -> Outputs:
        if isinstance(event, InputAudioAppend):
            return self._append(event.audio)
        if isinstance(event, SessionUpdate):
            return self._update(event.patch)
        if isinstance(event, InputAudioCommit):
            return self._commit()
        if isinstance(event, InputAudioClear):
            out = self._clear_input()
            out.events.append(self._event("input_audio_buffer.cleared"))
            return out
        if isinstance(event, OutputAudioClear):
            out = Outputs()
            rid = self.response.id if self.response is not None else None
            if self.response is not None:
                out.extend(self._cancel("client_cancelled"))
            out.events.append(self._event("output_audio_buffer.cleared", response_id=rid))
            return out
        if isinstance(event, ItemCreate):
            return self._create_item(event)
        if isinstance(event, ItemDelete):
            return self._delete_item(event.item_id)
        if isinstance(event, ItemRetrieve):
            item = self._item(event.item_id)
            return Outputs([self._event("conversation.item.retrieved", item=item.wire())])
        if isinstance(event, ItemTruncate):
            return self._truncate(event)
        if isinstance(event, ResponseCreate):
            return self._create_response(event)
        if isinstance(event, ResponseCancel):
            if self.response is None:
                raise RealtimeError("response_cancel_not_active", "there is no response in progress to cancel")
            if event.response_id not in (None, self.response.id):
                running = self.response.id
                message = f"response {event.response_id!r} is not in progress (the one in progress is {running})"
                raise RealtimeError("response_cancel_not_active", message, "response_id")
            return self._cancel("client_cancelled")
        raise AssertionError(f"unhandled event {event!r}")  # pragma: no cover - the parser knows every type

    # --- session ---

    def _update(self, patch: SessionPatch) -> Outputs:
        c = self.config
        fields: dict[str, Any] = {
            name: value for name in SessionConfig.__slots__ if (value := getattr(patch, name, UNSET)) is not UNSET
        }
        if patch.output_modalities is not UNSET:
            fields["modality"] = patch.output_modalities
        new = replace(c, **fields)
        if new.type is not c.type and self.response is not None:
            raise RealtimeError(
                "invalid_value", "session.type cannot change while a response is in progress", "session.type"
            )
        if new.voice is not None and patch.voice is not UNSET:
            new = replace(new, voice=self._check_voice(new.voice, "session.audio.output.voice"))
        if patch.transcription is not UNSET and new.transcription is not None and self.caps.language is not None:
            try:  # refused now, not as a failed transcript of every later turn
                self.caps.language(new.transcription.language)
            except InvalidRequestError as exc:
                raise RealtimeError(
                    "invalid_value", exc.message, "session.audio.input.transcription.language"
                ) from None
        if new.turn_detection is not None and not self.caps.vad:
            raise RealtimeError(
                "invalid_value",
                "server_vad is not available on this server (no voice activity detector); set turn_detection to null "
                "and commit turns with input_audio_buffer.commit",
                "session.audio.input.turn_detection",
            )
        semantic = new.turn_detection is not None and new.turn_detection.type is TurnType.SEMANTIC_VAD
        if semantic and not self.caps.semantic:
            raise RealtimeError(
                "invalid_value",
                "semantic_vad is not available on this server (no end-of-turn model: install pipecat-ai and the "
                "[turn] extra); use server_vad",
                "session.audio.input.turn_detection.type",
            )
        check_tool_choice(new.tools, new.tool_choice, "session.tool_choice")
        if new.modality is Modality.AUDIO and not self.caps.speech and new.type is SessionType.REALTIME:
            raise RealtimeError(
                "invalid_value", "audio output needs a speech model, and none is loaded", "session.output_modalities"
            )
        self.config = new
        if new.input_format is not c.input_format:
            self.decoder = InputDecoder(new.input_format)
        out = self._restart_turns() if new.turn_detection != c.turn_detection else Outputs()
        out.events.append(self._event("session.updated", session=self.session_wire()))
        return out

    def _check_tool_choice(self, tools: tuple[FunctionTool, ...], choice: ToolChoice, param: str) -> None:
        check_tool_choice(tools, choice, param)

    def _check_voice(self, voice: str, param: str) -> str:
        if self.caps.voice is None:
            return voice
        try:
            return self.caps.voice(voice)  # the engine's rule and words
        except UnknownVoiceError as exc:
            if voice.lower() in OPENAI_VOICES and self.caps.default_voice is not None:
                # OpenAI's own voice names (the Agents SDK's default is "ash"): the speech model's default voice,
                # so an unchanged client's session.update is not refused whole for its voice alone
                return self.caps.default_voice
            raise RealtimeError("invalid_value", exc.message, param) from None
        except InvalidRequestError as exc:
            raise RealtimeError("invalid_value", exc.message, param) from None

    # --- the session's end ---

    def expire(self) -> Outputs:
        """The session reached ``Limits.session_seconds``: an error, then close."""
        if self.phase is Phase.CLOSED:
            return Outputs()
        out = self._cancel("client_cancelled") if self.response is not None else Outputs()
        seconds = self.limits.session_seconds
        exc = RealtimeError("session_expired", f"Your session hit the maximum duration of {seconds:g} seconds.")
        out.events.append(self._error(exc))
        out.commands.append(Close(CloseCode.NORMAL, "session expired"))
        self.close()
        return out

    def goodbye(self) -> Outputs:
        """What the session says last when the server shuts down under it: the running response fails
        (``server_shutdown``), then an ``error`` says why (the socket closes with 1001 next). Computed as the
        session ends, before :meth:`close`; sent only when the server, not the client, ended it."""
        out = Outputs()
        if self.response is not None:
            out.extend(self.response_failed(self.response.id, SHUTDOWN_MESSAGE, code="server_shutdown"))
        out.events.append(self._error(RealtimeError("server_shutdown", SHUTDOWN_MESSAGE, kind="server_error")))
        return out

    def close(self) -> None:
        """Forget every per-session state (buffer, detector, pending work); later inputs are ignored."""
        self.phase = Phase.CLOSED
        self.buffer.clear()
        self.pending.clear()
        self.speculation = None
        self.adopted.clear()
        self.preempt = None
        self.response = None
