"""Stages every model family shares."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from omni_stream.context import RequestContext
from omni_stream.pipeline import Stage
from omni_stream.scheduler import Scheduler


def talker_stage(
    scheduler: Scheduler, prepare: Callable[[RequestContext], Awaitable[Any]], name: str = "talker"
) -> Stage:
    """Admit the request to ``scheduler`` and yield its items (codec frames) as steps produce them.

    ``await prepare(ctx)`` runs first and returns the scheduler payload (prompt building, voice prompts).
    Each item counts its ``n_frames`` into ``ctx.output_tokens`` and one step into ``ctx.timings.steps``.
    """

    async def talker(ctx: RequestContext, upstream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        payload = await prepare(ctx)
        async with scheduler.session(payload, ctx) as frames:
            async for item in frames:
                ctx.output_tokens += item.n_frames
                ctx.timings.steps += 1
                yield item

    talker.__name__ = name
    return talker
