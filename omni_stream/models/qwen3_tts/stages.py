"""The Qwen3-TTS codec stage (streamed audio windows); the talker runs the shared ``omni_stream.stages.talker_stage``.

The codec stage decodes windows of new frames with each request's full decoder state (conv histories,
transposed-conv overlap, sliding-window K/V), so the streamed waveform equals the whole-utterance decode
whatever the window sizes (``codec_stream``). Windows follow a ramp (``initial_codec_chunk_frames``
doubling up to ``steady_frames``): a small first window for time to first audio, then longer ones that
each arrive before the audio already sent runs out. Windows of equal length from different requests are
decoded together in one batched worker job. With a :class:`CodecWindows` (slot-indexed states, CUDA graphs
per window bucket on GPU) a request holds one state row for its lifetime instead of a private state.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import numpy as np
import torch

from omni_stream.chunks import Audio, CodecFrames
from omni_stream.context import RequestContext
from omni_stream.models.qwen3_tts.codec import CodecDecoder
from omni_stream.models.qwen3_tts.codec_graphs import CodecWindows
from omni_stream.models.qwen3_tts.codec_stream import CodecStreamState, decode_windows, prime, ramp_window
from omni_stream.pipeline import Stage
from omni_stream.worker import DeviceWorker


@dataclass(slots=True)
class ReferenceCodes:
    """One request's ICL reference codes (``[T, 16]`` int64), set by the talker stage's prompt before its first
    frame and read by the codec stage to prime the decoder; None when the request clones no reference audio."""

    codes: np.ndarray | None = None


@dataclass(slots=True, eq=False)
class CodecWindow:
    """One request's next window: ``codes [n, 16]``; ``context`` frames are fed first without output (ICL)."""

    state: CodecStreamState
    codes: torch.Tensor
    context: torch.Tensor | None = None


@dataclass(slots=True, eq=False)
class SlotWindow:
    """One request's next window on a :class:`CodecWindows` row; ``fresh`` marks its first window."""

    slot: int
    codes: torch.Tensor
    fresh: bool
    context: torch.Tensor | None = None


def decode_slot_windows(pool: CodecWindows, jobs: list[SlotWindow]) -> list[np.ndarray]:
    """Batched job (device worker): equal-length windows of several requests, each on its own state row."""
    for job in jobs:
        if job.context is not None:
            pool.prime(job.slot, job.context)
            job.context, job.fresh = None, False
    return pool.decode([j.slot for j in jobs], [j.codes for j in jobs], [j.fresh for j in jobs])


def decode_codec_windows(decoder: CodecDecoder, windows: list[CodecWindow]) -> list[np.ndarray]:
    """Batched job (device worker): decode equal-length windows of several requests, each with its own state."""
    for w in windows:
        if w.context is not None:
            prime(decoder, w.context.T.unsqueeze(0), w.state)
            w.context = None
    device = next(decoder.parameters()).device
    codes = [w.codes.T.unsqueeze(0).to(device) for w in windows]
    audio = decode_windows(decoder, codes, [w.state for w in windows])
    return [a[0].cpu().numpy().astype(np.float32, copy=False) for a in audio]


def codec_stage(
    decoder: CodecDecoder,
    worker: DeviceWorker,
    *,
    sample_rate: int,
    samples_per_frame: int,
    initial_frames: int,
    steady_frames: int,
    pool: CodecWindows | None = None,
    reference: ReferenceCodes | None = None,
) -> Stage:
    """Decode the upstream frames in ramped windows with exact streaming state; yield :class:`Audio`.

    ``pool``: shared slot-indexed states (graph-replayed windows on CUDA); requests that find it full, or
    all requests without one, keep a private state.
    """
    key_prefix = f"qwen3-codec-{id(decoder)}"

    def batch_fn(windows: list[CodecWindow]) -> list[np.ndarray]:
        return decode_codec_windows(decoder, windows)

    def slot_batch_fn(jobs: list[SlotWindow]) -> list[np.ndarray]:
        assert pool is not None
        return decode_slot_windows(pool, jobs)

    async def codec(ctx: RequestContext, upstream: AsyncIterator[CodecFrames]) -> AsyncIterator[Audio]:
        slot = pool.acquire() if pool is not None else None
        try:
            async for audio in _codec(ctx, upstream, slot):
                yield audio
        finally:
            if slot is not None:
                assert pool is not None
                pool.release(slot)

    async def _codec(
        ctx: RequestContext, upstream: AsyncIterator[CodecFrames], slot: int | None
    ) -> AsyncIterator[Audio]:
        # A private state lives with this request alone: a cancelled window job can only touch this object.
        state = CodecStreamState.zeros(decoder, 1) if slot is None else None
        context: torch.Tensor | None = None
        held: list[torch.Tensor] = []
        n_held = 0
        index = 0
        start = 0
        want = ramp_window(0, initial_frames, steady_frames)

        async def flush(n: int, final: bool) -> Audio:
            nonlocal held, n_held, start, index, want, context
            codes = torch.cat(held) if len(held) > 1 else held[0]
            held = [codes[n:]] if codes.shape[0] > n else []
            n_held -= n
            with ctx.fail_after("codec decode"):
                if slot is None:
                    assert state is not None
                    window = CodecWindow(state, codes[:n], context)
                    samples = await worker.submit_batched((key_prefix, n), window, batch_fn)
                else:
                    job = SlotWindow(slot, codes[:n], index == 0, context)
                    samples = await worker.submit_batched((key_prefix, "slots", n), job, slot_batch_fn)
            context = None
            audio = Audio(samples, sample_rate, start * samples_per_frame, final)
            start += n
            index += 1
            want = ramp_window(index, initial_frames, steady_frames)
            return audio

        # The last chunk carries final=True. A window that ends exactly on the frames received so far may be
        # the last: unless the talker marked its frame final it is decoded at once but handed on only when the
        # next frame (or the end of the stream) says which it is. The first window goes out at once (time to
        # first audio); should nothing follow it, an empty final chunk marks the end.
        pending: Audio | None = None
        ended = False
        async for frames in upstream:
            if frames.start_frame == 0 and reference is not None and reference.codes is not None:
                # The talker stage set the reference codes before its first frame; they prime the decoder.
                context = torch.as_tensor(reference.codes, dtype=torch.long)
            held.append(frames.codes)
            n_held += frames.n_frames
            if pending is not None:
                yield pending
                pending = None
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

    codec.__name__ = "codec"
    return codec
