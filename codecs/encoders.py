"""``open_encoder``: one streaming encoder per output format.

Encoders are plain synchronous objects and cost well under a millisecond per 20 ms chunk; the serving layer runs
``encode``/``flush`` off the event loop (``anyio.to_thread.run_sync`` or the device-independent executor), one
encoder per response, never shared between threads.

Hold-back bounds (input samples passed to ``encode`` whose audio is not yet in its output), at the coding rate:

========  =================================================================
pcm/wav   0
mulaw     0 at 8 kHz; otherwise the resampler's look-ahead (~2-4 ms)
alaw      same as mulaw
flac      one block (<= 50 ms: 1152 samples at 24 kHz)
opus      50 ms (20 ms frame, encoder look-ahead, one Ogg page)
mp3       4 frames + 576 samples (frame: 1152 at >= 32 kHz, else 576; LAME look-ahead, bit reservoir)
aac       3 * 1024 samples (frame, one-frame analysis look-ahead, partial frame)
========  =================================================================

Input that needs another rate (opus at 22.05 kHz, G.711 at anything but 8 kHz) adds the resampler's look-ahead.
``Encoder.max_holdback`` gives the bound for a given encoder in input samples.
"""

from __future__ import annotations

import numpy as np

from .av_encoders import AacEncoder, FlacEncoder, OpusEncoder
from .base import Encoder
from .formats import format_info
from .g711 import AlawEncoder, MulawEncoder
from .mp3 import Mp3Encoder
from .wav import PcmEncoder, WavEncoder

_ENCODERS: dict[str, type[Encoder]] = {
    "pcm": PcmEncoder,
    "wav": WavEncoder,
    "flac": FlacEncoder,
    "mp3": Mp3Encoder,
    "opus": OpusEncoder,
    "aac": AacEncoder,
    "mulaw": MulawEncoder,
    "alaw": AlawEncoder,
}
_WITH_BITRATE = {"mp3", "opus", "aac"}


def open_encoder(
    fmt: str, sample_rate: int, channels: int = 1, *, streaming: bool = True, bitrate: int | None = None
) -> Encoder:
    """A new encoder for ``fmt`` fed at ``sample_rate`` Hz.

    ``bitrate`` is in bit/s for mp3, opus and aac (default 64k, 32k and 64k per channel) and ignored otherwise.
    ``streaming=False`` returns the whole file from ``flush()`` with exact length fields.
    """
    name = format_info(fmt).name
    cls = _ENCODERS[name]
    if name in _WITH_BITRATE:
        return cls(sample_rate, channels, streaming=streaming, bitrate=bitrate)  # type: ignore[call-arg]
    return cls(sample_rate, channels, streaming=streaming)


def encode_whole(
    fmt: str, pcm: np.ndarray, sample_rate: int, channels: int = 1, *, bitrate: int | None = None
) -> bytes:
    """Encode a whole signal to one complete file (exact lengths in WAV/FLAC headers)."""
    with open_encoder(fmt, sample_rate, channels, streaming=False, bitrate=bitrate) as enc:
        enc.encode(pcm)
        return enc.flush()
