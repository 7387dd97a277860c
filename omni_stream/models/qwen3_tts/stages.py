"""The Qwen3-TTS codec decode; the talker and the windowing loop are the shared ones (``omni_stream.stages``).

Windows of new frames are decoded with each request's full decoder state (conv histories, transposed-conv
overlap, sliding-window K/V), so the streamed waveform equals the whole-utterance decode whatever the window
sizes (``codec_stream``). Windows follow a ramp (``initial_codec_chunk_frames`` doubling up to
``steady_frames``): a small first window for time to first audio, then longer ones that each arrive before the
audio already sent runs out. Windows of equal length from different requests are decoded together in one
batched worker job. With a :class:`CodecWindows` (slot-indexed states, CUDA graphs per window bucket on GPU) a
request holds one state row for its lifetime instead of a private state.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import numpy as np
import torch

from omni_stream.context import RequestContext
from omni_stream.models.qwen3_tts.codec import CodecDecoder
from omni_stream.models.qwen3_tts.codec_graphs import CodecWindows
from omni_stream.models.qwen3_tts.codec_stream import CodecStreamState, decode_windows, prime, ramp_window
from omni_stream.pipeline import Stage
from omni_stream.stages import CodecWindow as SharedWindow
from omni_stream.stages import WindowDecode
from omni_stream.stages import codec_stage as shared_codec_stage
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
    """The shared windowed codec stage over this decoder, with exact streaming state and a doubling ramp.

    ``pool``: shared slot-indexed states (graph-replayed windows on CUDA); requests that find it full, or
    all requests without one, keep a private state. ``reference``: ICL codes that prime the first window.
    """
    key_prefix = f"qwen3-codec-{id(decoder)}"

    def batch_fn(windows: list[CodecWindow]) -> list[np.ndarray]:
        return decode_codec_windows(decoder, windows)

    def slot_batch_fn(jobs: list[SlotWindow]) -> list[np.ndarray]:
        assert pool is not None
        return decode_slot_windows(pool, jobs)

    @asynccontextmanager
    async def open_decoder(ctx: RequestContext) -> AsyncIterator[WindowDecode]:
        slot = pool.acquire() if pool is not None else None
        # A private state lives with this request alone: a cancelled window job can only touch this object.
        state = CodecStreamState.zeros(decoder, 1) if slot is None else None

        async def decode(ctx: RequestContext, window: SharedWindow) -> np.ndarray:
            codes, n = window.codes(), window.n_frames
            context = None
            if window.index == 0 and reference is not None and reference.codes is not None:
                context = torch.as_tensor(reference.codes, dtype=torch.long)  # set by the talker's prompt
            with ctx.fail_after("codec decode"):
                if slot is None:
                    assert state is not None
                    return await worker.submit_batched((key_prefix, n), CodecWindow(state, codes, context), batch_fn)
                job = SlotWindow(slot, codes, window.index == 0, context)
                return await worker.submit_batched((key_prefix, "slots", n), job, slot_batch_fn)

        try:
            yield decode
        finally:
            if slot is not None:
                assert pool is not None
                pool.release(slot)

    return shared_codec_stage(
        open_decoder,
        sample_rate=sample_rate,
        samples_per_frame=samples_per_frame,
        windows=lambda index: ramp_window(index, initial_frames, steady_frames),
    )
