"""The conversation of a realtime session: message and function-call items, their content, their wire form and the
chat history (a ``function_call`` item joins the assistant turn before it as one of its tool calls; a
``function_call_output`` item is a tool turn answering its call).

A picture the user shows (``input_image``) is kept decoded (RGB pixels within the frame limits' resolution cap), and
goes to the text model as its message's images; the item's wire form does not echo it back (its ``image_url`` is
null), since the conversation's events would otherwise carry every picture again. User audio is not kept once it is
transcribed (only its duration and transcript); assistant audio is kept as its
length and, per spoken unit (sentence), where the unit's audio starts, so a truncation at ``audio_end_ms`` can cut
the transcript to what the user heard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from omni_stream.requests import ChatMessage, Role
from omni_stream.text.tools import ToolCall


class ItemStatus(StrEnum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"


class ContentType(StrEnum):
    INPUT_TEXT = "input_text"
    INPUT_AUDIO = "input_audio"
    INPUT_IMAGE = "input_image"
    OUTPUT_TEXT = "output_text"
    OUTPUT_AUDIO = "output_audio"


@dataclass(slots=True)
class Content:
    """One content part. Audio parts: ``audio_ms`` of audio; assistant audio: ``units`` (start ms, text); a
    picture: ``image`` (uint8 RGB ``(h, w, 3)``)."""

    type: ContentType
    text: str = ""
    transcript: str | None = None
    audio_ms: int = 0
    units: list[tuple[int, str]] = field(default_factory=list)
    image: np.ndarray | None = None

    def wire(self) -> dict[str, Any]:
        if self.type in (ContentType.INPUT_TEXT, ContentType.OUTPUT_TEXT):
            return {"type": self.type.value, "text": self.text}
        if self.type is ContentType.INPUT_IMAGE:
            return {"type": self.type.value, "image_url": None, "detail": "auto"}
        return {"type": self.type.value, "transcript": self.transcript}

    def spoken_text(self) -> str:
        """What the part says, for the chat history (a pending transcript counts as nothing; a picture says nothing)."""
        if self.type in (ContentType.INPUT_TEXT, ContentType.OUTPUT_TEXT):
            return self.text
        if self.type is ContentType.INPUT_IMAGE:
            return ""
        return self.transcript or ""

    def truncate(self, audio_end_ms: int) -> None:
        """Keep ``audio_end_ms`` of the audio and the transcript of the units whose audio began before it."""
        self.audio_ms = min(self.audio_ms, audio_end_ms)
        self.units = [(start, text) for start, text in self.units if start < audio_end_ms]
        self.transcript = join_units(text for _, text in self.units)


def join_units(texts: Any) -> str:
    return " ".join(t.strip() for t in texts if t.strip())


class ItemType(StrEnum):
    MESSAGE = "message"
    FUNCTION_CALL = "function_call"  # ``call``: the call the assistant made
    FUNCTION_CALL_OUTPUT = "function_call_output"  # ``call``: the call answered, with ``output``


@dataclass(slots=True)
class Item:
    """An item of the conversation: a message (``role``, ``content``), a function call or a call's output."""

    id: str
    role: Role
    content: list[Content]
    status: ItemStatus = ItemStatus.COMPLETED
    type: ItemType = ItemType.MESSAGE
    call: ToolCall | None = None
    output: str = ""

    def wire(self) -> dict[str, Any]:
        head = {"id": self.id, "object": "realtime.item", "type": self.type.value, "status": self.status.value}
        if self.type is ItemType.FUNCTION_CALL:
            assert self.call is not None
            return {**head, "call_id": self.call.id, "name": self.call.name, "arguments": self.call.arguments}
        if self.type is ItemType.FUNCTION_CALL_OUTPUT:
            assert self.call is not None
            return {**head, "call_id": self.call.id, "output": self.output}
        return {**head, "role": self.role.value, "content": [c.wire() for c in self.content]}

    def message(self) -> ChatMessage | None:
        """The item as a chat message (None when it says nothing yet)."""
        if self.type is ItemType.FUNCTION_CALL:
            assert self.call is not None
            return ChatMessage(Role.ASSISTANT, "", tool_calls=(self.call,))
        if self.type is ItemType.FUNCTION_CALL_OUTPUT:
            assert self.call is not None
            return ChatMessage(Role.TOOL, self.output, tool_call_id=self.call.id)
        text = " ".join(t for t in (c.spoken_text().strip() for c in self.content) if t)
        images = tuple(c.image for c in self.content if c.image is not None)
        return ChatMessage(self.role, text, images=images) if text or images else None


