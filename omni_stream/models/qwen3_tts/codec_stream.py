"""Exact streaming codec decode: per-request decoder state, window arithmetic, and a windowed fallback.

The decoder is causal, so carrying every block's left context between windows (conv input histories, the
transposed-conv overlap, the last ``sliding_window - 1`` keys/values per attention layer, and the frame
position) makes a streamed decode equal the whole-utterance decode for any window sizes. States are
fixed-shape tensors with a leading batch dim, so requests decoding equal-length windows stack into one call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .codec import CodecDecoder
from .codec_config import CodecDecoderConfig
from .codec_transformer import POSITION_KEY

# ---------------------------------------------------------------- window arithmetic (pure)


def frames_to_samples(frames: int, samples_per_frame: int = 1920) -> int:
    """Audio samples produced by ``frames`` codec frames (1920 per frame at 24 kHz / 12.5 Hz)."""
    if frames < 0:
        raise ValueError(f"frames must be >= 0, got {frames}")
    return frames * samples_per_frame


def ramp_window(index: int, initial_frames: int, steady_frames: int) -> int:
    """Frames in window ``index`` (0-based): ``initial_frames`` doubling each window, capped at ``steady_frames``.

    Doubling keeps each window no longer than the audio already emitted plus the first window, so on a
    faster-than-real-time producer the next window is ready before playback of the previous ones runs out.
    """
    if initial_frames < 1 or steady_frames < 1 or index < 0:
        raise ValueError(
            f"need initial_frames, steady_frames >= 1 and index >= 0, got {initial_frames}, {steady_frames}, {index}"
        )
    if initial_frames >= steady_frames:
        return steady_frames
    # cap the exponent so huge indices do not build huge integers
    return min(steady_frames, initial_frames << min(index, steady_frames.bit_length()))


# First-window frames by load (live requests, this one included): up to 32 -> 1 frame, up to 64 -> 2, beyond -> 4.
FIRST_WINDOW_BY_LOAD = ((32, 1), (64, 2))
FIRST_WINDOW_MOST = 4


def first_window_frames(
    load: int,
    requested: int | None = None,
    by_load: Sequence[tuple[int, int]] = FIRST_WINDOW_BY_LOAD,
    most: int = FIRST_WINDOW_MOST,
) -> int:
    """Frames in a request's first audio window when ``load`` requests (itself included) are being served.

    ``requested`` (the request's ``initial_codec_chunk_frames``) wins. Otherwise one frame (80 ms, ready after a
    single decode step) while the load is light, and more as it grows: under load a decode step and a round of
    codec windows take longer, and the first chunk is all a player holds while the next, twice as long, is made;
    it also has to cover the stalls of newcomers' prefills. ``by_load``: ascending ``(up_to_load, frames)``.
    """
    if requested is not None:
        if requested < 1:
            raise ValueError(f"requested first window must be >= 1 frame, got {requested}")
        return requested
    for up_to, frames in by_load:
        if load <= up_to:
            return frames
    return most


@dataclass(slots=True)
class FirstWindow:
    """One request's first audio window in frames, decided once for the talker runner and the codec stage alike.

    The runner decides it as it hands out the request's first frame (``requested``, the request's
    ``initial_codec_chunk_frames``, else the load-dependent size then), so it knows which of its frames completes
    the window (``Qwen3TTSRunner.jobs_due``); the codec stage reads it when that frame arrives (written on the
    worker thread before the frame is handed out, read on the loop after), or decides it there if it comes first.
    """

    requested: int | None = None
    frames: int | None = None

    def decide(self, load: int, policy: Callable[[int], int] = first_window_frames) -> int:
        """The window: ``requested`` if given, else ``policy(load)`` (``load``: requests served, this one included)."""
        if self.frames is None:
            self.frames = self.requested if self.requested is not None else policy(max(1, load))
        return self.frames


def ramp_schedule(total_frames: int, initial_frames: int, steady_frames: int) -> list[int]:
    """Window sizes covering ``total_frames`` (e.g. 2, 4, 8, 16, 25, 25, ...); the last window may be short."""
    sizes: list[int] = []
    done = 0
    while done < total_frames:
        n = min(ramp_window(len(sizes), initial_frames, steady_frames), total_frames - done)
        sizes.append(n)
        done += n
    return sizes


def receptive_field_frames(cfg: CodecDecoderConfig) -> int:
    """Left context (frames) every output sample can depend on; windowed re-decode is exact at or above it."""
    frames = 2.0  # pre_conv, k=3
    frames += cfg.num_hidden_layers * (cfg.sliding_window - 1)  # each layer looks window-1 frames further back
    rate = 1
    for r in cfg.upsampling_ratios:  # transposed conv k=s has no overlap; ConvNeXt dwconv k=7
        rate *= r
        frames += 6 / rate
    frames += 6 / rate  # decoder.0 conv k=7
    for r in cfg.upsample_rates:
        frames += 1 / rate  # transposed conv k=2r keeps one input step
        rate *= r
        frames += 6 * (1 + 3 + 9) / rate  # residual units, dilations 1, 3, 9
    frames += 6 / rate  # final conv k=7
    return math.ceil(frames)


# ---------------------------------------------------------------- per-request state


@dataclass(slots=True)
class CodecStreamState:
    """Decoder histories for ``batch`` streams; ``tensors[POSITION_KEY]`` counts frames decoded per row."""

    tensors: dict[str, Tensor]

    @property
    def batch(self) -> int:
        return self.tensors[POSITION_KEY].shape[0]

    @classmethod
    def zeros(
        cls,
        decoder: CodecDecoder,
        batch: int = 1,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> CodecStreamState:
        """Start-of-stream state (zero histories are exactly the full decode's zero left padding)."""
        return cls(decoder.zero_state(batch, device, dtype))

    @classmethod
    def stack(cls, states: Sequence[CodecStreamState]) -> CodecStreamState:
        """One state whose rows are the given states, in order."""
        return cls({k: torch.cat([s.tensors[k] for s in states], dim=0) for k in states[0].tensors})

    def split(self) -> list[CodecStreamState]:
        """Inverse of ``stack``: one single-row state per stream."""
        return [CodecStreamState({k: v[i : i + 1] for k, v in self.tensors.items()}) for i in range(self.batch)]

    def clone(self) -> CodecStreamState:
        return CodecStreamState({k: v.clone() for k, v in self.tensors.items()})


@torch.inference_mode()
def decode_window(decoder: CodecDecoder, codes: Tensor, state: CodecStreamState) -> Tensor:
    """Decode the next ``n`` frames ``codes [B, Q, n]`` of ``B`` streams; updates ``state``; float32 ``[B, n*1920]``."""
    if codes.shape[0] != state.batch:
        raise ValueError(f"codes batch {codes.shape[0]} != state batch {state.batch}")
    tensors = dict(state.tensors)
    audio = decoder(codes.to(state.tensors[POSITION_KEY].device), tensors)
    state.tensors = tensors
    return audio.squeeze(1).float()


def prime(decoder: CodecDecoder, context: Tensor, state: CodecStreamState) -> None:
    """Feed context frames ``[B, Q, n]`` (e.g. ICL reference codes) into ``state`` without returning their audio."""
    decode_window(decoder, context, state)


def decode_windows(decoder: CodecDecoder, codes: Sequence[Tensor], states: Sequence[CodecStreamState]) -> list[Tensor]:
    """Batched ``decode_window`` over several streams' equal-length windows; each state is updated in place."""
    lengths = {c.shape[-1] for c in codes}
    if len(lengths) != 1:
        raise ValueError(f"batched windows must have equal frame counts, got {sorted(lengths)}")
    stacked = CodecStreamState.stack(states)
    audio = decode_window(decoder, torch.cat(list(codes), dim=0), stacked)
    for state, part in zip(states, stacked.split(), strict=True):
        state.tensors = {k: v.clone() for k, v in part.tensors.items()}
    return list(audio.split(1, dim=0))


class CodecStatePool:
    """Slot-indexed states for up to ``capacity`` streams: gather the rows of a step, decode, scatter back."""

    def __init__(self, decoder: CodecDecoder, capacity: int):
        self.decoder = decoder
        self.capacity = capacity
        self.buffers = CodecStreamState.zeros(decoder, capacity).tensors

    def reset(self, slots: Tensor) -> None:
        """Start new streams in ``slots`` (long ``[k]``)."""
        for buf in self.buffers.values():
            buf.index_fill_(0, slots.to(buf.device), 0)

    @torch.inference_mode()
    def decode(self, codes: Tensor, slots: Tensor) -> Tensor:
        """``codes [B, Q, n]`` for the streams in ``slots [B]`` -> float32 ``[B, n*1920]``."""
        slots = slots.to(self.buffers[POSITION_KEY].device)
        state = CodecStreamState({k: v.index_select(0, slots) for k, v in self.buffers.items()})
        audio = decode_window(self.decoder, codes, state)
        for key, value in state.tensors.items():
            self.buffers[key].index_copy_(0, slots, value)
        return audio


# ---------------------------------------------------------------- windowed re-decode (approximate fallback)


@torch.inference_mode()
def windowed_decode(decoder: CodecDecoder, codes: Tensor, start: int, end: int, left_context: int) -> Tensor:
    """Decode frames ``[start, end)`` of ``codes [B, Q, T]`` from scratch with ``left_context`` frames before them.

    Stateless; equals the full decode (up to rounding) when ``left_context >= receptive_field_frames``
    or ``start <= left_context``; otherwise an approximation whose error grows as the context shrinks.
    """
    if not 0 <= start < end <= codes.shape[-1] or left_context < 0:
        raise ValueError(f"bad window [{start}, {end}) of {codes.shape[-1]} frames with left_context {left_context}")
    ctx = min(left_context, start)
    audio = decoder(codes[..., start - ctx : end]).squeeze(1).float()
    return audio[..., frames_to_samples(ctx, decoder.cfg.samples_per_frame) :]


__all__ = [
    "CodecStatePool",
    "CodecStreamState",
    "decode_window",
    "decode_windows",
    "first_window_frames",
    "frames_to_samples",
    "prime",
    "ramp_schedule",
    "ramp_window",
    "receptive_field_frames",
    "windowed_decode",
]
