"""The rewrite bound's policy (:mod:`omni_stream.images.prompt_bound`) on the tiny CLIP tokenizer the image
checkpoints carry: the prefix kept fits, ends after a whole word, and the next word would not fit."""

from __future__ import annotations

import pytest

pytest.importorskip("diffusers", reason="needs the [image] extra")

from omni_stream.images.prompt_bound import fitting_prefix, may_exceed
from omni_stream.models.diffusers_image.text_tokenizers import clip_tokenizer

LIMIT = 77


@pytest.fixture(scope="module")
def count():
    tokenizer = clip_tokenizer()
    return lambda text: len(tokenizer(text, verbose=False).input_ids)


def test_a_long_prompt_is_cut_after_the_last_whole_word_that_fits(count):
    words = [f"word{i}" for i in range(200)]
    text = " ".join(words)
    kept = fitting_prefix(text, count, LIMIT)
    assert count(kept) <= LIMIT < count(text)
    n = len(kept.split())
    assert kept == " ".join(words[:n]) and count(" ".join(words[: n + 1])) > LIMIT


def test_a_prompt_that_fits_is_kept_whole_and_a_single_long_word_is_cut_inside(count):
    assert fitting_prefix("a red kite", count, LIMIT) == "a red kite"
    word = "x" * 2000  # one word longer than the limit: cut inside it
    kept = fitting_prefix(word, count, LIMIT)
    assert 0 < len(kept) and count(kept) <= LIMIT < count(kept + "x")


def test_only_a_text_of_more_bytes_than_the_limit_is_counted():
    assert not may_exceed("a" * (LIMIT - 2), LIMIT) and may_exceed("a" * (LIMIT - 1), LIMIT)
