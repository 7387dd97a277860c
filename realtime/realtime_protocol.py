"""The realtime session as a sans-I/O state machine: client events and engine results in, server events and
commands out.

``RealtimeProtocol.receive(event)`` applies one typed client event (:mod:`omni_stream.realtime.realtime_events`)
and returns :class:`Outputs`: the server events to send, in order, and the :class:`Command` objects the driver
must carry out (start a transcription, start or cancel a response, close). The driver reports back through
``transcription_*`` and ``response_*`` methods, which return outputs too. Nothing here awaits, sends or
reads; the voice activity detector is the one stateful computation it calls, so the driver runs ``receive``
of audio off the event loop and serializes every call (one at a time, outputs handled in order).

Turns. With ``server_vad`` the buffer is fed to the detector as it arrives; ``speech_started`` cancels a
response in progress (barge-in, when ``interrupt_response``) and ``speech_stopped`` commits the turn: a user
item, its transcription, and (``create_response``) a response that starts once the transcripts it depends on
are in. With ``turn_detection: null`` the client commits and asks for responses itself. A cancelled
response's assistant item keeps the audio sent so far and the transcript of the units whose audio began.

Limits: the input buffer holds at most ``Limits.max_buffer_seconds`` (more is refused with
``input_audio_buffer_overflow``, never silently dropped); while nobody speaks under server VAD only the last
``prefix_padding_ms + vad_lookback_ms`` are kept.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import numpy as np
from omni_stream.codecs.resample import Resampler
from omni_stream.realtime.realtime_audio import RATE, InputDecoder, OutputEncoder, decode_whole
from omni_stream.realtime.realtime_buffer import InputBuffer
from omni_stream.realtime.realtime_events import (
    UNSET,
    AudioFormat,
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
    PartType,
    RealtimeError,
    ResponseCancel,
    ResponseCreate,
    SessionPatch,
    SessionType,
    SessionUpdate,
    TurnDetection,
)
from omni_stream.realtime.realtime_items import Content, ContentType, Conversation, Item, ItemStatus, join_units
from omni_stream.realtime.realtime_outputs import (
    CancelResponse,
    CancelTranscription,
    Capabilities,
    CloseSession,
    Limits,
    Outputs,
    ResponseUsage,
    ServerEvent,
    SessionConfig,
    StartResponse,
    Transcribe,
    VadFactory,
)

from omni_stream.requests import ChatMessage, Role
from omni_stream.vad import VadEventKind, VoiceActivityDetector

DEFAULT_INSTRUCTIONS = "You are a helpful voice assistant. Answer briefly."
MIN_COMMIT_MS = 100  # a commit needs this much audio (OpenAI's rule)


class Phase(StrEnum):
    OPEN = "open"
    CLOSED = "closed"  # expired or ended: every input is ignored


class ResponseStatus(StrEnum):
    WAITING = "waiting"  # for transcripts of the items it answers
    RUNNING = "running"
    DONE = "done"


@dataclass(slots=True)
class _Response:
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

    @property
    def content(self) -> Content:
        return self.item.content[0]


def _ms(samples: int, rate: int = RATE) -> int:
    return samples * 1000 // rate


def _session_ids() -> Callable[[str], str]:
    """Ids ``prefix_<session token><n>`` (unique per process run and session)."""
    token = secrets.token_hex(6)
    counter = itertools.count(1)
    return lambda prefix: f"{prefix}_{token}{next(counter)}"


class RealtimeProtocol:
    """One realtime session's state (see the module docstring)."""

    def __init__(
        self,
        caps: Capabilities,
        limits: Limits | None = None,
        vad_factory: VadFactory | None = None,
        *,
        created_at: float = 0.0,
        ids: Callable[[str], str] | None = None,
        session_type: SessionType = SessionType.REALTIME,
    ) -> None:
        self.caps = replace(caps, vad=caps.vad and vad_factory is not None)
        self.limits = limits or Limits()
        self.vad_factory = vad_factory
        self._id = ids or _session_ids()
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
        self.conversation = Conversation(self.limits.max_items)
        self.buffer = InputBuffer()
        self.decoder = InputDecoder(self.config.input_format)
        self.vad: VoiceActivityDetector | None = None
        self._vad_resampler: Resampler | None = None
        self._vad_origin = 0  # stream position of the detector's sample 0
        self._speech_start: int | None = None  # stream position where the current turn's audio begins
        self._turn_item: str | None = None  # id the current turn's item will get
        self.pending: dict[tuple[str, int], list[str]] = {}  # transcriptions in flight: partial texts
        self.response: _Response | None = None

    # --- events ---

    def _event(self, type: str, audio: bytes | None = None, **body: Any) -> ServerEvent:
        return ServerEvent(type, f"event_{next(self._event_ids)}", body, audio)

    def _error(self, exc: RealtimeError) -> ServerEvent:
        error = {"type": exc.type, "code": exc.code, "message": exc.message, "param": exc.param}
        return self._event("error", error={**error, "event_id": exc.event_id})

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
            "tools": [],
            "tool_choice": "auto",
            "max_output_tokens": "inf" if c.max_output_tokens is None else c.max_output_tokens,
            "tracing": None,
            "truncation": "auto",
            "prompt": None,
        }

    def start(self) -> Outputs:
        """Open the detector (loading it may take a while: run this off the event loop) and return the events a
        new connection gets first."""
        self._open_vad()
        return Outputs(
            [
                self._event("session.created", session=self.session_wire()),
                self._event(
                    "conversation.created",
                    conversation={"id": self.conversation_id, "object": "realtime.conversation"},
                ),
            ]
        )

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
            self._clear_input()
            return Outputs([self._event("input_audio_buffer.cleared")])
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
            if self.response is None or event.response_id not in (None, self.response.id):
                raise RealtimeError("response_cancel_not_active", "there is no response in progress to cancel")
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
        if new.turn_detection is not None and not self.caps.vad:
            raise RealtimeError(
                "invalid_value",
                "server_vad is not available on this server (no voice activity detector); set turn_detection to null "
                "and commit turns with input_audio_buffer.commit",
                "session.audio.input.turn_detection",
            )
        if new.modality is Modality.AUDIO and not self.caps.speech and new.type is SessionType.REALTIME:
            raise RealtimeError(
                "invalid_value", "audio output needs a speech model, and none is loaded", "session.output_modalities"
            )
        self.config = new
        if new.input_format is not c.input_format:
            self.decoder = InputDecoder(new.input_format)
        if new.turn_detection != c.turn_detection:
            self._open_vad()
        return Outputs([self._event("session.updated", session=self.session_wire())])

    def _check_voice(self, voice: str, param: str) -> str:
        for known in self.caps.voices:
            if known.lower() == voice.lower():
                return known
        if not self.caps.voices:
            return voice
        raise RealtimeError(
            "invalid_value", f"unknown voice {voice!r} (available: {', '.join(self.caps.voices)})", param
        )

    # --- input audio and turns ---

    def _open_vad(self) -> None:
        td = self.config.turn_detection
        self.vad = None if td is None or self.vad_factory is None else self.vad_factory(td.vad)
        self._vad_resampler = None
        if self.vad is not None and self.vad.sample_rate != RATE:
            self._vad_resampler = Resampler(RATE, self.vad.sample_rate)
        self._vad_origin = self.buffer.end
        self._speech_start = None
        self._turn_item = None

    def _append(self, data: bytes) -> Outputs:
        self.decoder.check(data)
        limit = int(self.limits.max_buffer_seconds * RATE)
        if self.buffer.length + self.decoder.samples_for(len(data)) > limit:
            raise RealtimeError(
                "input_audio_buffer_overflow",
                f"the input audio buffer would pass {self.limits.max_buffer_seconds:g} s: commit or clear it first",
            )
        samples = self.decoder.decode(data)
        self.buffer.append(samples)
        if self.vad is None:
            return Outputs()
        out = Outputs()
        x = samples.astype(np.float32) / 32768.0
        if self._vad_resampler is not None:
            x = self._vad_resampler.process(x)
        rate = self.vad.sample_rate
        for vad_event in self.vad.feed(x):
            position = self._vad_origin + vad_event.sample * RATE // rate
            if vad_event.kind is VadEventKind.SPEECH_STARTED:
                out.extend(self._speech_started(position))
            elif self._speech_start is not None:
                out.extend(self._speech_stopped(position))
        if self._speech_start is None:  # nobody speaks: keep only what a late start report may still need
            assert self.config.turn_detection is not None
            keep = self.config.turn_detection.vad.prefix_padding_ms + self.limits.vad_lookback_ms
            self.buffer.drop_before(self.buffer.end - keep * RATE // 1000)
        return out

    def _speech_started(self, position: int) -> Outputs:
        td = self.config.turn_detection
        assert td is not None
        self._speech_start = max(self.buffer.start, position - td.vad.prefix_padding_ms * RATE // 1000)
        self.buffer.drop_before(self._speech_start)
        self._turn_item = self._id("item")
        out = Outputs(
            [self._event("input_audio_buffer.speech_started", audio_start_ms=_ms(position), item_id=self._turn_item)]
        )
        if self.response is not None and td.interrupt_response:
            out.extend(self._cancel("turn_detected"))
        return out

    def _speech_stopped(self, position: int) -> Outputs:
        td = self.config.turn_detection
        assert td is not None and self._turn_item is not None
        item_id = self._turn_item
        out = Outputs([self._event("input_audio_buffer.speech_stopped", audio_end_ms=_ms(position), item_id=item_id)])
        samples = self.buffer.take(max(0, position - self.buffer.start))
        self._speech_start, self._turn_item = None, None
        out.extend(self._commit_samples(samples, item_id))
        if td.create_response and self.config.type is SessionType.REALTIME and self.response is None:
            if self.caps.text:
                out.extend(self._start_response(self._id("resp"), self._response_settings(None)))
        return out

    def _commit(self) -> Outputs:
        if _ms(self.buffer.length) < MIN_COMMIT_MS:
            raise RealtimeError(
                "input_audio_buffer_commit_empty",
                f"Error committing input audio buffer: buffer too small. Expected at least {MIN_COMMIT_MS}ms of "
                f"audio, but buffer only has {self.buffer.length * 1000 / RATE:.2f}ms of audio.",
            )
        item_id = self._turn_item or self._id("item")
        samples = self.buffer.take(self.buffer.length)
        if self.vad is not None:
            self.vad.reset()
        self._vad_origin = self.buffer.end
        self._speech_start, self._turn_item = None, None
        return self._commit_samples(samples, item_id)

    def _commit_samples(self, samples: np.ndarray, item_id: str) -> Outputs:
        previous = self.conversation.last_id()
        item = Item(item_id, Role.USER, [Content(ContentType.INPUT_AUDIO, audio_ms=_ms(samples.size))])
        out = Outputs([self._event("input_audio_buffer.committed", item_id=item_id, previous_item_id=previous)])
        out.extend(self._add_item(item, None))
        out.extend(self._transcribe(item, 0, samples))
        return out

    def _clear_input(self) -> None:
        self.buffer.clear()
        if self.vad is not None:
            self.vad.reset()
        self._vad_origin = self.buffer.end
        self._speech_start, self._turn_item = None, None

    def _transcribe(self, item: Item, index: int, samples: np.ndarray) -> Outputs:
        if not self.caps.transcription:
            error = {
                "type": "invalid_request_error",
                "code": "transcription_unavailable",
                "message": "this server has no transcription model loaded",
                "param": None,
            }
            event = self._event(
                "conversation.item.input_audio_transcription.failed", item_id=item.id, content_index=index, error=error
            )
            return Outputs([event])
        self.pending[(item.id, index)] = []
        t = self.config.transcription
        lang, prompt = (t.language, t.prompt) if t is not None else (None, None)
        return Outputs(commands=[Transcribe(item.id, index, samples, lang, prompt)])

    # --- conversation items ---

    def _item(self, item_id: str) -> Item:
        item = self.conversation.get(item_id)
        if item is None:
            raise RealtimeError("invalid_value", f"no item with id {item_id!r} in the conversation", "item_id")
        return item

    def _add_item(self, item: Item, after: str | None) -> Outputs:
        out = Outputs()
        previous = self.conversation.last_id() if after is None else (None if after == "root" else after)
        for dropped in self.conversation.insert(item, after):
            out.extend(self._forget(dropped))
        wire = item.wire()
        out.events.append(self._event("conversation.item.added", previous_item_id=previous, item=wire))
        if item.status is ItemStatus.COMPLETED:
            out.events.append(self._event("conversation.item.done", previous_item_id=previous, item=wire))
        return out

    def _forget(self, item: Item) -> Outputs:
        """Events and commands for an item that left the conversation."""
        out = Outputs([self._event("conversation.item.deleted", item_id=item.id)])
        for key in [k for k in self.pending if k[0] == item.id]:
            del self.pending[key]
            out.commands.append(CancelTranscription(item.id))
        if self.response is not None:
            self.response.waiting = {k for k in self.response.waiting if k[0] != item.id}
        return out

    def _create_item(self, event: ItemCreate) -> Outputs:
        new = event.item
        if new.id is not None and new.id in self.conversation:
            raise RealtimeError("invalid_value", f"an item with id {new.id!r} exists already", "item.id")
        after = event.previous_item_id
        if after not in (None, "root") and after not in self.conversation:
            raise RealtimeError("invalid_value", f"no item with id {after!r} in the conversation", "previous_item_id")
        decoded: dict[int, np.ndarray] = {}
        content = []
        for i, part in enumerate(new.content):
            if part.type is PartType.INPUT_AUDIO:
                InputDecoder(self.config.input_format).check(part.audio, f"item.content[{i}].audio")
                decoded[i] = decode_whole(part.audio, self.config.input_format)
                transcript = part.transcript
                content.append(Content(ContentType.INPUT_AUDIO, transcript=transcript, audio_ms=_ms(decoded[i].size)))
            elif part.type is PartType.OUTPUT_TEXT:
                content.append(Content(ContentType.OUTPUT_TEXT, text=part.text))
            else:
                content.append(Content(ContentType.INPUT_TEXT, text=part.text))
        item = Item(new.id or self._id("item"), Role(new.role), content)
        out = self._add_item(item, after)
        for i, samples in decoded.items():
            if content[i].transcript is None and samples.size:
                out.extend(self._transcribe(item, i, samples))
        return out

    def _delete_item(self, item_id: str) -> Outputs:
        item = self._item(item_id)
        if self.response is not None and self.response.item is item:
            raise RealtimeError("invalid_value", "the item is being generated: cancel its response first", "item_id")
        self.conversation.remove(item_id)
        return self._forget(item)

    def _truncate(self, event: ItemTruncate) -> Outputs:
        item = self._item(event.item_id)
        audio = [c for c in item.content if c.type is ContentType.OUTPUT_AUDIO]
        if item.role is not Role.ASSISTANT or not audio:
            raise RealtimeError("invalid_value", "only an assistant item with audio can be truncated", "item_id")
        index = event.content_index
        if index >= len(item.content) or item.content[index].type is not ContentType.OUTPUT_AUDIO:
            raise RealtimeError("invalid_value", "content_index does not name an audio part", "content_index")
        out = Outputs()
        if self.response is not None and self.response.item is item:
            out.extend(self._cancel("client_cancelled"))
        content = item.content[event.content_index]
        if event.audio_end_ms > content.audio_ms:
            raise RealtimeError(
                "invalid_value",
                f"audio_end_ms ({event.audio_end_ms}) is past the item's audio ({content.audio_ms} ms)",
                "audio_end_ms",
            )
        content.truncate(event.audio_end_ms)
        out.events.append(
            self._event(
                "conversation.item.truncated",
                item_id=item.id,
                content_index=event.content_index,
                audio_end_ms=event.audio_end_ms,
            )
        )
        return out

    # --- transcription results ---

    def transcription_delta(self, item_id: str, content_index: int, text: str) -> Outputs:
        parts = self.pending.get((item_id, content_index))
        if parts is None or not text or self.phase is Phase.CLOSED:
            return Outputs()
        parts.append(text)
        event = self._event(
            "conversation.item.input_audio_transcription.delta",
            item_id=item_id,
            content_index=content_index,
            delta=text,
        )
        return Outputs([event])

    def transcription_done(self, item_id: str, content_index: int, audio_tokens: int, text_tokens: int) -> Outputs:
        parts = self.pending.pop((item_id, content_index), None)
        item = self.conversation.get(item_id)
        if parts is None or item is None or self.phase is Phase.CLOSED:
            return Outputs()
        transcript = "".join(parts).strip()
        item.content[content_index].transcript = transcript
        usage = {
            "type": "tokens",
            "input_tokens": audio_tokens,
            "output_tokens": text_tokens,
            "total_tokens": audio_tokens + text_tokens,
            "input_token_details": {"text_tokens": 0, "audio_tokens": audio_tokens},
        }
        out = Outputs(
            [
                self._event(
                    "conversation.item.input_audio_transcription.completed",
                    item_id=item_id,
                    content_index=content_index,
                    transcript=transcript,
                    usage=usage,
                )
            ]
        )
        return out.extend(self._resolve((item_id, content_index)))

    def transcription_failed(self, item_id: str, content_index: int, message: str) -> Outputs:
        if self.pending.pop((item_id, content_index), None) is None or self.phase is Phase.CLOSED:
            return Outputs()
        error = {"type": "server_error", "code": "transcription_failed", "message": message, "param": None}
        event = self._event(
            "conversation.item.input_audio_transcription.failed",
            item_id=item_id,
            content_index=content_index,
            error=error,
        )
        return Outputs([event]).extend(self._resolve((item_id, content_index)))

    def _resolve(self, key: tuple[str, int]) -> Outputs:
        r = self.response
        if r is None or key not in r.waiting:
            return Outputs()
        r.waiting.discard(key)
        return self._maybe_run(r)

    # --- responses ---

    def _response_settings(self, event: ResponseCreate | None) -> dict[str, Any]:
        c, o = self.config, event.options if event is not None else None
        modality = c.modality if o is None or o.output_modalities is UNSET else o.output_modalities
        voice = c.voice if o is None or o.voice is UNSET else self._check_voice(o.voice, "response.audio.output.voice")
        return {
            "modality": modality,
            "voice": voice,
            "format": c.output_format if o is None or o.output_format is UNSET else o.output_format,
            "max_tokens": c.max_output_tokens if o is None or o.max_output_tokens is UNSET else o.max_output_tokens,
            "instructions": c.instructions if o is None or o.instructions is UNSET else o.instructions,
            "metadata": None if o is None else o.metadata,
        }

    def _create_response(self, event: ResponseCreate) -> Outputs:
        if self.config.type is SessionType.TRANSCRIPTION:
            raise RealtimeError("invalid_value", "a transcription session makes no responses", "session.type")
        if self.response is not None:
            raise RealtimeError(
                "conversation_already_has_active_response",
                f"Conversation already has an active response in progress: {self.response.id}. Wait until the "
                "response is finished before creating a new one.",
            )
        if not self.caps.text:
            raise RealtimeError("invalid_value", "responses need a text model, and none is loaded", "model")
        settings = self._response_settings(event)
        if settings["modality"] is Modality.AUDIO and not self.caps.speech:
            raise RealtimeError(
                "invalid_value", "audio output needs a speech model, and none is loaded", "response.output_modalities"
            )
        return self._start_response(self._id("resp"), settings)

    def _start_response(self, rid: str, settings: dict[str, Any]) -> Outputs:
        modality: Modality = settings["modality"]
        part = ContentType.OUTPUT_AUDIO if modality is Modality.AUDIO else ContentType.OUTPUT_TEXT
        content = Content(part, transcript="" if part is ContentType.OUTPUT_AUDIO else None)
        item = Item(self._id("item"), Role.ASSISTANT, [content], ItemStatus.IN_PROGRESS)
        fmt: AudioFormat = settings["format"]
        encoder = OutputEncoder(fmt, self.caps.output_rate) if modality is Modality.AUDIO else None
        r = _Response(
            rid,
            item,
            modality,
            settings["voice"],
            fmt,
            settings["max_tokens"],
            settings["instructions"],
            settings["metadata"],
            encoder,
            waiting=set(self.pending),
        )
        self.response = r
        out = Outputs([self._event("response.created", response=self._response_wire(r, "in_progress"))])
        out.events.append(self._event("response.output_item.added", response_id=rid, output_index=0, item=item.wire()))
        out.extend(self._add_item(item, None))
        part_wire = {"type": "audio", "transcript": ""} if encoder is not None else {"type": "text", "text": ""}
        out.events.append(self._event("response.content_part.added", **self._where(r), part=part_wire))
        return out.extend(self._maybe_run(r))

    def _maybe_run(self, r: _Response) -> Outputs:
        if r.waiting or r.status is not ResponseStatus.WAITING:
            return Outputs()
        r.status = ResponseStatus.RUNNING
        messages = self.conversation.messages(before=r.item)
        if r.instructions.strip():
            messages.insert(0, ChatMessage(Role.SYSTEM, r.instructions))
        if not messages:
            return self._finish(r, "failed", error="the conversation is empty: nothing to respond to")
        speak = r.modality is Modality.AUDIO
        return Outputs(commands=[StartResponse(r.id, tuple(messages), speak, r.voice, r.max_tokens)])

    def _where(self, r: _Response) -> dict[str, Any]:
        return {"response_id": r.id, "item_id": r.item.id, "output_index": 0, "content_index": 0}

    def _response_wire(self, r: _Response, status: str, details: Any = None, usage: Any = None) -> dict[str, Any]:
        return {
            "object": "realtime.response",
            "id": r.id,
            "status": status,
            "status_details": details,
            "output": [] if status == "in_progress" else [r.item.wire()],
            "conversation_id": self.conversation_id,
            "output_modalities": [r.modality.value],
            "max_output_tokens": "inf" if r.max_tokens is None else r.max_tokens,
            "audio": {"output": {"format": r.format.wire(), "voice": r.voice}},
            "usage": usage,
            "metadata": r.metadata,
        }

    def _active(self, rid: str) -> _Response | None:
        r = self.response
        return r if r is not None and r.id == rid and r.status is ResponseStatus.RUNNING else None

    def response_transcript(self, rid: str, text: str) -> Outputs:
        """A spoken unit's transcript, just before its audio."""
        r = self._active(rid)
        if r is None or not text.strip():
            return Outputs()
        content = r.content
        delta = (" " if content.units else "") + text.strip()
        content.units.append((_ms(r.samples, self.caps.output_rate), text))
        content.transcript = join_units(t for _, t in content.units)
        return Outputs([self._event("response.output_audio_transcript.delta", **self._where(r), delta=delta)])

    def response_text(self, rid: str, text: str) -> Outputs:
        r = self._active(rid)
        if r is None or not text:
            return Outputs()
        r.content.text += text
        return Outputs([self._event("response.output_text.delta", **self._where(r), delta=text)])

    def response_audio(self, rid: str, samples: np.ndarray) -> Outputs:
        """Float32 samples at the speech model's rate; encoded to the response's wire format."""
        r = self._active(rid)
        if r is None or r.encoder is None or not samples.size:
            return Outputs()
        data = r.encoder.encode(samples)
        r.samples += samples.size
        r.content.audio_ms = _ms(r.samples, self.caps.output_rate)
        if not data:
            return Outputs()
        return Outputs([self._event("response.output_audio.delta", audio=data, **self._where(r))])

    def response_done(self, rid: str, usage: ResponseUsage) -> Outputs:
        r = self._active(rid)
        if r is None:
            return Outputs()
        out = Outputs()
        if r.encoder is not None and r.encoder.needs_resampling():
            tail = r.encoder.encode(np.zeros(0, np.float32), last=True)
            if tail:
                out.events.append(self._event("response.output_audio.delta", audio=tail, **self._where(r)))
        hit_limit = r.max_tokens is not None and usage.output_text_tokens >= r.max_tokens
        status = "incomplete" if hit_limit else "completed"
        return out.extend(self._finish(r, status, reason="max_output_tokens" if hit_limit else None, usage=usage))

    def response_failed(self, rid: str, message: str) -> Outputs:
        r = self._active(rid)
        return Outputs() if r is None else self._finish(r, "failed", error=message)

    def _cancel(self, reason: str) -> Outputs:
        r = self.response
        assert r is not None
        out = Outputs(commands=[CancelResponse(r.id)] if r.status is ResponseStatus.RUNNING else [])
        return out.extend(self._finish(r, "cancelled", reason=reason))

    def _finish(
        self,
        r: _Response,
        status: str,
        *,
        reason: str | None = None,
        error: str | None = None,
        usage: ResponseUsage | None = None,
    ) -> Outputs:
        """The closing events of a response, in order; the session is free for the next one afterwards."""
        r.status = ResponseStatus.DONE
        self.response = None
        r.item.status = ItemStatus.COMPLETED if status == "completed" else ItemStatus.INCOMPLETE
        where, content = self._where(r), r.content
        out = Outputs()
        if r.encoder is not None:
            transcript = content.transcript or ""
            out.events.append(self._event("response.output_audio.done", **where))
            out.events.append(self._event("response.output_audio_transcript.done", **where, transcript=transcript))
            part = {"type": "audio", "transcript": transcript}
        else:
            out.events.append(self._event("response.output_text.done", **where, text=content.text))
            part = {"type": "text", "text": content.text}
        out.events.append(self._event("response.content_part.done", **where, part=part))
        wire = r.item.wire()
        out.events.append(self._event("response.output_item.done", response_id=r.id, output_index=0, item=wire))
        if r.item.id in self.conversation:
            previous = self.conversation.previous_id(r.item)
            out.events.append(self._event("conversation.item.done", previous_item_id=previous, item=wire))
        details: dict[str, Any] | None = None
        if status == "cancelled" or (status == "incomplete" and reason):
            details = {"type": status, "reason": reason}
        elif status == "failed":
            details = {"type": "failed", "error": {"type": "server_error", "code": "server_error", "message": error}}
        body = self._response_wire(r, status, details, (usage or ResponseUsage()).wire())
        out.events.append(self._event("response.done", response=body))
        return out

    # --- the session's end ---

    def expire(self) -> Outputs:
        """The session reached ``Limits.session_seconds``: an error, then close."""
        if self.phase is Phase.CLOSED:
            return Outputs()
        out = self._cancel("client_cancelled") if self.response is not None else Outputs()
        seconds = self.limits.session_seconds
        exc = RealtimeError("session_expired", f"Your session hit the maximum duration of {seconds:g} seconds.")
        out.events.append(self._error(exc))
        out.commands.append(CloseSession(1000, "session expired"))
        self.close()
        return out

    def close(self) -> None:
        """Forget every per-session state (buffer, detector, pending work); later inputs are ignored."""
        self.phase = Phase.CLOSED
        self.buffer.clear()
        if self.vad is not None:
            self.vad.reset()
        self.vad = None
        self._vad_resampler = None
        self.pending.clear()
        self.response = None
