"""Conversation items in the realtime protocol: adding (client-created or from a turn), deleting, truncating, and
what an item leaving the conversation cancels."""

from __future__ import annotations

import numpy as np

from omni_stream.errors import InvalidRequestError
from omni_stream.realtime.agent.audio import InputDecoder, decode_whole
from omni_stream.realtime.agent.events import (
    ItemCreate,
    ItemTruncate,
    NewFunctionCall,
    NewFunctionOutput,
    NewItem,
    PartType,
    RealtimeError,
)
from omni_stream.realtime.agent.items import Content, ContentType, Item, ItemStatus, function_call, function_output
from omni_stream.realtime.agent.outputs import CancelTranscription, Outputs
from omni_stream.realtime.agent.protocol_state import ProtocolState, samples_ms
from omni_stream.requests import Role
from omni_stream.text.tools import ToolCall
from omni_stream.vision.frames import decode_base64


class ItemEditing(ProtocolState):
    """The conversation's items (see the module docstring)."""

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
        for spec_id in [s for s, owner in self.adopted.items() if owner == item.id]:
            del self.adopted[spec_id]  # the item's transcription runs under the speculation's id
            out.commands.append(CancelTranscription(spec_id))
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
        if not isinstance(new, NewItem):
            return self._add_item(self._function_item(new), after)
        item, decoded = self._message_item(new)
        out = self._add_item(item, after)
        for i, samples in decoded.items():
            if item.content[i].transcript is None and samples.size:
                out.extend(self._transcribe(item, i, samples))
        return out

    def _function_item(self, new: NewFunctionCall | NewFunctionOutput) -> Item:
        """A client's function call or its output, as a conversation item."""
        item_id = new.id or self._id("item")
        if isinstance(new, NewFunctionCall):
            return function_call(item_id, ToolCall(new.call_id, new.name, new.arguments))
        return function_output(item_id, new.call_id, new.output)

    def _message_item(self, new: NewItem) -> tuple[Item, dict[int, np.ndarray]]:
        """A client's message item, and the input audio of its parts (decoded; to be transcribed)."""
        decoded: dict[int, np.ndarray] = {}
        content = []
        shown = sum(p.type is PartType.INPUT_IMAGE for p in new.content)
        if shown > self.limits.frames.max_conversation_pictures:
            limit = self.limits.frames.max_conversation_pictures
            raise RealtimeError("invalid_value", f"an item shows at most {limit} pictures, got {shown}", "item.content")
        for i, part in enumerate(new.content):
            if part.type is PartType.INPUT_AUDIO:
                InputDecoder(self.config.input_format).check(part.audio, f"item.content[{i}].audio")
                decoded[i] = decode_whole(part.audio, self.config.input_format)
                transcript = part.transcript
                content.append(
                    Content(ContentType.INPUT_AUDIO, transcript=transcript, audio_ms=samples_ms(decoded[i].size))
                )
            elif part.type is PartType.OUTPUT_AUDIO:  # its transcript is one unit from the start: truncatable
                if part.audio:
                    InputDecoder(self.config.output_format).check(part.audio, f"item.content[{i}].audio")
                ms = samples_ms(decode_whole(part.audio, self.config.output_format).size) if part.audio else 0
                units = [(0, part.transcript)] if part.transcript else []
                content.append(Content(ContentType.OUTPUT_AUDIO, transcript=part.transcript, audio_ms=ms, units=units))
            elif part.type is PartType.INPUT_IMAGE:
                content.append(Content(ContentType.INPUT_IMAGE, image=self._picture(part.image, i)))
            elif part.type is PartType.OUTPUT_TEXT:
                content.append(Content(ContentType.OUTPUT_TEXT, text=part.text))
            else:
                content.append(Content(ContentType.INPUT_TEXT, text=part.text))
        return Item(new.id or self._id("item"), Role(new.role), content), decoded

    def _picture(self, image: str, index: int) -> np.ndarray:
        """An ``input_image`` part's pixels (a CPU job: the session applies items with pictures off the loop)."""
        param = f"item.content[{index}].image_url"
        if not self.caps.sees:
            raise RealtimeError(
                "invalid_value", f"the text model {self.caps.model!r} does not take images (input_image)", param
            )
        try:
            return decode_base64(image, self.limits.frames, param).pixels
        except InvalidRequestError as exc:
            raise RealtimeError("invalid_value", exc.message, exc.param) from None

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
        content = item.content[event.content_index]
        if event.audio_end_ms > content.audio_ms:  # checked first: a refused truncate leaves its response running
            raise RealtimeError(
                "invalid_value",
                f"audio_end_ms ({event.audio_end_ms}) is past the item's audio ({content.audio_ms} ms)",
                "audio_end_ms",
            )
        out = Outputs()
        if self.response is not None and self.response.item is item:
            out.extend(self._cancel("client_cancelled"))
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
