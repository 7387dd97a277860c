"""The text-generation stage every batched text family shares (one delta per generated token from a scheduler),
and the tool-call parsing every text family that sees its model's raw text puts after it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import TypeVar

from omni_stream.chunks import TextDelta
from omni_stream.context import RequestContext
from omni_stream.pipeline import Stage
from omni_stream.scheduler import Scheduler
from omni_stream.text.tool_parsers import ToolCallParser, ToolFormat
from omni_stream.text.tools import ToolCallDelta

P = TypeVar("P")


def text_generation_stage(
    scheduler: Scheduler[P, TextDelta],
    prepare: Callable[[RequestContext], Awaitable[P]],
    name: str = "text",
    kind: str = "text",
) -> Stage[object, TextDelta]:
    """Admit the request to ``scheduler`` and yield its text deltas (one item per generated token).

    ``await prepare(ctx)`` returns the payload (tokenized prompt) and counts the prompt tokens. Each item is one
    token: it counts into ``ctx.tokens(kind).output_tokens``; items with no text (a token that ends inside a UTF-8
    character, held back) are not passed on unless they are the last.
    """

    async def text(ctx: RequestContext, upstream: AsyncIterator[object]) -> AsyncIterator[TextDelta]:
        payload = await prepare(ctx)
        usage = ctx.tokens(kind)
        async with scheduler.session(payload, ctx) as tokens:
            async for delta in tokens:
                usage.output_tokens += 1
                ctx.timings.steps += 1
                if delta.text or delta.final or delta.logprobs:
                    yield delta

    text.__name__ = name
    return text


def with_tool_calls(
    stage: Stage[object, TextDelta], format: ToolFormat, parallel: bool = True
) -> Stage[object, TextDelta]:
    """``stage``'s deltas with the tool calls in its text parsed out (:mod:`omni_stream.text.tool_parsers`).

    A call is handed out whole, as one :class:`~omni_stream.text.tools.ToolCallDelta` (its id, name and all of its
    arguments) in the delta where it completed; a reply that called a tool and then stopped ends with
    ``finish_reason="tool_calls"``. A call the reply ran out of tokens in (its closing tag never came) is not a call
    and not text to speak: the last delta carries it in ``cut_call``.
    """

    async def text(ctx: RequestContext, upstream: AsyncIterator[object]) -> AsyncIterator[TextDelta]:
        parser = ToolCallParser(format, parallel)
        async for delta in stage(ctx, upstream):
            shown, calls = parser.push(delta.text)
            cut = ""
            if delta.final:
                rest, more = parser.finish()
                cut = parser.cut_call  # the end of ``rest``: kept apart, so a spoken reply never speaks it
                shown, calls = shown + rest[: len(rest) - len(cut)], calls + more
            first = parser.calls - len(calls)
            pieces = tuple(ToolCallDelta(first + i, c.id, c.name, c.arguments) for i, c in enumerate(calls))
            if not (shown or pieces or delta.logprobs or delta.final):
                continue
            reason = delta.finish_reason
            if delta.final and parser.calls and reason == "stop":
                reason = "tool_calls"
            yield replace(delta, text=shown, finish_reason=reason, tool_calls=pieces, cut_call=cut)

    text.__name__ = getattr(stage, "__name__", "text")
    return text
