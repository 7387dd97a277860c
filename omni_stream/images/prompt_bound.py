"""The bound on a text model's rewrite of an image prompt: the image model's text encoder reads at most
``ImageInfo.max_prompt_tokens`` of its own tokens (CLIP: 77, start and end included) and cuts the rest without a
word, so the rewrite stops where the prompt is full.

:func:`bounded_rewrite` is the stage between the text model and the image model: it passes the rewrite's deltas on
until the next one would not fit, then passes the part that fits (cut after a whole word when one fits) as the
last delta, with ``finish_reason`` :data:`PROMPT_LIMIT`, and ends; ending closes its upstream, which stops the text
model's generation. Counting runs in a worker thread, and only once the text could be over the limit (a token is
at least one byte, so a text of fewer UTF-8 bytes than the limit minus the specials fits).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Sequence

import anyio.to_thread

from omni_stream.chunks import TextDelta
from omni_stream.context import RequestContext
from omni_stream.pipeline import Stage

PROMPT_LIMIT = "prompt_limit"  # finish_reason of the last delta when the bound stopped the rewrite
SPECIAL_TOKENS = 2  # start and end tokens an encoder adds (the byte test below allows for them)

Counter = Callable[[str], int]  # tokens of a text in the encoder's tokens, specials included


def _longest(text: str, cuts: Sequence[int], count: Counter, limit: int) -> int:
    """The largest cut in ``cuts`` (ascending) whose prefix fits ``limit`` (0: none does); binary search, since a
    longer prefix never has fewer tokens."""
    lo, hi = 0, len(cuts)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(text[: cuts[mid - 1]]) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return cuts[lo - 1] if lo else 0


def fitting_prefix(text: str, count: Counter, limit: int) -> str:
    """The longest prefix of ``text`` of at most ``limit`` tokens: cut after a whole word, or inside the first word
    when even that does not fit. Blocking (tokenizes): run it off the event loop."""
    if count(text) <= limit:
        return text
    cut = _longest(text, [m.end() for m in re.finditer(r"\S+", text)], count, limit)
    if cut == 0:
        cut = _longest(text, range(1, len(text) + 1), count, limit)
    return text[:cut]


def may_exceed(text: str, limit: int) -> bool:
    """Whether ``text`` could be over ``limit`` tokens (False: it surely fits, no need to count)."""
    return len(text.encode("utf-8", "surrogatepass")) + SPECIAL_TOKENS > limit


def bounded_rewrite(count: Counter, limit: int) -> Stage[TextDelta, TextDelta]:
    """The stage that bounds a rewrite to ``limit`` tokens of ``count`` (see the module docstring)."""

    async def bound(ctx: RequestContext, upstream: AsyncIterator[TextDelta]) -> AsyncIterator[TextDelta]:
        text = ""
        async for delta in upstream:
            candidate = text + delta.text
            if may_exceed(candidate, limit):
                kept = await anyio.to_thread.run_sync(fitting_prefix, candidate, count, limit)
                if len(kept) < len(candidate):
                    yield TextDelta(kept[len(text) :], delta.index, final=True, finish_reason=PROMPT_LIMIT)
                    return
            text = candidate
            yield delta

    return bound
