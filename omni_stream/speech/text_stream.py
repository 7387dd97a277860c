"""Speech of streamed text: split deltas into units, synthesize each unit while the previous one plays.

Two stages, used wherever text arrives a piece at a time (an LLM's reply, a realtime session, a streamed
``SpeechRequest.text``):

- :func:`text_units` ``Stage[TextDelta, TextDelta]``: joins deltas and yields one delta per complete unit
  (sentence or clause, :mod:`omni_stream.speech.text_split`), the rest when the text ends; units join back to the text.
- :func:`speak_units` ``Stage[TextDelta, TextDelta | Audio]``: runs one speech request per unit on a speech
  family (its own pipeline, a child context of the request) and yields, for each unit, the unit's text (its
  transcript: the transcripts join to the whole text) and then its audio, re-based so samples count from the
  start of the whole reply.

Pipelining and run-ahead. While unit ``k`` streams, unit ``k + 1`` is already synthesizing (``lookahead`` units,
default 1), so there is no stall between sentences; no further unit is taken from upstream until one finishes.
With a stalled reader the bound is therefore: the current and next units' speech pipelines (each at most its
talker watermark plus one codec window), one unit in ``text_units``' hands, and whatever the text stage upstream
may buffer (its own scheduler watermark): backpressure reaches the LLM.

Cancellation: leaving the stage (any way) cancels the open unit requests synchronously; their slots are also
released by the parent request's ``release_now`` (children of its context), so an abort frees every model's slot
before the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import numpy as np

from omni_stream.chunks import Audio, TextDelta
from omni_stream.context import RequestContext
from omni_stream.family import SpeechFamily
from omni_stream.pipeline import PipelineStream, Stage
from omni_stream.requests import SpeechRequest
from omni_stream.speech.text_split import Granularity, TextSplitter

UNIT_MAX_CHARS = 2000  # a unit longer than this is cut (at a sentence end, else a space) before synthesis


def text_units(
    split: Granularity | str = Granularity.SENTENCE,
    max_chars: int = UNIT_MAX_CHARS,
    *,
    first_clause: bool = False,
    first_unit_deltas: int | None = None,
) -> Stage[TextDelta, TextDelta]:
    """Join upstream text deltas into units; the last unit (possibly empty) is marked ``final``; ``first_clause``:
    the first unit ends at the first clause boundary (:class:`~omni_stream.speech.text_split.TextSplitter`);
    ``first_unit_deltas`` (benchmarks: :attr:`~omni_stream.requests.SpokenReply.first_unit_tokens`): it ends after
    that many deltas at the latest.

    Each unit's ``text`` is its piece of the original text, whitespace before it included, so the units join
    back to the text exactly (the last one also carries any trailing whitespace); what is spoken is its
    stripped form.
    """
    granularity = Granularity(split)

    async def units(ctx: RequestContext, upstream: AsyncIterator[TextDelta]) -> AsyncIterator[TextDelta]:
        splitter = TextSplitter(granularity, max_chars, first_clause)
        raw, cursor, index = "", 0, 0

        def piece(unit: str) -> str:
            nonlocal cursor
            pos = raw.find(unit, cursor)
            if pos < 0:  # not a substring (the splitter only strips and cuts, so this does not happen)
                return unit
            start, cursor = cursor, pos + len(unit)
            return raw[start:cursor]

        deltas = 0
        async for delta in upstream:
            raw += delta.text
            deltas += 1
            units = splitter.feed(delta.text)
            if deltas == first_unit_deltas:
                units += splitter.end_first()
            for unit in units:
                yield TextDelta(piece(unit), index)
                index += 1
        rest = splitter.flush()
        for i, unit in enumerate(rest):
            text = piece(unit)
            last = i == len(rest) - 1
            yield TextDelta(text + raw[cursor:] if last else text, index, final=last)
            index += 1
        if not rest:
            yield TextDelta(raw[cursor:], index, final=True)  # marks the end when the last unit went out unmarked

    units.__name__ = "units"
    return units


UnitRequest = Callable[[str, str], SpeechRequest]
"""``make(text, request_id) -> SpeechRequest`` for one unit."""


def speak_units(family: SpeechFamily, make: UnitRequest, *, lookahead: int = 1) -> Stage[TextDelta, TextDelta | Audio]:
    """Synthesize each upstream unit on ``family`` as its own request; yield its transcript, then its audio."""
    if lookahead < 0:
        raise ValueError(f"lookahead must be >= 0, got {lookahead}")
    rate = family.info.sample_rate

    async def speak(ctx: RequestContext, upstream: AsyncIterator[TextDelta]) -> AsyncIterator[TextDelta | Audio]:
        open_units: deque[tuple[TextDelta, PipelineStream[Audio]]] = deque()
        unit_task: asyncio.Future[TextDelta] | None = None
        chunk_task: asyncio.Future[Audio] | None = None  # the next chunk of the oldest open unit
        upstream_done = False
        offset = 0  # samples already yielded
        index = 0  # units started
        ended = True  # nothing yielded yet, or the last yield was final

        def start(unit: TextDelta) -> None:
            nonlocal index
            if ctx.timings.handed_off is None:  # the model upstream now waits on this unit's audio (device_policy)
                ctx.timings.handed_off = time.perf_counter()
            child = ctx.child(f"{ctx.request_id}.{index}")
            index += 1
            request = make(unit.text.strip(), child.request_id)
            stream = family.speech_stages(request, child).run(child, channel_size=0)
            stream.start()  # synthesis begins now, while earlier units stream
            open_units.append((unit, stream))

        try:
            while True:
                if unit_task is None and not upstream_done and len(open_units) <= lookahead:
                    unit_task = asyncio.ensure_future(anext(upstream))
                if not open_units and unit_task is None:
                    break
                if open_units and chunk_task is None:
                    chunk_task = asyncio.ensure_future(anext(open_units[0][1]))
                waiting: set[asyncio.Future[Any]] = {t for t in (unit_task, chunk_task) if t is not None}
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if unit_task is not None and unit_task in done:
                    next_unit, unit_task = unit_task, None
                    try:
                        unit = next_unit.result()
                    except StopAsyncIteration:
                        upstream_done = True
                    else:
                        if unit.text.strip():
                            start(unit)
                    continue
                assert chunk_task is not None
                next_chunk, chunk_task = chunk_task, None
                unit, _stream = open_units[0]
                try:
                    audio = next_chunk.result()
                except StopAsyncIteration:
                    open_units.popleft()
                    continue
                if audio.start_sample == 0:
                    ended = False
                    yield TextDelta(unit.text, unit.index)  # the transcript, just before its audio
                last = audio.final and upstream_done and len(open_units) == 1 and unit_task is None
                yield replace(audio, start_sample=offset, final=last)
                ended = last
                offset += audio.n_samples
            if not ended:
                yield Audio(np.zeros(0, np.float32), rate, offset, final=True)  # the end of the last unit
        finally:
            for task in (unit_task, chunk_task):
                if task is not None:
                    task.cancel()
                    if task.done():
                        with contextlib.suppress(BaseException):
                            task.exception()  # retrieved, so asyncio does not log it
            for _, stream in open_units:
                stream.cancel()  # synchronous: the unit's slots go back before the next step

    speak.__name__ = "speech"
    return speak