def pictures(item: Item) -> int:
    """How many pictures ``item`` shows."""
    return sum(c.image is not None for c in item.content)


def function_call(item_id: str, call: ToolCall, status: ItemStatus = ItemStatus.COMPLETED) -> Item:
    return Item(item_id, Role.ASSISTANT, [], status, ItemType.FUNCTION_CALL, call)


def function_output(item_id: str, call_id: str, output: str) -> Item:
    call = ToolCall(call_id, "", "")
    return Item(item_id, Role.TOOL, [], ItemStatus.COMPLETED, ItemType.FUNCTION_CALL_OUTPUT, call, output)


class Conversation:
    """Items in order, by id, at most ``max_items`` (the oldest go first), and items holding at most ``max_pictures``
    pictures in all (the oldest items with pictures go first; an item is never dropped for its own pictures)."""

    def __init__(self, max_items: int, max_pictures: int = 16) -> None:
        if max_items < 2:
            raise ValueError("max_items must be >= 2")
        self.max_items = max_items
        self.max_pictures = max_pictures
        self.items: list[Item] = []
        self.by_id: dict[str, Item] = {}

    def __contains__(self, item_id: object) -> bool:
        return item_id in self.by_id

    def __len__(self) -> int:
        return len(self.items)

    def get(self, item_id: str) -> Item | None:
        return self.by_id.get(item_id)

    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def previous_id(self, item: Item) -> str | None:
        index = self.items.index(item)
        return self.items[index - 1].id if index else None

    def insert(self, item: Item, after: str | None = None) -> list[Item]:
        """Insert ``item`` after ``after`` (None: at the end; "root": first); returns the items dropped for room."""
        if after is None:
            self.items.append(item)
        elif after == "root":
            self.items.insert(0, item)
        else:
            self.items.insert(self.items.index(self.by_id[after]) + 1, item)
        self.by_id[item.id] = item
        dropped = []
        while len(self.items) > self.max_items:
            oldest = self.items[0] if self.items[0] is not item else self.items[1]
            self.remove(oldest.id)
            dropped.append(oldest)
        while sum(pictures(i) for i in self.items) > self.max_pictures:
            shown = [i for i in self.items if i is not item and pictures(i)]
            if not shown:
                break
            self.remove(shown[0].id)
            dropped.append(shown[0])
        return dropped

    def remove(self, item_id: str) -> Item:
        item = self.by_id.pop(item_id)
        self.items.remove(item)
        return item

    def messages(self, before: Item | None = None) -> list[ChatMessage]:
        """The chat history of the items before ``before`` (all without it), items that say nothing left out."""
        items = self.items
        if before is not None and before in items:
            items = items[: items.index(before)]
        return chat_history(items)


def chat_history(items: Any) -> list[ChatMessage]:
    """Chat messages of ``items`` in order; a function call joins the assistant turn right before it."""
    out: list[ChatMessage] = []
    for item in items:
        message = item.message()
        if message is None:
            continue
        if message.tool_calls and out and out[-1].role is Role.ASSISTANT:
            last = out[-1]
            out[-1] = ChatMessage(Role.ASSISTANT, last.content, tool_calls=(*last.tool_calls, *message.tool_calls))
            continue
        out.append(message)
    return out
