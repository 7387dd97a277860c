"""Responses of the realtime protocol: creating one (from the client, or after a server-VAD turn), starting it once
the transcripts it answers are in, its text and audio deltas, its tool calls, and its end (done, incomplete, failed,
cancelled).

Tool calls. The reply's calls (``session.tools`` / ``response.tools`` under their ``tool_choice``) are gathered
while it streams and become ``function_call`` output items when its text and audio are done, just before
``response.done``: a voice reply speaks its text, then calls; the client answers with a ``function_call_output``
item and ``response.create``, and the next response speaks the answer. A cancelled reply makes no calls.

The message item. Announced (``response.output_item.added``, into the conversation, its content part) with the
reply's first content, as OpenAI's server does: a reply that only calls tools has its ``function_call`` items alone,
and one failed or cancelled before it said anything has no item; an empty answer that ends normally still has one.

Out of band (``response.conversation: "none"``): the response's items stay out of the conversation, and its
``input`` (new items or ``item_reference`` s), when given, is its whole context. One response runs at a time."""

from __future__ import annotations

from typing import Any

import numpy as np

from omni_stream.realtime.agent.audio import OutputEncoder
from omni_stream.realtime.agent.events import (
    UNSET,
    AudioFormat,
    ItemReference,
    Modality,
    NewFunctionCall,
    NewFunctionOutput,
    NewItem,
    PartType,
    RealtimeError,
    ResponseCreate,
    SessionType,
)
from omni_stream.realtime.agent.items import (
    Content,
    ContentType,
    Item,
    ItemStatus,
    chat_history,
    function_call,
    function_output,
    join_units,
)
from omni_stream.realtime.agent.outputs import AdoptResponse, CancelResponse, Outputs, ResponseUsage, StartResponse
from omni_stream.realtime.agent.protocol_state import ProtocolState, ResponseState, ResponseStatus, samples_ms
from omni_stream.requests import ChatMessage, Role
from omni_stream.text.tools import AUTO, ToolCall, ToolCallDelta


