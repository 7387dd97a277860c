"""Pure sentence and clause splitting for streamed text input (no I/O, no state beyond a buffer).

Rules (``sentence``): ``.``, ``!`` and ``?`` end a unit only before whitespace, so ``3.50`` and ``a.b`` never
split and a unit at the end of the buffer waits for more text; common abbreviations (``Mr.``, ``Dr.``,
``e.g.``) and single-letter initials do not end a unit; CJK, Devanagari and Arabic terminators end a unit at
once. Runs of terminators (``?!``, ``...``) and closing quotes or brackets stay with their unit. ``clause``
adds ``,`` and ``;`` (before whitespace) and ``，；、،`` (at once).

A spoken reply's first unit (``first_clause``) ends at its first clause boundary, its first sentence end or its
:data:`FIRST_UNIT_MAX_WORDS`-th complete word, whichever comes first: its first audio waits for a few words, never
for a long clause (a reply that opens with twenty words and no comma would otherwise be spoken only once all twenty
are written).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Granularity(StrEnum):
    NONE = "none"
    SENTENCE = "sentence"
    CLAUSE = "clause"


_ASCII_SENTENCE = frozenset(".!?")
_ASCII_CLAUSE = frozenset(",;")
_WIDE_SENTENCE = frozenset("。！？…।॥؟")
_WIDE_CLAUSE = frozenset("，；、،")
_CLOSERS = frozenset("\"')]}”’»」』）】〉》")
ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st mt vs fig figs approx dept est gen gov lt col capt sgt rev hon "
    "inc ltd co corp jan feb mar apr jun jul aug sep sept oct nov dec cf al".split()
)


def _terminators(granularity: Granularity) -> tuple[frozenset[str], frozenset[str]]:
    if granularity is Granularity.CLAUSE:
        return _ASCII_SENTENCE | _ASCII_CLAUSE, _WIDE_SENTENCE | _WIDE_CLAUSE
    return _ASCII_SENTENCE, _WIDE_SENTENCE


FIRST_UNIT_MAX_WORDS = 12


def end_of_words(text: str, n: int) -> int | None:
    """Index just past the ``n``-th complete word of ``text`` (a word is complete once whitespace follows it), or
    None while fewer are complete (text without spaces, as Chinese or Japanese, never completes one)."""
    count, in_word = 0, False
    for i, ch in enumerate(text):
        if not ch.isspace():
            in_word = True
        elif in_word:
            count, in_word = count + 1, False
            if count == n:
                return i
    return None


def _is_abbreviation(text: str, dot: int) -> bool:
    """Whether the ``.`` at ``dot`` ends an abbreviation or an initial rather than a sentence."""
    start = dot
    while start > 0 and not text[start - 1].isspace() and text[start - 1] not in _CLOSERS:
        start -= 1
    token = text[start:dot].lstrip("\"'(“‘[").lower()
    if not token:
        return False
    if len(token) == 1 and token.isalpha():
        return True  # an initial: "J. Smith"
    if "." in token and all(len(p) == 1 and p.isalpha() for p in token.split(".")):
        return True  # "e.g", "i.e", "u.s"
    return token in ABBREVIATIONS


def split_text(text: str, granularity: Granularity, final: bool = False) -> tuple[list[str], str]:
    """Split ``text`` into complete units and the unfinished remainder; ``final`` flushes the remainder as a unit."""
    if granularity is Granularity.NONE:
        unit = text.strip()
        return ([unit] if unit else [], "") if final else ([], text)
    ascii_terms, wide_terms = _terminators(granularity)
    all_terms = ascii_terms | wide_terms | _ASCII_SENTENCE
    units: list[str] = []
    start = 0
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c not in ascii_terms and c not in wide_terms:
            i += 1
            continue
        j = i + 1
        while j < n and (text[j] in all_terms or text[j] in _CLOSERS):
            j += 1
        run = text[i:j]
        if any(ch in wide_terms for ch in run):
            cut = True  # wide terminators end a unit at once, even at the end of the buffer
        elif j == n:
            break  # the next character decides: wait for more text (or the flush)
        else:
            cut = text[j].isspace() and not (run.rstrip("".join(_CLOSERS)) == "." and _is_abbreviation(text, i))
        if cut:
            unit = text[start:j].strip()
            if unit:
                units.append(unit)
            start = j
        i = j
    rest = text[start:]
    if final:
        tail = rest.strip()
        return ([*units, tail] if tail else units), ""
    return units, rest


def limit_length(units: list[str], max_chars: int) -> list[str]:
    """Split units longer than ``max_chars``: at sentence ends first, then at the last space, then hard."""
    out: list[str] = []
    for unit in units:
        if len(unit) <= max_chars:
            out.append(unit)
            continue
        pieces, _ = split_text(unit, Granularity.SENTENCE, final=True)
        for piece in pieces if len(pieces) > 1 else [unit]:
            while len(piece) > max_chars:
                cut = piece.rfind(" ", 0, max_chars + 1)
                cut = cut if cut > 0 else max_chars
                out.append(piece[:cut].strip())
                piece = piece[cut:].strip()
            if piece:
                out.append(piece)
    return out


@dataclass(slots=True)
class TextSplitter:
    """Incremental splitter: ``feed`` returns the units completed so far, ``flush`` the rest."""

    granularity: Granularity = Granularity.NONE
    max_chars: int = 4096
    # The first unit ends at the first clause boundary (``,;``) or sentence end, whatever the granularity: a
    # spoken reply's first audio then waits for a clause, not a whole sentence.
    first_clause: bool = False
    _buffer: str = field(default="", init=False)
    _started: bool = field(default=False, init=False)

    @property
    def pending(self) -> str:
        """Buffered text not yet returned as a unit."""
        return self._buffer

    def feed(self, text: str) -> list[str]:
        units, self._buffer = self._split(self._buffer + text, False)
        return limit_length(units, self.max_chars)

    def flush(self) -> list[str]:
        units, self._buffer = self._split(self._buffer, True)
        return limit_length(units, self.max_chars)

    def _split(self, text: str, final: bool) -> tuple[list[str], str]:
        if not self.first_clause or self._started or self.granularity is Granularity.NONE:
            return split_text(text, self.granularity, final)
        units, rest = split_text(text, Granularity.CLAUSE, final)
        end = text.find(units[0]) + len(units[0]) if units else None  # units are stripped pieces of the text
        cut = end_of_words(text, FIRST_UNIT_MAX_WORDS)
        if cut is not None and (end is None or cut < end):
            first, end = text[:cut].strip(), cut
        elif units and end is not None:
            first = units[0]
        else:
            return units, rest
        self._started = True
        more, rest = split_text(text[end:], self.granularity, final)
        return [first, *more], rest

    def end_first(self) -> list[str]:
        """The first unit, ended where the text stands (what is buffered; nothing once the first unit went out)."""
        if self._started or not self._buffer.strip():
            return []
        self._started = True
        first, self._buffer = self._buffer.strip(), ""
        return [first]

    def clear(self) -> None:
        self._buffer = ""

    def restore(self, pending: str) -> None:
        """Put back the buffer a refused ``feed``/``flush`` started from (``pending`` as it was then)."""
        self._buffer = pending
