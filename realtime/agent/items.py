"""The conversation of a realtime session: message items, their content, their wire form and the chat history.

User audio is not kept once it is transcribed (only its duration and transcript); assistant audio is kept as its
length and, per spoken unit (sentence), where the unit's audio starts, so a truncation at ``audio_end_ms`` can cut
the transcript to what the user heard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from omni_stream.requests import ChatMessage, Role


class ItemStatus(StrEnum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"


class ContentType(StrEnum):
    INPUT_TEXT = "input_text"
    INPUT_AUDIO = "input_audio"
    OUTPUT_TEXT = "output_text"
    OUTPUT_AUDIO = "output_audio"


@dataclass(slots=True)
class Content:
    """One content part. Audio parts: ``audio_ms`` of audio; assistant audio: ``units`` (start ms, text)."""

    type: ContentType
    text: str = ""
    transcript: str | None = None
    audio_ms: int = 0
    units: list[tuple[int, str]] = field(default_factory=list)

    def wire(self) -> dict[str, Any]:
        if self.type in (ContentType.INPUT_TEXT, ContentType.OUTPUT_TEXT):
            return {"type": self.type.value, "text": self.text}
        return {"type": self.type.value, "transcript": self.transcript}

    def spoken_text(self) -> str:
        """What the part says, for the chat history (a pending transcript counts as nothing)."""
        if self.type in (ContentType.INPUT_TEXT, ContentType.OUTPUT_TEXT):
            return self.text
        return self.transcript or ""

    def truncate(self, audio_end_ms: int) -> None:
        """Keep ``audio_end_ms`` of the audio and the transcript of the units whose audio began before it."""
        self.audio_ms = min(self.audio_ms, audio_end_ms)
        self.units = [(start, text) for start, text in self.units if start < audio_end_ms]
        self.transcript = join_units(text for _, text in self.units)


def join_units(texts: Any) -> str:
    return " ".join(t.strip() for t in texts if t.strip())


@dataclass(slots=True)
class Item:
    """A ``message`` item of the conversation."""

    id: str
    role: Role
    content: list[Content]
    status: ItemStatus = ItemStatus.COMPLETED

    def wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "realtime.item",
            "type": "message",
            "status": self.status.value,
            "role": self.role.value,
            "content": [c.wire() for c in self.content],
        }

    def message(self) -> ChatMessage | None:
        """The item as a chat message (None when it says nothing yet)."""
        text = " ".join(t for t in (c.spoken_text().strip() for c in self.content) if t)
        return ChatMessage(self.role, text) if text else None


class Conversation:
    """Items in order, by id, at most ``max_items`` (the oldest go first)."""

    def __init__(self, max_items: int) -> None:
        if max_items < 2:
            raise ValueError("max_items must be >= 2")
        self.max_items = max_items
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
        return dropped

    def remove(self, item_id: str) -> Item:
        item = self.by_id.pop(item_id)
        self.items.remove(item)
        return item

    def messages(self, before: Item | None = None) -> list[ChatMessage]:
        """The chat history of the items before ``before`` (all without it), items that say nothing left out."""
        out = []
        for item in self.items:
            if item is before:
                break
            message = item.message()
            if message is not None:
                out.append(message)
        return out
