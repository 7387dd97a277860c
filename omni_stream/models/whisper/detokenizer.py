"""Incremental detokenization: text deltas from a growing list of token ids.

Byte-level BPE tokens may end inside a UTF-8 character; the decoded text then ends in U+FFFD until the
character's last byte arrives, so such text is held back and sent with a later token (or the flush).
Leading whitespace of the transcript is dropped (Whisper's text starts with a space).
"""

from __future__ import annotations

from typing import Any


class Detokenizer:
    """Feed token ids one at a time; ``push`` returns the new text, ``flush`` what is still held back.

    ``decode``: ids -> text (a ``tokenizers.Tokenizer``'s ``decode``); ids at or above ``text_limit`` (special and
    timestamp tokens) are not text.
    """

    __slots__ = ("_decode", "_ids", "_limit", "_sent")

    def __init__(self, decode: Any, text_limit: int) -> None:
        self._decode = decode
        self._limit = text_limit
        self._ids: list[int] = []
        self._sent = 0

    def _text(self) -> str:
        return self._decode(self._ids).lstrip() if self._ids else ""

    def push(self, token: int) -> str:
        if token >= self._limit:
            return ""
        self._ids.append(token)
        text = self._text()
        if text.endswith("\ufffd"):
            return ""
        delta, self._sent = text[self._sent :], len(text)
        return delta

    def flush(self) -> str:
        text = self._text()
        delta, self._sent = text[self._sent :], len(text)
        return delta

    @property
    def text(self) -> str:
        return self._text()
