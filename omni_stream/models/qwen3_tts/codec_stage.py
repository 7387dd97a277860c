"""The Qwen3-TTS codec decode; the talker and the windowing loop are the shared ones (``omni_stream.speech.stages``).

Windows of new frames are decoded with each request's full decoder state (conv histories, transposed-conv
overlap, sliding-window K/V), so the streamed waveform equals the whole-utterance decode whatever the window
sizes (``codec_stream``). Windows follow a ramp (``initial_codec_chunk_frames`` doubling up to
``steady_frames``): a small first window for time to first audio, then longer ones that each arrive before the
audio already sent runs out; the first window's size follows the load when the request does not fix it
(:func:`~.codec_stream.first_window_frames`). Windows of equal length from different requests are decoded
together in one batched worker job. With a :class:`CodecWindows` (slot-indexed states, CUDA graphs per window
bucket on GPU) a request holds one state row for its lifetime instead of a private state; with
:class:`~omni_stream.runtime.gpu_completions.Completions` as well, the worker only launches a job (on the
codec stream) and collects its audio after the next talker step, so codec work overlaps the talker's steps;
a job that holds a request's first window is waited for at once instead (time to first audio).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from omni_stream.chunks import Audio, CodecFrames
from omni_stream.context import RequestContext
from omni_stream.models.qwen3_tts.codec import CodecDecoder
from omni_stream.models.qwen3_tts.codec_graphs import CodecWindows
from omni_stream.models.qwen3_tts.codec_stream import (
    CodecStreamState,
    FirstWindow,
    decode_windows,
    first_window_frames,
    prime,
    ramp_window,
)
from omni_stream.pipeline import Stage
from omni_stream.runtime.gpu_completions import Completions
from omni_stream.speech.stages import CodecWindow as SharedWindow
from omni_stream.speech.stages import WindowDecode
from omni_stream.speech.stages import codec_stage as shared_codec_stage
from omni_stream.worker import DeviceWorker


@dataclass(slots=True)
class ReferenceCodes:
    """One request's ICL reference codes (``[T, 16]`` int64), set by the talker stage's prompt before its first
    frame and read by the codec stage to prime the decoder; None when the request clones no reference audio."""

    codes: np.ndarray | None = None


@dataclass(slots=True, eq=False)
class PrivateState:
    """A request's own decoder state, made by the worker's first job for it: zeroing the histories of every
    block takes ~1 ms on CPU, which the event loop would pay per request when a burst arrives."""

    state: CodecStreamState | None = None

    def get(self, decoder: CodecDecoder) -> CodecStreamState:
        if self.state is None:
            self.state = CodecStreamState.zeros(decoder, 1)
        return self.state


Codes = torch.Tensor | tuple[torch.Tensor, ...]
"""A window's codes ``[n, 16]``: one tensor, or the talker's pieces in frame order, joined by the worker's job."""
Context = torch.Tensor | np.ndarray | None
"""ICL reference codes ``[T, 16]`` to feed before a request's first window (made a tensor by the worker's job)."""


def _joined(codes: Codes) -> torch.Tensor:
    """A window's codes as one tensor: the pieces are joined here, in the worker's job, never on the event loop."""
    if isinstance(codes, torch.Tensor):
        return codes
    return codes[0] if len(codes) == 1 else torch.cat(codes)


def _context(context: Context) -> torch.Tensor | None:
    return None if context is None else torch.as_tensor(context, dtype=torch.long)


@dataclass(slots=True, eq=False)
class CodecWindow:
    """One request's next window: ``codes [n, 16]``; ``context`` frames are fed first without output (ICL)."""

    state: PrivateState
    codes: Codes
    context: Context = None


@dataclass(slots=True, eq=False)
class SlotWindow:
    """One request's next window on a :class:`CodecWindows` row; ``fresh`` marks its first window."""

    slot: int
    codes: Codes
    fresh: bool
    context: Context = None
    first: bool = False  # the request's first window: its job is waited for at once
    final: bool = False  # the request's last window: the row is not decoded again (it may be padded)
    audio: concurrent.futures.Future[np.ndarray] = field(default_factory=concurrent.futures.Future)


