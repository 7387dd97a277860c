"""Sentence and clause splitting: pure functions, streamed and whole."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from omni_stream.chunks import TextDelta
from omni_stream.context import RequestContext
from omni_stream.speech.text_split import Granularity, TextSplitter, limit_length, split_text
from omni_stream.speech.text_stream import text_units

S, C, N = Granularity.SENTENCE, Granularity.CLAUSE, Granularity.NONE


def stream(text: str, granularity: Granularity, step: int = 1) -> list[str]:
    """Feed ``text`` in pieces of ``step`` characters, then flush; the units in order."""
    splitter = TextSplitter(granularity)
    units: list[str] = []
    for i in range(0, len(text), step):
        units += splitter.feed(text[i : i + step])
    return units + splitter.flush()


def test_sentence_ends_only_before_whitespace():
    assert split_text("Hello world. How are you? Fine", S) == (["Hello world.", "How are you?"], " Fine")


def test_unit_at_end_of_buffer_waits_for_next_character():
    assert split_text("Hello world.", S) == ([], "Hello world.")
    assert split_text("Hello world.", S, final=True) == (["Hello world."], "")


def test_decimals_never_split_even_when_streamed_char_by_char():
    text = "It costs 3.50 dollars. 你好。Next"
    assert stream(text, S) == ["It costs 3.50 dollars.", "你好。", "Next"]
    assert stream(text, S, step=len(text)) == ["It costs 3.50 dollars.", "你好。", "Next"]


def test_cjk_terminators_end_at_once():
    assert split_text("你好。世界！", S) == (["你好。", "世界！"], "")
    assert split_text("今日は晴れです。明日", S) == (["今日は晴れです。"], "明日")


def test_abbreviations_and_initials_do_not_split():
    text = "Mr. Smith met Dr. Jones, e.g. at noon. J. R. R. Tolkien wrote. Done"
    assert stream(text, S) == ["Mr. Smith met Dr. Jones, e.g. at noon.", "J. R. R. Tolkien wrote.", "Done"]


def test_punctuation_runs_and_closing_quotes_stay_with_their_unit():
    assert stream('Really?! Yes... "Quoted." (Aside.) End', S) == [
        "Really?!",
        "Yes...",
        '"Quoted."',
        "(Aside.)",
        "End",
    ]


def test_clause_adds_commas_and_semicolons():
    assert stream("One, two; three. 1,000 apples，好的；完", C) == [
        "One,",
        "two;",
        "three.",
        "1,000 apples，",
        "好的；",
        "完",
    ]


def test_sentence_mode_ignores_commas():
    assert stream("One, two; three.", S) == ["One, two; three."]


def test_none_buffers_until_flush():
    splitter = TextSplitter(N)
    assert splitter.feed("Hello world. ") == []
    assert splitter.feed("How are you? ") == []
    assert splitter.flush() == ["Hello world. How are you?"]
    assert splitter.flush() == []


def test_empty_and_whitespace_pieces_are_dropped():
    assert stream("  . !  Hi.  ", S) == [".", "!", "Hi."]
    assert TextSplitter(S).flush() == []


@pytest.mark.parametrize("granularity", [N, S, C])
def test_units_never_exceed_the_length_limit(granularity):
    text = ("word " * 30 + ". ") * 3
    splitter = TextSplitter(granularity, max_chars=50)
    units = splitter.feed(text) + splitter.flush()
    assert units and all(len(u) <= 50 for u in units)
    assert " ".join(units).split() == text.split()


def test_limit_length_hard_splits_a_long_word():
    assert limit_length(["x" * 25], 10) == ["x" * 10, "x" * 10, "x" * 5]


def test_first_clause_ends_the_first_unit_at_a_clause_then_splits_by_sentence():
    from omni_stream.speech.text_split import Granularity, TextSplitter

    splitter = TextSplitter(Granularity.SENTENCE, first_clause=True)
    assert splitter.feed("Well, I think") == ["Well,"]
    assert splitter.feed(" so, yes. And then,") == ["I think so, yes."]  # sentences from the second unit on
    assert splitter.flush() == ["And then,"]
    whole = TextSplitter(Granularity.SENTENCE, first_clause=True)
    assert whole.feed("No clause here. Next, one.") == ["No clause here."]  # a sentence end ends it too
    assert whole.flush() == ["Next, one."]
    assert TextSplitter(Granularity.NONE, first_clause=True).flush() == []  # NONE stays one unit


def test_the_first_unit_ends_after_its_twelfth_complete_word_when_no_clause_ends_sooner():
    from omni_stream.speech.text_split import FIRST_UNIT_MAX_WORDS, Granularity, TextSplitter, end_of_words

    words = [f"w{i}" for i in range(20)]
    splitter = TextSplitter(Granularity.SENTENCE, first_clause=True)
    assert splitter.feed(" ".join(words[:12])) == []  # the twelfth word may go on: not complete yet
    assert splitter.feed(" " + " ".join(words[12:15])) == [" ".join(words[:FIRST_UNIT_MAX_WORDS])]
    assert splitter.feed(" and the rest. Then") == [" ".join(words[12:15]) + " and the rest."]  # sentences after
    assert splitter.flush() == ["Then"]
    short = TextSplitter(Granularity.SENTENCE, first_clause=True)
    assert short.feed("Sure, " + " ".join(words)) == ["Sure,"]  # a clause within twelve words ends it first
    long_clause = TextSplitter(Granularity.SENTENCE, first_clause=True)
    assert long_clause.feed(" ".join(words) + ", then") == [" ".join(words[:12])]  # a later comma does not
    later = TextSplitter(Granularity.SENTENCE, first_clause=True)
    assert later.feed(" ".join(words[:3])) == [] and later.flush() == [" ".join(words[:3])]
    assert end_of_words("我想一想然后回答你", 1) is None and end_of_words("a  b ", 2) == 4
    assert TextSplitter(Granularity.SENTENCE).feed(" ".join(words) + " ") == []  # only a spoken reply's first unit


def test_the_first_unit_can_be_ended_where_the_text_stands():
    splitter = TextSplitter(Granularity.SENTENCE, first_clause=True)
    assert splitter.feed("zxqv blorp") == []
    assert splitter.end_first() == ["zxqv blorp"] and splitter.pending == ""
    assert splitter.end_first() == []  # once only
    assert splitter.feed(" more words, and more. Done") == ["more words, and more."]  # sentences from here on
    assert TextSplitter(Granularity.SENTENCE, first_clause=True).end_first() == []  # nothing written yet


async def test_text_units_end_the_first_unit_after_its_deltas_unless_a_clause_came_first():
    """``first_unit_deltas`` (a benchmark's bound for a random-weight model): the first unit goes out after that many
    deltas with no boundary in them; a clause before it still ends the first unit there; the units still join back
    to the text."""

    async def run(deltas: list[str], first: int | None) -> list[tuple[str, int]]:
        async def upstream() -> AsyncIterator[TextDelta]:
            for i, text in enumerate(deltas):
                yield TextDelta(text, i)

        stage = text_units(Granularity.SENTENCE, first_clause=True, first_unit_deltas=first)
        out, seen = [], 0
        async for unit in stage(RequestContext(), upstream()):
            seen += 1
            out.append((unit.text, seen))
        return out

    tokens = ["abc", "def", "ghi", "jkl", "mno", "pq."]
    assert await run(tokens, None) == [("abcdefghijklmnopq.", 1)]  # the whole reply is one unit
    units = await run(tokens, 3)
    assert [t for t, _ in units] == ["abcdefghi", "jklmnopq."] and "".join(t for t, _ in units) == "".join(tokens)
    with_clause = ["Sure,", " the", " weather", " is", " fine."]
    assert [t for t, _ in await run(with_clause, 3)] == ["Sure,", " the weather is fine."]
