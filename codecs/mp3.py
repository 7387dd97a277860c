"""MP3 through lameenc (LAME): CBR, bytes come back as soon as LAME completes a frame."""

from __future__ import annotations

import lameenc
import numpy as np

from .base import Encoder
from .pcm import to_int16

# LAME quality knob: 2 is near-best, 7 fast; 5 costs little and is transparent enough for speech at 64 kbit/s.
LAME_QUALITY = 5
DEFAULT_BITRATE_PER_CHANNEL = 64_000


class Mp3Encoder(Encoder):
    """MPEG-1/2 Layer III at ``bitrate`` bit/s (default 64 kbit/s per channel)."""

    format = "mp3"

    def __init__(self, sample_rate: int, channels: int = 1, *, streaming: bool = True, bitrate: int | None = None):
        super().__init__(sample_rate, channels, streaming=streaming)
        self.bitrate = int(bitrate or DEFAULT_BITRATE_PER_CHANNEL * self.channels)
        self._lame = lameenc.Encoder()
        self._lame.set_bit_rate(max(8, self.bitrate // 1000))
        self._lame.set_in_sample_rate(self.sample_rate)
        self._lame.set_out_sample_rate(self.sample_rate)
        self._lame.set_channels(self.channels)
        self._lame.set_quality(LAME_QUALITY)
        self._started = False  # LAME refuses to flush a stream it never saw samples of

    def _codec_holdback(self) -> int:
        # LAME emits a frame's bytes about four frames after its first sample arrives (look-ahead, MDCT overlap,
        # bit reservoir); a frame is 1152 samples at 32 kHz and above, 576 below.
        frame = 1152 if self.sample_rate >= 32000 else 576
        return 4 * frame + 576

    def _encode(self, x: np.ndarray) -> bytes:
        self._started = True
        return bytes(self._lame.encode(to_int16(x).astype("<i2", copy=False).tobytes()))

    def _finish(self) -> bytes:
        return bytes(self._lame.flush()) if self._started else b""
