"""The rewrite bound's policy (:mod:`omni_stream.images.prompt_bound`) on the tiny CLIP tokenizer the image
checkpoints carry: the prefix kept fits, ends after a whole word, and the next word would not fit."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

pytest.importorskip("diffusers", reason="needs the [image] extra")

from omni_stream.chunks import TextDelta
from omni_stream.images.prompt_bound import fitting_prefix, may_exceed
from omni_stream.images.spec import prompt_of
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


async def test_the_prompt_the_image_model_reads_is_the_rewrite_as_the_client_saw_it(count):
    """``prompt_of`` joins the rewrite's deltas without stripping them: ``str.strip`` drops a trailing ``\\x1c`` that
    CLIP's tokenizer counts, so a stripped prompt's usage said one token fewer than the text the client saw (a random
    rewrite ended so). A rewrite of whitespace alone falls back to the request's prompt."""

    async def deltas(*texts: str) -> AsyncIterator[TextDelta]:
        for i, text in enumerate(texts):
            yield TextDelta(text, i)

    seen = ("snowy", " hills", "\x1c")
    prompt = await prompt_of(deltas(*seen), "fallback")
    assert prompt == "".join(seen) and count(prompt) == count("".join(seen))
    assert count(prompt) != count(prompt.strip())  # what the stripped prompt got wrong
    assert await prompt_of(deltas(" ", "\n"), "fallback") == "fallback"
    assert await prompt_of(deltas(), "fallback") == "fallback"