class Responding(ProtocolState):
    """The response in progress (see the module docstring)."""

    def _resolve(self, key: tuple[str, int]) -> Outputs:
        r = self.response
        if r is None or key not in r.waiting:
            return Outputs()
        r.waiting.discard(key)
        return self._maybe_run(r)

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
            "tools": c.tools if o is None or o.tools is UNSET else o.tools,
            "tool_choice": c.tool_choice if o is None or o.tool_choice is UNSET else o.tool_choice,
            "out_of_band": o is not None and o.out_of_band,
            "context": None if o is None or o.input is None else self._context(o.input),
        }

    def _context(
        self, items: tuple[NewItem | NewFunctionCall | NewFunctionOutput | ItemReference, ...]
    ) -> list[ChatMessage]:
        """The chat history of a response's own ``input`` (references name items of the conversation)."""
        resolved: list[Item] = []
        for i, entry in enumerate(items):
            if isinstance(entry, ItemReference):
                item = self.conversation.get(entry.id)
                if item is None:
                    message = f"no item with id {entry.id!r} in the conversation"
                    raise RealtimeError("invalid_value", message, f"response.input[{i}].id")
                resolved.append(item)
            elif isinstance(entry, NewFunctionCall):
                resolved.append(function_call("input", ToolCall(entry.call_id, entry.name, entry.arguments)))
            elif isinstance(entry, NewFunctionOutput):
                resolved.append(function_output("input", entry.call_id, entry.output))
            else:
                content = []
                for j, part in enumerate(entry.content):
                    if part.type is PartType.INPUT_IMAGE:  # decoded only with conversation items (off the loop)
                        message = (
                            "a response's input takes no input_image: add the item, then name it by item_reference"
                        )
                        raise RealtimeError("invalid_value", message, f"response.input[{i}].content[{j}].type")
                    if part.type is PartType.INPUT_AUDIO and part.transcript is None:
                        message = "audio in a response's input needs its transcript"
                        raise RealtimeError("invalid_value", message, f"response.input[{i}].content[{j}].transcript")
                    kind = ContentType.OUTPUT_TEXT if part.type is PartType.OUTPUT_TEXT else ContentType.INPUT_TEXT
                    content.append(Content(kind, text=part.text if part.transcript is None else part.transcript))
                resolved.append(Item("input", Role(entry.role), content))
        return chat_history(resolved)

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
        self._check_tool_choice(settings["tools"], settings["tool_choice"], "response.tool_choice")
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
        r = ResponseState(
            rid,
            item,
            modality,
            settings["voice"],
            fmt,
            settings["max_tokens"],
            settings["instructions"],
            settings["metadata"],
            encoder,
            waiting=set() if settings["context"] is not None else set(self.pending),
            tools=settings["tools"],
            tool_choice=settings["tool_choice"],
            out_of_band=settings["out_of_band"],
            context=settings["context"],
        )
        self.response = r
        out = Outputs([self._event("response.created", response=self._response_wire(r, "in_progress"))])
        return out.extend(self._maybe_run(r))

    def _open(self, r: ResponseState) -> Outputs:
        """Announce the response's message item, as OpenAI does, at its first content (a reply that only calls
        tools, or fails or is cancelled before it says anything, has none): added to the conversation then, after
        the items before it."""
        if r.opened:
            return Outputs()
        r.opened = True
        item = r.item
        out = Outputs([self._event("response.output_item.added", response_id=r.id, output_index=0, item=item.wire())])
        if not r.out_of_band:
            out.extend(self._add_item(item, None))
        part_wire = {"type": "audio", "transcript": ""} if r.encoder is not None else {"type": "text", "text": ""}
        out.events.append(self._event("response.content_part.added", **self._where(r), part=part_wire))
        return out

    def _maybe_run(self, r: ResponseState) -> Outputs:
        if r.waiting or r.status is not ResponseStatus.WAITING:
            return Outputs()
        r.status = ResponseStatus.RUNNING
        messages = list(r.context) if r.context is not None else self.conversation.messages(before=r.item)
        if not messages and not r.instructions.strip():
            return self._finish(r, "failed", error="the conversation is empty: nothing to respond to")
        settings: dict[str, Any] = {"modality": r.modality, "voice": r.voice, "max_tokens": r.max_tokens}
        settings.update(instructions=r.instructions, tools=r.tools, tool_choice=r.tool_choice)
        cmd = self._reply_command(r.id, messages, settings)
        if r.out_of_band:  # the turn's own response (and any work started for it) is not this one
            return Outputs(commands=[cmd])
        pre, self.preempt = self.preempt, None
        if pre is not None and pre.same_work(cmd):  # started at the pause on this very turn: released now
            return Outputs(commands=[AdoptResponse(pre.response_id, r.id)])
        return Outputs(commands=[CancelResponse(pre.response_id)] if pre is not None else []).extend(
            Outputs(commands=[cmd])
        )

    def _reply_command(
        self, rid: str, messages: list[ChatMessage], settings: dict[str, Any], *, preemptive: bool = False
    ) -> StartResponse:
        """The models' work for a reply to ``messages`` (the instructions first, as a system message)."""
        instructions: str = settings["instructions"]
        if instructions.strip():
            messages = [ChatMessage(Role.SYSTEM, instructions), *messages]
        speak = settings["modality"] is Modality.AUDIO
        return StartResponse(
            rid,
            tuple(messages),
            speak,
            settings["voice"],
            settings["max_tokens"],
            preemptive,
            self.config.truncation,
            settings.get("tools", ()),
            settings.get("tool_choice", AUTO),
        )

    def _where(self, r: ResponseState) -> dict[str, Any]:
        return {"response_id": r.id, "item_id": r.item.id, "output_index": 0, "content_index": 0}

    def _response_wire(self, r: ResponseState, status: str, details: Any = None, usage: Any = None) -> dict[str, Any]:
        return {
            "object": "realtime.response",
            "id": r.id,
            "status": status,
            "status_details": details,
            "output": []
            if status == "in_progress"
            else [*([r.item.wire()] if r.opened else []), *(c.wire() for c in r.call_items)],
            "conversation_id": None if r.out_of_band else self.conversation_id,
            "output_modalities": [r.modality.value],
            "max_output_tokens": "inf" if r.max_tokens is None else r.max_tokens,
            "audio": {"output": {"format": r.format.wire(), "voice": r.voice}},
            "usage": usage,
            "metadata": r.metadata,
        }

    def _active(self, rid: str) -> ResponseState | None:
        r = self.response
        return r if r is not None and r.id == rid and r.status is ResponseStatus.RUNNING else None

    def response_transcript(self, rid: str, text: str) -> Outputs:
        """A spoken unit's transcript, just before its audio."""
        r = self._active(rid)
        if r is None or not text.strip():
            return Outputs()
        content = r.content
        delta = (" " if content.units else "") + text.strip()
        content.units.append((samples_ms(r.samples, self.caps.output_rate), text))
        content.transcript = join_units(t for _, t in content.units)
        out = self._open(r)
        out.events.append(self._event("response.output_audio_transcript.delta", **self._where(r), delta=delta))
        return out

    def response_text(self, rid: str, text: str) -> Outputs:
        r = self._active(rid)
        if r is None or not text:
            return Outputs()
        r.content.text += text
        out = self._open(r)
        out.events.append(self._event("response.output_text.delta", **self._where(r), delta=text))
        return out

    def response_audio(self, rid: str, samples: np.ndarray) -> Outputs:
        """Float32 samples at the speech model's rate; encoded to the response's wire format."""
        r = self._active(rid)
        if r is None or r.encoder is None or not samples.size:
            return Outputs()
        data = r.encoder.encode(samples)
        r.samples += samples.size
        r.content.audio_ms = samples_ms(r.samples, self.caps.output_rate)
        out = self._open(r)
        if data:
            out.events.append(self._event("response.output_audio.delta", audio=data, **self._where(r)))
        return out

    def response_tool_call(self, rid: str, pieces: tuple[ToolCallDelta, ...]) -> Outputs:
        """Pieces of the reply's tool calls; their items and events follow the reply's text and audio, at its end."""
        r = self._active(rid)
        if r is not None:
            for piece in pieces:
                call = r.calls.setdefault(piece.index, ["", "", ""])
                call[0], call[1] = piece.id or call[0], piece.name or call[1]
                call[2] += piece.arguments
        return Outputs()

    def _function_calls(self, r: ResponseState) -> Outputs:
        """The response's function_call items: added, their arguments, done; into the conversation after its
        message item (unless the response is out of band)."""
        out = Outputs()
        after = r.item.id if r.item.id in self.conversation else None
        for index in sorted(r.calls):
            call_id, name, arguments = r.calls[index]
            if not (call_id and name):
                continue
            item = function_call(self._id("item"), ToolCall(call_id, name, arguments), ItemStatus.IN_PROGRESS)
            output_index = int(r.opened) + len(r.call_items)
            r.call_items.append(item)
            added = {**item.wire(), "arguments": ""}
            out.events.append(
                self._event("response.output_item.added", response_id=r.id, output_index=output_index, item=added)
            )
            if not r.out_of_band:
                out.extend(self._add_item(item, after))
                after = item.id
            where: dict[str, Any] = {
                "response_id": r.id,
                "item_id": item.id,
                "output_index": output_index,
                "call_id": call_id,
            }
            out.events.append(self._event("response.function_call_arguments.delta", **where, delta=arguments))
            out.events.append(
                self._event("response.function_call_arguments.done", **where, name=name, arguments=arguments)
            )
            item.status = ItemStatus.COMPLETED
            wire = item.wire()
            out.events.append(
                self._event("response.output_item.done", response_id=r.id, output_index=output_index, item=wire)
            )
            if item.id in self.conversation:
                previous = self.conversation.previous_id(item)
                out.events.append(self._event("conversation.item.done", previous_item_id=previous, item=wire))
        return out

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

    def response_failed(self, rid: str, message: str, code: str = "server_error") -> Outputs:
        """The response's generation failed; ``code`` ``context_length_exceeded``: its prompt could not fit."""
        if self.preempt is not None and self.preempt.response_id == rid:
            self.preempt = None  # it failed unseen: the turn's end starts the response anew (and reports its error)
            return Outputs()
        r = self._active(rid)
        return Outputs() if r is None else self._finish(r, "failed", error=message, code=code)

    def _cancel(self, reason: str) -> Outputs:
        r = self.response
        assert r is not None
        out = Outputs(commands=[CancelResponse(r.id)] if r.status is ResponseStatus.RUNNING else [])
        return out.extend(self._finish(r, "cancelled", reason=reason))

    def _finish(
        self,
        r: ResponseState,
        status: str,
        *,
        reason: str | None = None,
        error: str | None = None,
        code: str = "server_error",
        usage: ResponseUsage | None = None,
    ) -> Outputs:
        """The closing events of a response, in order; the session is free for the next one afterwards."""
        r.status = ResponseStatus.DONE
        self.response = None
        ended = status in ("completed", "incomplete")
        calls = ended and any(call_id and name for call_id, name, _ in r.calls.values())
        # a reply that said nothing: its message item only where it also made no call and was not cut short by a
        # cancel or a failure (an empty answer is still an answer); announced in progress, then done
        out = self._open(r) if ended and not calls else Outputs()
        r.item.status = ItemStatus.COMPLETED if status == "completed" else ItemStatus.INCOMPLETE
        if r.opened:
            out.extend(self._close_message(r))
        if ended:  # a cancelled or failed reply's calls are not made
            out.extend(self._function_calls(r))
        details: dict[str, Any] | None = None
        if status == "cancelled" or (status == "incomplete" and reason):
            details = {"type": status, "reason": reason}
        elif status == "failed":
            kind = "invalid_request_error" if code == "context_length_exceeded" else "server_error"
            details = {"type": "failed", "error": {"type": kind, "code": code, "message": error}}
        body = self._response_wire(r, status, details, (usage or ResponseUsage()).wire())
        out.events.append(self._event("response.done", response=body))
        return out

    def _close_message(self, r: ResponseState) -> Outputs:
        """The closing events of the response's message item (its content's end, the item's)."""
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
        return out
