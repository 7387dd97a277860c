"""Whisper's prompt and text pieces: language names and codes, prompts, incremental detokenization, and the shapes
of the decoder call (the buckets captured as CUDA graphs)."""

from __future__ import annotations

import json

import pytest

from omni_stream.errors import ConfigError, InvalidRequestError
from omni_stream.models.whisper.checkpoint import build_tokenizer, generation_config, tiny_config
from omni_stream.models.whisper.detokenizer import Detokenizer
from omni_stream.models.whisper.prompt import WhisperTokens

SOT, EOT, EN, DE, TRANSCRIBE, PREV, NO_TS = 50258, 50257, 50259, 50261, 50359, 50361, 50363


@pytest.fixture(scope="module")
def tokens() -> WhisperTokens:
    return WhisperTokens.from_generation_config(generation_config(tiny_config()), 448)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(51865)


@pytest.mark.parametrize("name", ["en", "EN", "English", "english", "<|en|>", " en "])
def test_a_language_is_named_by_code_name_or_token(tokens, name):
    assert tokens.language_id(name) == EN


@pytest.mark.parametrize("name", [None, "", "auto", "Auto"])
def test_no_language_means_detect_it(tokens, name):
    assert tokens.language_id(name) is None and tokens.prompt(None).detect


def test_an_unknown_language_names_the_field(tokens):
    with pytest.raises(InvalidRequestError, match="klingon") as err:
        tokens.language_id("klingon")
    assert err.value.param == "language"


def test_prompts_follow_whispers_layout(tokens):
    assert tokens.prompt(DE).tokens() == (SOT, DE, TRANSCRIBE, NO_TS)
    detect = tokens.prompt(None)
    assert detect.tokens(EN) == (SOT, EN, TRANSCRIBE, NO_TS) and detect.length == 4
    with_context = tokens.prompt(EN, (1, 2, 3))
    assert with_context.tokens() == (PREV, 1, 2, 3, SOT, EN, TRANSCRIBE, NO_TS) and with_context.length == 8
    english_only = WhisperTokens.from_generation_config(generation_config(tiny_config(False, 51864), False), 448)
    assert english_only.prompt(english_only.language_id("en")).tokens() == (EOT, 50362)  # sot 50257, no ts 50362
    assert english_only.prompt(None).detect is False


def test_generation_config_needs_its_special_ids():
    gen = generation_config(tiny_config())
    del gen["no_timestamps_token_id"]
    with pytest.raises(ConfigError, match="no_timestamps_token_id"):
        WhisperTokens.from_generation_config(json.loads(json.dumps(gen)), 448)


def test_detokenizer_holds_a_split_character_back_and_drops_the_leading_space(tokenizer):
    ids = tokenizer(" café ok", add_special_tokens=False).input_ids
    detok = Detokenizer(tokenizer.backend_tokenizer.decode, EOT)
    pieces = [detok.push(i) for i in ids]
    assert "".join(pieces) == "café ok"
    split = [p for p, i in zip(pieces, ids, strict=True) if tokenizer.decode([i]) == "\ufffd"]
    assert "" in split  # the first byte of "é" alone is held back, then sent whole
    assert all("\ufffd" not in p for p in pieces)
    assert detok.push(SOT) == "" and detok.push(50500) == ""  # specials and timestamps are not text
    assert detok.flush() == "" and detok.text == "café ok"


def test_flush_sends_an_unfinished_character_at_the_end(tokenizer):
    first_byte = tokenizer(" é", add_special_tokens=False).input_ids[:-1]
    detok = Detokenizer(tokenizer.backend_tokenizer.decode, EOT)
    assert [detok.push(i) for i in first_byte][-1] == ""
    assert detok.flush() == "\ufffd"  # the stream ended inside a character: sent as the replacement character


def test_the_longest_prompt_keeps_half_the_positions_of_context(tokens):
    assert tokens.max_context == 223
    longest = tokens.prompt(EN, (7,) * tokens.max_context)
    assert tokens.max_prompt_length == longest.length == 228 == len(longest.tokens())
    english = WhisperTokens.from_generation_config(generation_config(tiny_config(False), multilingual=False), 448)
    assert english.max_prompt_length == 1 + 223 + 1 + 1  # <|startofprev|>, context, sot, no-timestamps


@pytest.mark.parametrize("slots", [1, 3, 8, 32])
def test_every_decoder_call_shape_is_one_of_the_captured_keys(slots):
    """Every (rows, width, span) a decoder call can need picks a bucket that covers it and is among the keys
    captured at load; nothing else is captured."""
    from omni_stream.models.whisper.shapes import DecodeShapes

    shapes = DecodeShapes.build(slots, 448, 228)
    keys = set(shapes.keys())
    assert len(keys) == len(shapes.keys())
    picked = set()
    for rows in range(1, slots + 1):
        for width in range(1, 229):
            for span in {width, width + 1, 63, 64, 65, 200, 300, 448} - set(range(width)):
                b, w, s = shapes.pick(rows, width, span)
                assert (b, w, s) in keys and b >= rows and w >= width and s >= span
                picked.add((b, w, s))
    assert picked == keys
    assert shapes.pick(slots + 1, 1, 1) is None and shapes.pick(1, 229, 229) is None and shapes.pick(1, 1, 449) is None
    assert shapes.widths == (1, 4, 8, 16, 32, 64, 128, 228) and shapes.spans == (64, 128, 256, 448)
    if slots == 32:
        assert len(keys) == 6 * (4 + 7)  # the module's count
