"""Incremental detokenization and stop strings: never a broken character, deltas join to the full decode."""

from __future__ import annotations

import random

import pytest
from lm_helpers import load_tiny, tiny_lm_checkpoint

from omni_stream.models.causal_lm.detokenize import IncrementalDetokenizer, StopStrings, TextStream
from omni_stream.requests import TextRequest

MULTIBYTE = "Ünïcødé: 日本語テキスト, 中文 and emoji 🎉🙂👍🏽 — done."


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tiny(tiny_lm_checkpoint(tmp_path_factory, "qwen3")).tokenizer


def stream(tok, ids) -> list[str]:
    d = IncrementalDetokenizer(tok.decode)
    return [d.push(i) for i in ids] + [d.flush()]


def test_characters_split_across_tokens_are_held_until_complete(tok):
    ids = tok.encode(TextRequest(prompt=MULTIBYTE))
    pieces = [tok.decode([i]) for i in ids]
    assert sum("\ufffd" in p for p in pieces) >= 10  # many tokens end or start inside a character
    deltas = stream(tok, ids)
    assert "".join(deltas) == MULTIBYTE == tok.decode(ids)
    assert not any("\ufffd" in d for d in deltas)
    assert "" in deltas[:-1]  # some tokens completed no character and emitted nothing


def test_deltas_of_random_ids_join_to_the_full_decode_and_never_end_broken(tok):
    rng = random.Random(0)
    vocab = len(tok)
    for _ in range(300):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
        full = tok.decode(ids)
        d = IncrementalDetokenizer(tok.decode)
        emitted = ""
        for i in ids:
            delta = d.push(i)
            # emitted text is never taken back (a prefix of the final text) and never ends inside a character
            assert not delta.endswith("\ufffd")
            emitted += delta
            assert full.startswith(emitted)
        assert emitted + d.flush() == full


def test_special_tokens_add_no_text(tok):
    end = tok.encode(TextRequest(prompt="<|im_end|>"))
    assert len(end) == 1
    ids = tok.encode(TextRequest(prompt="Hi")) + end + tok.encode(TextRequest(prompt=" there"))
    assert "".join(stream(tok, ids)) == "Hi there"


def test_stop_strings_cut_before_the_first_match_and_hold_back_possible_starts():
    s = StopStrings(["STOP", "xy"])
    assert s.push("abc") == ("abc", False)
    assert s.push("ST") == ("", False)  # could begin STOP
    assert s.push("Oq") == ("STOq", False)  # it did not
    assert s.push("zzx") == ("zz", False)
    assert s.push("y and more") == ("", True)  # "xy" across two pushes ends the text before it
    s = StopStrings(["bc", "abcd"])
    assert s.push("xabcd") == ("x", True)  # the earliest match wins ("abcd" at 1, before "bc" at 2)
    s = StopStrings(["end"])
    assert s.push("the en") == ("the ", False) and s.flush() == "en"


def test_text_stream_finish_flushes_held_text_and_finds_a_late_stop(tok):
    ids = tok.encode(TextRequest(prompt="say 日本 ok"))
    ts = TextStream(tok.decode, stop=("ok!",))
    out = "".join(ts.push(i)[0] for i in ids)
    rest, stopped = ts.finish()
    assert out + rest == "say 日本 ok" and not stopped
    ts = TextStream(tok.decode, stop=("本",))
    pieces = [ts.push(i) for i in ids]
    stop_at = next(k for k, (_, hit) in enumerate(pieces) if hit)
    assert "".join(p for p, _ in pieces[: stop_at + 1]) == "say 日"
