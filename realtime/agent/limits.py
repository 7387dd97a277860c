"""Bounds of the realtime protocol's client events, apart from the parsers so settings can name them cheaply."""

from __future__ import annotations

MAX_APPEND_BYTES = 15 * 1024 * 1024  # decoded audio per input_audio_buffer.append (OpenAI's limit)
MAX_TEXT_CHARS = 32_768  # characters of one text part of a conversation item (as for instructions)
