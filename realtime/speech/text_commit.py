"""Commitment of streamed text (``text_input_mode="commitment"``): which prefix of the buffer is safe to speak.

Audio cannot be taken back, so a span is committed (and synthesized at once, as its own request) only when
no later text can change how it is read:

- It ends at a clause or sentence boundary: the ``clause`` rules of :mod:`.text_split` (``.!?,;`` before
  whitespace, never inside ``3.50`` or ``1,000``, never after ``Mr.`` or ``e.g.``; ``。！？…，；、`` at once).
- Text that runs past ``max_uncommitted`` characters without a boundary is committed anyway, up to a point
  that holds back every ambiguous suffix: in English the cut falls at a space after a plain word (never
  after a number, whose unit or decimals may follow, nor after an abbreviation), keeping the last word
  back, since the next characters may still extend it; in Chinese it falls between two ideographs, holding
  back the last ideograph and any trailing digits or Latin letters (``2026`` reads differently before ``年``
  and before ``元``).
- ``input.done`` commits whatever is left.

Pure functions and a small buffer object, unit-tested without a server.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omni_stream.speech.text_split import ABBREVIATIONS, Granularity, limit_length, split_text

LANGUAGES = ("English", "Chinese")


def _is_ideograph(c: str) -> bool:
    return "\u3400" <= c <= "\u9fff" or "\uf900" <= c <= "\ufaff" or "\U00020000" <= c <= "\U0002ffff"


def _plain_word(token: str) -> bool:
    """A word whose reading no following text changes (letters only, not an abbreviation)."""
    word = token.strip("\"'()[]“”‘’")
    return word.isalpha() and word.lower() not in ABBREVIATIONS and len(word) > 1


def forced_cut(text: str, language: str) -> int:
    """Where to commit ``text`` that has no boundary (0: nothing is safe yet)."""
    if language == "Chinese":
        for i in range(len(text) - 1, 0, -1):
            if _is_ideograph(text[i - 1]) and _is_ideograph(text[i]):
                return i
        return 0
    i = len(text.rstrip())
    while True:
        i = text.rfind(" ", 0, i)
        if i <= 0:
            return 0
        token = text[:i].rsplit(None, 1)[-1] if text[:i].strip() else ""
        if token and _plain_word(token):
            return i
        i -= 1


def commit_text(text: str, language: str, max_uncommitted: int, final: bool = False) -> tuple[list[str], str]:
    """Split ``text`` into committed spans and the held remainder; ``final`` commits everything."""
    spans, rest = split_text(text, Granularity.CLAUSE, final=final)
    while len(rest) > max_uncommitted:
        cut = forced_cut(rest[:max_uncommitted] if language == "Chinese" else rest, language)
        if cut <= 0:
            break
        span = rest[:cut].strip()
        if span:
            spans.append(span)
        rest = rest[cut:]
    return spans, rest


@dataclass(slots=True)
class TextCommitter:
    """Incremental committer with :class:`~.text_split.TextSplitter`'s interface (``feed``, ``flush``, ...)."""

    language: str = "English"
    max_uncommitted: int = 400
    max_chars: int = 4096
    _buffer: str = field(default="", init=False)

    def __post_init__(self) -> None:
        if self.language not in LANGUAGES:
            raise ValueError(f"commitment needs one of {LANGUAGES}, got {self.language!r}")

    @property
    def pending(self) -> str:
        """Text received and not committed yet."""
        return self._buffer

    def feed(self, text: str) -> list[str]:
        spans, self._buffer = commit_text(self._buffer + text, self.language, self.max_uncommitted)
        return limit_length(spans, self.max_chars)

    def flush(self) -> list[str]:
        spans, self._buffer = commit_text(self._buffer, self.language, self.max_uncommitted, final=True)
        return limit_length(spans, self.max_chars)

    def clear(self) -> None:
        self._buffer = ""

    def restore(self, pending: str) -> None:
        self._buffer = pending
