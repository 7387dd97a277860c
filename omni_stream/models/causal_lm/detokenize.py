"""Incremental detokenization and stop strings: token ids in, text deltas out (pure; the worker thread runs it).

:class:`IncrementalDetokenizer` decodes a short window per token (vLLM's prefix/read offsets): the text of the
new tokens is ``decode(ids[prefix:]) - decode(ids[prefix:read])``, and the offsets only advance when the window's
text does not end in U+FFFD, so a character whose UTF-8 bytes span several tokens is held back until its last
byte arrives and never emitted broken. Every read offset therefore sits on a character boundary, and the deltas
join to ``decode(all ids)``. At the end, :meth:`IncrementalDetokenizer.flush` emits whatever is held (bytes that
never completed a character decode to U+FFFD there, as in the full decode).

:class:`StopStrings` cuts the text at the first stop string (not included) and holds back a tail that could be
the start of one, so no emitted text ever has to be taken back. :class:`TextStream` is the two together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"

Decode = Callable[[Sequence[int]], str]  # ids -> text, special tokens skipped


class IncrementalDetokenizer:
    """Text of a growing token sequence, one delta per pushed token (see module docstring)."""

    __slots__ = ("_decode", "ids", "prefix", "read")

    def __init__(self, decode: Decode) -> None:
        self._decode = decode
        self.ids: list[int] = []
        self.prefix = 0  # window start: the tokens before ``read`` that give the new ones their context
        self.read = 0  # tokens whose text has been emitted

    def push(self, token: int) -> str:
        """The text ``token`` completes ("" while it ends inside a character, or is a skipped special token)."""
        self.ids.append(token)
        before = self._decode(self.ids[self.prefix : self.read])
        text = self._decode(self.ids[self.prefix :])
        if len(text) <= len(before) or text.endswith(REPLACEMENT):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(before) :]

    def flush(self) -> str:
        """Everything held back, as the full decode renders it; call once, at the end."""
        if self.read == len(self.ids):
            return ""
        before = self._decode(self.ids[self.prefix : self.read])
        text = self._decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return text[len(before) :]


class StopStrings:
    """Cuts text at the first of ``stop`` and holds back any tail that could begin one."""

    __slots__ = ("_pending", "stop")

    def __init__(self, stop: Sequence[str]) -> None:
        self.stop = tuple(stop)
        self._pending = ""

    def push(self, text: str) -> tuple[str, bool]:
        """(text safe to emit, whether a stop string ended the generation)."""
        if not self.stop:
            return text, False
        buf = self._pending + text
        hits = [i for i in (buf.find(s) for s in self.stop) if i >= 0]
        if hits:
            self._pending = ""
            return buf[: min(hits)], True
        keep = self._held(buf)
        self._pending = buf[len(buf) - keep :]
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """The held-back tail (no stop string followed it)."""
        out, self._pending = self._pending, ""
        return out

    def _held(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of a stop string."""
        longest = max(len(s) for s in self.stop) - 1
        for k in range(min(longest, len(buf)), 0, -1):
            tail = buf[len(buf) - k :]
            if any(s.startswith(tail) for s in self.stop):
                return k
        return 0


class TextStream:
    """One sequence's text: tokens in, safe deltas out, stop strings applied."""

    __slots__ = ("detok", "stops")

    def __init__(self, decode: Decode, stop: Sequence[str] = ()) -> None:
        self.detok = IncrementalDetokenizer(decode)
        self.stops = StopStrings(stop)

    def push(self, token: int) -> tuple[str, bool]:
        """(delta for ``token``, whether a stop string ended the text)."""
        return self.stops.push(self.detok.push(token))

    def finish(self) -> tuple[str, bool]:
        """(the held-back rest, whether a stop string occurs in it) when the sequence ends for another reason."""
        text, stopped = self.stops.push(self.detok.flush())
        return (text, True) if stopped else (text + self.stops.flush(), False)
