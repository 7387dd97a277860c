"""The stage every batched ASR family shares: collect the utterance, prepare it off the loop, decode on a scheduler.

A :class:`~omni_stream.transcription.spec.TranscriptionRequest` carries the whole utterance (samples at
``request.sample_rate``) or streams it (its upstream: :class:`~omni_stream.chunks.Audio` chunks, any rate, mono
or not). :func:`collect_utterance` gathers it until the stream ends (a chunk marked ``final``, or the end of the
iterator), refuses more than ``max_seconds`` as soon as it is passed, and resamples it to the model's rate in a
thread. :func:`batched_transcription_stage` then awaits ``prepare(ctx, samples)`` (feature extraction, in a
thread; it counts the input tokens) and yields the scheduler's text deltas, one item per generated token
(counted in ``ctx.tokens("transcription").output_tokens``), or one for all the tokens that waited for it when its
reader fell behind; items with no text are passed on only when final. While its features are made the request counts
as arriving on the scheduler (:meth:`~omni_stream.scheduler.Scheduler.arriving`), so newcomers may wait for it (the
scheduler's ``hold``) and utterances that ended together are encoded in one pass.
Leaving the stage any way releases the sequence (its batch slot is free before the next step).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import anyio
import numpy as np

from omni_stream.chunks import Audio, TextDelta
from omni_stream.context import RequestContext
from omni_stream.errors import InvalidRequestError
from omni_stream.family import ModelKind
from omni_stream.pipeline import Stage
from omni_stream.scheduler import Scheduler
from omni_stream.transcription.spec import TranscriptionRequest
from omni_stream.validation.audio import mono_float

P = TypeVar("P")


def check_samples(request: TranscriptionRequest, max_seconds: float) -> None:
    """Raise InvalidRequestError (``audio``) unless the request's whole-utterance samples are finite and short
    enough; cheap enough to run before anything streams. Streamed audio is checked as it arrives."""
    if request.streamed:
        return
    assert isinstance(request.audio, np.ndarray)
    seconds = request.audio.size / request.sample_rate
    if seconds > max_seconds:
        raise InvalidRequestError(
            f"audio lasts {seconds:.1f} s; this model transcribes at most {max_seconds:g} s", "audio"
        )


def _whole(audio: np.ndarray, rate: int, target: int) -> np.ndarray:
    return _resampled([audio], rate, target)  # mono float32 since the request was built


def _resampled(pieces: list[np.ndarray], rate: int, target: int) -> np.ndarray:
    samples = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
    if rate != target:
        from omni_stream.codecs import resample

        samples = resample(samples, rate, target)
    return np.ascontiguousarray(samples, dtype=np.float32)


async def collect_utterance(
    request: TranscriptionRequest, upstream: AsyncIterator[Audio], sample_rate: int, max_seconds: float
) -> np.ndarray:
    """The whole utterance as float32 mono at ``sample_rate`` Hz (see module docstring)."""
    if not request.streamed:
        audio = request.audio
        assert isinstance(audio, np.ndarray)
        if request.sample_rate == sample_rate and audio.ndim == 1 and audio.dtype == np.float32:
            return np.ascontiguousarray(audio)  # as the model takes it (a voice agent's turns): no thread hop
        return await anyio.to_thread.run_sync(_whole, audio, request.sample_rate, sample_rate)
    pieces: list[np.ndarray] = []
    rate: int | None = None
    n = 0
    async for chunk in upstream:
        if rate is None:
            rate = chunk.sample_rate
        elif chunk.sample_rate != rate:
            raise InvalidRequestError(f"audio chunks changed rate from {rate} to {chunk.sample_rate} Hz", "audio")
        piece = mono_float(chunk.samples)
        if piece.size:
            pieces.append(piece)
            n += piece.size
            if n / rate > max_seconds:
                raise InvalidRequestError(f"audio stream passed the {max_seconds:g} s this model transcribes", "audio")
        if chunk.final:
            break
    if not pieces or rate is None:
        raise InvalidRequestError("the audio stream ended without any audio", "audio")
    return await anyio.to_thread.run_sync(_resampled, pieces, rate, sample_rate)


def joined(first: TextDelta, then: TextDelta) -> TextDelta:
    """Two consecutive deltas of one transcript as one: the text and log-probabilities of both, the later one's
    index and ending."""
    return TextDelta(
        first.text + then.text, then.index, then.final, then.finish_reason, logprobs=first.logprobs + then.logprobs
    )


def batched_transcription_stage(
    scheduler: Scheduler[P, TextDelta],
    request: TranscriptionRequest,
    prepare: Callable[[RequestContext, np.ndarray], Awaitable[P]],
    *,
    sample_rate: int,
    max_seconds: float,
    name: str = "transcription",
) -> Stage[Audio, TextDelta]:
    """A ``Stage[Audio, TextDelta]`` for ``request`` on ``scheduler`` (see module docstring)."""

    async def transcription(ctx: RequestContext, upstream: AsyncIterator[Audio]) -> AsyncIterator[TextDelta]:
        samples = await collect_utterance(request, upstream, sample_rate, max_seconds)
        # Counted as arriving while its features are made: newcomers already waiting wait for it (at most the
        # scheduler's hold), so utterances that ended together (many sessions pausing at once) share one encoder
        # pass; an utterance with nothing else in preparation goes in at once.
        # (Not counted where the scheduler never holds: an arriving request reads as realtime work about to come;
        # nor for a bulk request, which no conversation's turn waits for.)
        holds = scheduler.hold and not request.bulk
        with scheduler.arriving() if holds else contextlib.nullcontext() as arrival:
            payload = await prepare(ctx, samples)
            usage = ctx.tokens(ModelKind.TRANSCRIPTION)
            async with scheduler.session(payload, ctx, arrival, bulk=request.bulk) as deltas:
                async for delta in deltas:
                    usage.output_tokens += 1
                    ctx.timings.steps += 1
                    # Tokens that waited for this stage go on as one delta: downstream every delta costs the event
                    # loop a round trip (a voice agent's session sends an event per delta). In voice_bench run 46
                    # the model had made 32 sessions' transcripts, a delta a token, ~50 ms before the sessions had
                    # read them.
                    while deltas.buffered and not delta.final:
                        more = await anext(deltas)
                        usage.output_tokens += 1
                        ctx.timings.steps += 1
                        delta = joined(delta, more)
                    if delta.text or delta.final:
                        yield delta

    transcription.__name__ = name
    return transcription
