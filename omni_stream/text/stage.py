"""The text-generation stage every batched text family shares: one delta per generated token from a scheduler."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from omni_stream.chunks import TextDelta
from omni_stream.context import RequestContext
from omni_stream.pipeline import Stage
from omni_stream.scheduler import Scheduler


def text_generation_stage(
    scheduler: Scheduler,
    prepare: Callable[[RequestContext], Awaitable[Any]],
    name: str = "text",
    kind: str = "text",
) -> Stage[Any, TextDelta]:
    """Admit the request to ``scheduler`` and yield its text deltas (one item per generated token).

    ``await prepare(ctx)`` returns the payload (tokenized prompt) and counts the prompt tokens. Each item is one
    token: it counts into ``ctx.tokens(kind).output_tokens``; items with no text (a token that ends inside a UTF-8
    character, held back) are not passed on unless they are the last.
    """

    async def text(ctx: RequestContext, upstream: AsyncIterator[Any]) -> AsyncIterator[TextDelta]:
        payload = await prepare(ctx)
        usage = ctx.tokens(kind)
        async with scheduler.session(payload, ctx) as tokens:
            async for delta in tokens:
                usage.output_tokens += 1
                ctx.timings.steps += 1
                if delta.text or delta.final:
                    yield delta

    text.__name__ = name
    return text
