"""Client messages of the speech WebSocket: parsing and the checks every message or ``input.text`` passes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omni_stream.realtime.common.body_limit import parse_json, text_over
from omni_stream.realtime.common.json_fields import FieldError, string


class ProtocolError(Exception):
    """A client message the session refuses (non-fatal once configured)."""


def parse_message(message: Mapping[str, Any], limit: int) -> dict[str, Any]:
    """The JSON object in a text message of at most ``limit`` bytes."""
    text = message.get("text")
    if text is None:
        raise ProtocolError("Binary messages are not supported: send JSON text messages")
    if text_over(text, limit):
        raise ProtocolError(f"Message too large (max {limit} bytes)")
    try:
        body = parse_json(text)
    except FieldError as exc:  # a string no UTF-8 text holds, named by its path
        raise ProtocolError(exc.message) from None
    except (ValueError, RecursionError):  # RecursionError: nesting too deep to parse
        raise ProtocolError("Invalid JSON message") from None
    if not isinstance(body, dict):
        raise ProtocolError("WebSocket messages must be JSON objects")
    return body


def input_text(body: dict[str, Any], raw: str, limit: int) -> str:
    """The ``text`` of an ``input.text`` message whose raw form is at most ``limit`` bytes; valid Unicode only."""
    if len(raw.encode()) > limit:
        raise ProtocolError("input.text message too large")
    try:
        return string(body.get("text"), "text", utf8=True)
    except FieldError as exc:
        raise ProtocolError(f"input.text: {exc.message}") from None
