"""Bounds of the realtime protocol's client events, apart from the parsers so settings can name them cheaply."""

from __future__ import annotations

MAX_APPEND_BYTES = 15 * 1024 * 1024  # decoded audio per input_audio_buffer.append (OpenAI's limit)
MAX_TEXT_CHARS = 32_768  # characters of one text part of a conversation item (as for instructions)
MAX_METADATA_KEY_CHARS = 64  # a response's metadata, as OpenAI bounds it: 16 pairs, keys of 64, values of 512
MAX_METADATA_VALUE_CHARS = 512