class LiveCount:
    """Requests of one family with an open codec stage (the load the first window follows); event loop only."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


def _prime_contexts(pool: CodecWindows, jobs: list[SlotWindow]) -> None:
    for job in jobs:
        context = _context(job.context)
        if context is not None:
            pool.prime(job.slot, context)
            job.context, job.fresh = None, False


def decode_slot_windows(pool: CodecWindows, jobs: list[SlotWindow]) -> list[np.ndarray]:
    """Batched job (device worker): equal-length windows of several requests, each on its own state row."""
    _prime_contexts(pool, jobs)
    return pool.decode(
        [j.slot for j in jobs], [_joined(j.codes) for j in jobs], [j.fresh for j in jobs], [j.final for j in jobs]
    )


def _settle(future: concurrent.futures.Future[np.ndarray], audio: np.ndarray | None, error: BaseException | None):
    if future.done():  # its request gave up waiting (wrap_future cancelled it)
        return
    try:
        if error is not None or audio is None:
            future.set_exception(error or RuntimeError("codec job returned no audio"))
        else:
            future.set_result(audio)
    except concurrent.futures.InvalidStateError:  # cancelled meanwhile
        pass


def issue_slot_windows(
    pool: CodecWindows, jobs: list[SlotWindow], completions: Completions
) -> list[concurrent.futures.Future[np.ndarray]]:
    """Batched job (device worker): launch the windows on the pool's stream; each job's ``audio`` future is
    settled when ``completions`` collects the job (after a talker step), or before returning when a window of
    the job is its request's first (the wait is then the first chunk's latency, which nothing should add to)."""
    _prime_contexts(pool, jobs)
    pending = pool.issue(
        [j.slot for j in jobs], [_joined(j.codes) for j in jobs], [j.fresh for j in jobs], [j.final for j in jobs]
    )

    def then(error: BaseException | None) -> None:
        if error is not None:
            for job in jobs:
                _settle(job.audio, None, error)
            return
        try:
            arrays = pending.arrays()
        except BaseException as exc:
            for job in jobs:
                _settle(job.audio, None, exc)
            return
        for job, audio in zip(jobs, arrays, strict=True):
            _settle(job.audio, audio, None)

    if pending.event is None:
        then(None)
    elif any(j.first for j in jobs):
        error: BaseException | None = None
        try:
            pending.event.synchronize()
        except BaseException as exc:
            error = exc
        then(error)
    else:
        completions.watch(pending.event, then)
    return [j.audio for j in jobs]


def decode_codec_windows(decoder: CodecDecoder, windows: list[CodecWindow]) -> list[np.ndarray]:
    """Batched job (device worker): decode equal-length windows of several requests, each with its own state."""
    states = [w.state.get(decoder) for w in windows]
    for w, state in zip(windows, states, strict=True):
        context = _context(w.context)
        if context is not None:
            prime(decoder, context.T.unsqueeze(0), state)
            w.context = None
    device = next(decoder.parameters()).device
    codes = [_joined(w.codes).T.unsqueeze(0).to(device) for w in windows]
    audio = decode_windows(decoder, codes, states)
    return [a[0].cpu().numpy().astype(np.float32, copy=False) for a in audio]


@dataclass(slots=True, frozen=True)
class DecoderKey:
    """The first part of a codec job's batch key: jobs batch with the same decoder's only. Printed as the family's
    name in the worker's log and profiles (the object's id told a reader nothing)."""

    decoder_id: int

    def __repr__(self) -> str:
        return "qwen3-codec"


def codec_stage(
    decoder: CodecDecoder,
    worker: DeviceWorker,
    *,
    sample_rate: int,
    samples_per_frame: int,
    initial_frames: int | None,
    steady_frames: int,
    pool: CodecWindows | None = None,
    reference: ReferenceCodes | None = None,
    completions: Completions | None = None,
    live: LiveCount | None = None,
    first_window: Callable[[int], int] = first_window_frames,
    decided: FirstWindow | None = None,
) -> Stage[CodecFrames, Audio]:
    """The shared windowed codec stage over this decoder, with exact streaming state and a doubling ramp.

    ``initial_frames``: the first window (None: ``first_window(load)`` with ``load`` the requests counted in
    ``live`` when the first frames arrive, this one included). ``pool``: shared slot-indexed states
    (graph-replayed windows on CUDA); requests that find it full, or all requests without one, keep a private
    state. ``completions``: with a pool, jobs are only launched by the worker and their audio collected by it
    after its next talker step (codec work overlaps talker steps). ``reference``: ICL codes that prime the
    first window. ``decided``: the request's first window as the talker runner decided it (its ``requested`` is
    ``initial_frames``); the first window's job is submitted as urgent (the worker may wait for it between steps).
    """
    key_prefix = DecoderKey(id(decoder))
    chosen: list[int] = []  # the first window, once known

    def windows(index: int) -> int:
        if not chosen:
            load = live.value if live is not None else 1
            if decided is not None:
                chosen.append(decided.decide(load, first_window))
            else:
                chosen.append(initial_frames if initial_frames is not None else first_window(load))
        return ramp_window(index, chosen[0], max(steady_frames, chosen[0]))

    def batch_fn(windows: list[CodecWindow]) -> list[np.ndarray]:
        return decode_codec_windows(decoder, windows)

    def slot_batch_fn(jobs: list[SlotWindow]) -> list[np.ndarray]:
        assert pool is not None
        return decode_slot_windows(pool, jobs)

    def slot_issue_fn(jobs: list[SlotWindow]) -> list[concurrent.futures.Future[np.ndarray]]:
        assert pool is not None and completions is not None
        return issue_slot_windows(pool, jobs, completions)

    @asynccontextmanager
    async def open_decoder(ctx: RequestContext) -> AsyncIterator[WindowDecode]:
        slot = pool.acquire() if pool is not None else None
        # A private state lives with this request alone: a cancelled window job can only touch this object.
        state = PrivateState() if slot is None else None

        async def decode(ctx: RequestContext, window: SharedWindow) -> np.ndarray:
            # The window's pieces and the reference go to the worker as they are: joining and converting them is
            # tensor work, which runs in the job, not here on the event loop.
            codes, n = window.pieces, window.n_frames
            context: Context = None
            if window.index == 0 and reference is not None and reference.codes is not None:
                context = reference.codes  # set by the talker's prompt
            first = window.index == 0
            with ctx.fail_after("codec decode"):
                if slot is None:
                    assert state is not None
                    item = CodecWindow(state, codes, context)
                    return await worker.submit_batched((key_prefix, n), item, batch_fn, urgent=first)
                job = SlotWindow(slot, codes, first, context, first=first, final=window.final)
                if completions is None:
                    return await worker.submit_batched((key_prefix, "slots", n), job, slot_batch_fn, urgent=first)
                issued = await worker.submit_batched((key_prefix, "issue", n), job, slot_issue_fn, urgent=first)
            return await ctx.wait(asyncio.wrap_future(issued), "codec decode")

        if live is not None:
            live.value += 1
        try:
            yield decode
        finally:
            if live is not None:
                live.value -= 1
            if slot is not None:
                assert pool is not None
                pool.release(slot)

    return shared_codec_stage(
        open_decoder,
        sample_rate=sample_rate,
        samples_per_frame=samples_per_frame,
        windows=windows,
    )
