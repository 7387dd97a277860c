"""Speech stages every speech family shares: the talker (speech codes from a scheduler) and the windowed codec
decode."""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np
import torch

from omni_stream.chunks import Audio, CodecFrames
from omni_stream.context import RequestContext
from omni_stream.errors import StageError
from omni_stream.pipeline import Stage
from omni_stream.scheduler import Scheduler

P = TypeVar("P")


def talker_stage(
    scheduler: Scheduler[P, CodecFrames],
    prepare: Callable[[RequestContext], Awaitable[P]],
    name: str = "talker",
    kind: str = "speech",
) -> Stage[object, CodecFrames]:
    """Admit the request to ``scheduler`` and yield its items (codec frames) as steps produce them.

    ``await prepare(ctx)`` runs first and returns the scheduler payload (prompt building, voice prompts); while
    it runs the request counts as arriving (:meth:`Scheduler.arriving`). Each item counts its ``n_frames`` into
    ``ctx.tokens(kind).output_tokens`` and one step into ``ctx.timings.steps``.
    """

    async def talker(ctx: RequestContext, upstream: AsyncIterator[object]) -> AsyncIterator[CodecFrames]:
        # counted as arriving while prepared: newcomers of the same burst wait for it, so they prefill together
        with scheduler.arriving() as arrival:
            payload = await prepare(ctx)
            usage = ctx.tokens(kind)
            async with scheduler.session(payload, ctx, arrival) as frames:
                async for item in frames:
                    usage.output_tokens += item.n_frames
                    ctx.timings.steps += 1
                    yield item

    talker.__name__ = name
    return talker


@dataclass(slots=True, frozen=True)
class CodecWindow:
    """Frames ``[start_frame, start_frame + n_frames)`` of one request (window ``index``), as the talker emitted them.

    ``pieces`` are ``[k, n_codebooks]`` code tensors in frame order (views; join them where the decode runs).
    ``final``: known to be the request's last window when it is decoded (a decoder may then pad it: nothing is
    decoded after it); a window decoded before the next frame says so stays False even if it turns out last.
    """

    pieces: tuple[torch.Tensor, ...]
    start_frame: int
    n_frames: int
    index: int
    final: bool = False

    def codes(self) -> torch.Tensor:
        """The window's codes ``[n_frames, n_codebooks]`` in one tensor."""
        return self.pieces[0] if len(self.pieces) == 1 else torch.cat(self.pieces)


WindowDecode = Callable[[RequestContext, CodecWindow], Awaitable[np.ndarray]]
"""Decode one window of one request to float32 samples (on the device worker; bounded by ``ctx``'s deadlines)."""

DecoderFactory = Callable[[RequestContext], AbstractAsyncContextManager[WindowDecode]]
"""Opens one request's decoder (its codec state, a pool slot) for the life of the ``async with``."""


def _take_frames(held: deque[torch.Tensor], n: int) -> tuple[torch.Tensor, ...]:
    """Pop the pieces holding the next ``n`` frames (splitting one piece if a window ends inside it)."""
    out = []
    while n:
        piece = held[0]
        k = int(piece.shape[0])
        if k <= n:
            out.append(held.popleft())
            n -= k
        else:
            out.append(piece[:n])
            held[0] = piece[n:]
            n = 0
    return tuple(out)


def codec_stage(
    open_decoder: DecoderFactory,
    *,
    sample_rate: int,
    samples_per_frame: int,
    windows: Callable[[int], int],
    name: str = "codec",
) -> Stage[CodecFrames, Audio]:
    """Decode upstream codec frames in windows of ``windows(index)`` frames; yield :class:`Audio` per window.

    Windows follow the family's ramp: a small first window for time to first audio, then longer ones, each
    decoded by ``open_decoder``'s callable with the request's own decoder state. ``windows(index)`` is called
    when window ``index`` is about to be filled (window 0 when the first frames arrive). The last chunk carries
    ``final=True`` without delaying any chunk: a window that ends exactly on the frames received so far may be the
    last, so unless the talker marked its frame final it is decoded at once and handed on when the next frame (or
    the end of the stream) says which it is; the first window always goes out at once, and should nothing follow
    it, an empty final chunk marks the end.
    """

    async def codec(ctx: RequestContext, upstream: AsyncIterator[CodecFrames]) -> AsyncIterator[Audio]:
        async with open_decoder(ctx) as decode:
            held: deque[torch.Tensor] = deque()  # code pieces not decoded yet, in frame order
            n_held = index = start = expected = 0
            want: int | None = None  # asked for when the first frames arrive: a load-dependent size sees that moment

            async def flush(n: int, final: bool) -> Audio:
                nonlocal n_held, start, index, want
                window = CodecWindow(_take_frames(held, n), start, n, index, final)
                n_held -= n
                samples = await decode(ctx, window)
                audio = Audio(samples, sample_rate, start * samples_per_frame, final)
                start += n
                index += 1
                want = windows(index)
                return audio

            pending: Audio | None = None
            ended = False
            async for frames in upstream:
                if frames.start_frame != expected:
                    raise StageError(f"{name} stage expected frame {expected}, got {frames.start_frame}")
                expected += frames.n_frames
                held.append(frames.codes)
                n_held += frames.n_frames
                if pending is not None:
                    yield pending
                    pending = None
                if want is None:
                    want = windows(0)
                while n_held >= want:
                    more = n_held > want
                    last = not more and frames.final
                    audio = await flush(want, final=last)
                    if more or last or index == 1:
                        ended = last
                        yield audio
                    else:
                        pending = audio
            if pending is not None:  # nothing came after it (a later frame would have sent it on)
                yield replace(pending, final=True)
            elif n_held:
                yield await flush(n_held, final=True)
            elif not ended:
                # Nothing (more) was generated, e.g. EOS right after a window: an empty final chunk marks the end.
                yield Audio(np.zeros(0, np.float32), sample_rate, start * samples_per_frame, True)

    codec.__name__ = name
    return codec
