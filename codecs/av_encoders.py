"""Opus (Ogg), AAC (ADTS) and FLAC through PyAV's bundled FFmpeg, drained after every packet.

Streaming output goes to a sink without ``seek``: FFmpeg then flushes its I/O buffer after each packet and never
tries to rewrite a header, so every byte handed out is final. Non-streamed FLAC goes to a seekable buffer instead,
which lets the muxer fill in STREAMINFO's sample count and MD5 at the end.
"""

from __future__ import annotations

import io
from fractions import Fraction
from typing import cast

import av
import numpy as np

from .base import Encoder
from .errors import UnsupportedFormatError
from .pcm import to_float32, to_int16

_LAYOUTS = {1: "mono", 2: "stereo"}


class ByteSink:
    """Write-only, non-seekable byte collector (no ``seek``/``tell``: PyAV then marks the output unseekable, so
    the muxer never rewrites what it wrote)."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def drain(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


class _AvEncoder(Encoder):
    container_format = ""
    codec_name = ""
    sample_format = "flt"
    container_options: dict[str, str] = {}  # noqa: RUF012 (read-only class defaults)
    default_bitrate_per_channel: int | None = None

    def __init__(self, sample_rate: int, channels: int = 1, *, streaming: bool = True, bitrate: int | None = None):
        super().__init__(sample_rate, channels, streaming=streaming)
        layout = _LAYOUTS.get(self.channels)
        if layout is None and self.codec_name != "flac":
            raise UnsupportedFormatError(f"{self.format} supports mono or stereo, got {self.channels} channels")
        self._layout = layout or f"{self.channels} channels"
        self.bitrate = bitrate or (
            self.default_bitrate_per_channel * self.channels if self.default_bitrate_per_channel else None
        )
        self._seekable = not streaming and self.codec_name == "flac"
        self._sink: ByteSink | io.BytesIO = io.BytesIO() if self._seekable else ByteSink()
        self._closed = False
        self._container = av.open(
            self._sink, "w", format=self.container_format, container_options=dict(self.container_options)
        )
        try:
            self._stream = cast(
                av.audio.stream.AudioStream,
                self._container.add_stream(self.codec_name, rate=self.sample_rate, options=self._options()),
            )
            ctx = self._stream.codec_context
            ctx.layout = self._layout
            ctx.format = self.sample_format
            if self.bitrate:
                ctx.bit_rate = int(self.bitrate)
            # Open the codec and write the header now, so a bad setting fails here rather than mid-stream.
            self._container.start_encoding()
        except av.FFmpegError as exc:
            self._closed = True
            self._container.close()
            raise UnsupportedFormatError(
                f"{self.format} encoder rejected {self.sample_rate} Hz, {self.channels} channel(s), "
                f"bitrate {self.bitrate}: {getattr(exc, 'strerror', exc)}"
            ) from exc
        except BaseException:
            self._closed = True
            self._container.close()
            raise
        self._pts = 0
        self._time_base = Fraction(1, self.sample_rate)
        self._planar = self.sample_format.endswith("p")

    def _options(self) -> dict[str, str]:
        return {}

    def _encode(self, x: np.ndarray) -> bytes:
        if self.sample_format.startswith("s16"):
            x = to_int16(x)
        else:
            x = to_float32(x)
        arr = np.ascontiguousarray(x.T) if self._planar else x.reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(arr, format=self.sample_format, layout=self._layout)
        frame.sample_rate = self.sample_rate
        frame.pts = self._pts
        frame.time_base = self._time_base
        self._pts += len(x)
        self._container.mux(self._stream.encode(frame))
        return self._drain()

    def _finish(self) -> bytes:
        self._container.mux(self._stream.encode(None))
        self._closed = True
        self._container.close()
        if self._seekable:
            return self._sink.getvalue()  # type: ignore[union-attr]
        return self._drain()

    def _drain(self) -> bytes:
        return b"" if self._seekable else self._sink.drain()  # type: ignore[union-attr]

    def _release(self) -> None:
        if getattr(self, "_container", None) is not None and not self._closed:
            self._closed = True
            try:
                self._container.close()
            except (av.FFmpegError, ValueError, OSError):
                pass  # abandoning a half-written stream; nothing useful to report


class OpusEncoder(_AvEncoder):
    """Opus in Ogg (libopus, 20 ms frames, one page per frame) at 48/24/16/12/8 kHz; default 32 kbit/s/channel."""

    format = "opus"
    container_format = "ogg"
    codec_name = "libopus"
    sample_format = "flt"
    # Pages of at most 20 ms: the muxer's default (1 s) would hold back a second of audio.
    container_options = {"page_duration": "20000"}  # noqa: RUF012
    default_bitrate_per_channel = 32_000
    # 20 ms frame + ~6.5 ms encoder look-ahead + one page, at the coding rate (samples per 48 kHz scale below).
    CODEC_HOLDBACK_MS = 50

    def _codec_holdback(self) -> int:
        return self.sample_rate * self.CODEC_HOLDBACK_MS // 1000


class AacEncoder(_AvEncoder):
    """AAC-LC in ADTS (FFmpeg's native encoder); default 64 kbit/s per channel."""

    format = "aac"
    container_format = "adts"
    codec_name = "aac"
    sample_format = "fltp"
    default_bitrate_per_channel = 64_000
    # The encoder analyses one 1024-sample frame ahead of the one it emits, plus the partly filled frame.
    CODEC_HOLDBACK = 3 * 1024


class FlacEncoder(_AvEncoder):
    """FLAC, 16-bit; blocks of at most ~50 ms so each frame leaves promptly."""

    format = "flac"
    container_format = "flac"
    codec_name = "flac"
    sample_format = "s16"

    @property
    def block_size(self) -> int:
        """Samples per FLAC frame: the largest of 576/1152/2304/4608 not over 50 ms (at least 576)."""
        fits = [b for b in (576, 1152, 2304, 4608) if b * 1000 <= 50 * self.sample_rate]
        return fits[-1] if fits else 576

    def _codec_holdback(self) -> int:
        return self.block_size

    def _options(self) -> dict[str, str]:
        return {"frame_size": str(self.block_size)}
