"""The actions every socket's sans-I/O protocol core asks of its shell: send a text message, send a binary one,
close the connection. Each protocol adds its own (start a generation, cancel a unit, ...) beside these."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class SendText:
    """Send one JSON text message."""

    text: str


@dataclass(slots=True, frozen=True)
class SendBinary:
    """Send one binary message (the payload the text message just before it announced)."""

    data: bytes


@dataclass(slots=True, frozen=True)
class Close:
    """Close the connection with ``code`` (after the actions before it)."""

    code: int
    reason: str = ""
