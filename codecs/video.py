"""Streaming video containers: fragmented MP4 (H.264) and WebM (VP9) through PyAV, for Media Source Extensions.

:class:`VideoStreamEncoder` takes uint8 RGB frames a chunk at a time and returns the container bytes that are final
after each chunk; the first call's bytes begin with the init segment (``ftyp`` + ``moov`` for MP4, the EBML header
and track info for WebM). Concatenating every call's bytes (``encode`` ... ``encode(final=True)``) gives a complete,
playable file; a browser can append each call's bytes to a ``SourceBuffer`` as they come.

- ``m4s``: H.264 (libx264, ``preset=ultrafast``, ``tune=zerolatency``: no B-frames, no look-ahead, so every frame
  leaves the encoder at once) in fragmented MP4 with ``movflags=frag_every_frame+empty_moov+default_base_moof``
  (an empty ``moov`` up front and one ``moof``/``mdat`` per frame, which is what MSE wants).
- ``webm``: VP9 (libvpx-vp9, ``deadline=realtime``, ``lag-in-frames=0``) in live WebM, one cluster per frame.

One frame of lag: both muxers write a frame once they know its duration, i.e. when the next frame arrives. So each
chunk's bytes hold its frames but the last, plus the previous chunk's last frame; the final chunk (``final=True``)
flushes everything. Encoding is CPU work: call it off the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import av
import numpy as np

from .av_encoders import ByteSink
from .errors import UnsupportedFormatError


@dataclass(slots=True, frozen=True)
class VideoFormat:
    """One streaming video format: the container and codec PyAV writes, the MIME type a browser needs."""

    name: str
    container: str
    codec: str
    mime: str
    container_options: tuple[tuple[str, str], ...]
    codec_options: tuple[tuple[str, str], ...]


VIDEO_FORMATS: dict[str, VideoFormat] = {
    "m4s": VideoFormat(
        "m4s",
        "mp4",
        "libx264",
        "video/mp4",
        (("movflags", "frag_every_frame+empty_moov+default_base_moof"),),
        (("preset", "ultrafast"), ("tune", "zerolatency")),
    ),
    "webm": VideoFormat(
        "webm",
        "webm",
        "libvpx-vp9",
        "video/webm",
        (("live", "1"), ("cluster_time_limit", "1"), ("flush_packets", "1")),  # a cluster per frame, out at once
        (("deadline", "realtime"), ("cpu-used", "8"), ("lag-in-frames", "0"), ("row-mt", "1")),
    ),
}


def avc_codec_string(extradata: bytes | None) -> str:
    """The RFC 6381 ``avc1.PPCCLL`` string of an H.264 stream from its SPS (Annex B or avcC extradata)."""
    if not extradata:
        return "avc1.42e01e"
    data = bytes(extradata)
    if data[0] == 1 and len(data) >= 4:  # avcC: version, profile, compatibility, level
        return f"avc1.{data[1]:02x}{data[2]:02x}{data[3]:02x}"
    i = data.find(b"\x00\x00\x01")
    while 0 <= i and i + 6 < len(data):
        if data[i + 3] & 0x1F == 7:  # an SPS NAL unit: profile_idc, constraint flags, level_idc follow its header
            return f"avc1.{data[i + 4]:02x}{data[i + 5]:02x}{data[i + 6]:02x}"
        i = data.find(b"\x00\x00\x01", i + 3)
    return "avc1.42e01e"


class VideoStreamEncoder:
    """Encode RGB frames of one ``width`` x ``height`` video at ``fps`` into ``fmt`` (``m4s`` or ``webm``).

    ``encode(frames)`` takes uint8 ``(n, height, width, 3)`` and returns the bytes made final by them;
    ``encode(frames, final=True)`` (or ``close()``) ends the stream and returns the rest. Not thread-safe: one
    caller at a time (it may be any thread).
    """

    def __init__(self, fmt: str, width: int, height: int, fps: int) -> None:
        spec = VIDEO_FORMATS.get(fmt)
        if spec is None:
            raise UnsupportedFormatError(f"unknown video format {fmt!r} (one of: {', '.join(VIDEO_FORMATS)})")
        if width < 16 or height < 16 or width % 2 or height % 2:
            raise UnsupportedFormatError(f"video size must be even and at least 16x16, got {width}x{height}")
        if fps < 1:
            raise UnsupportedFormatError(f"fps must be >= 1, got {fps}")
        self.format = spec
        self.width, self.height, self.fps = width, height, fps
        self.frames = 0
        self.closed = False
        self._sink = ByteSink()
        self._container = av.open(self._sink, "w", format=spec.container, options=dict(spec.container_options))
        stream = self._container.add_stream(spec.codec, rate=fps, options=dict(spec.codec_options))
        assert isinstance(stream, av.VideoStream)  # a video codec gives a video stream
        self._stream = stream
        self._stream.width, self._stream.height, self._stream.pix_fmt = width, height, "yuv420p"
        self._stream.codec_context.open()  # now, so that the codec string (from the SPS) is known before a frame

    @property
    def mime_type(self) -> str:
        """The ``SourceBuffer`` type, e.g. ``video/mp4; codecs="avc1.42c016"``."""
        if self.format.codec == "libx264":
            codecs = avc_codec_string(self._stream.codec_context.extradata)
        else:
            codecs = "vp09.00.10.08"  # profile 0, level 1.0, 8 bit: what libvpx-vp9 writes for yuv420p
        return f'{self.format.mime}; codecs="{codecs}"'

    def encode(self, frames: np.ndarray, final: bool = False) -> bytes:
        if self.closed:
            raise ValueError("the video stream is closed")
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[1:] != (self.height, self.width, 3):
            raise ValueError(
                f"frames must be uint8 (n, {self.height}, {self.width}, 3), got {frames.dtype} {frames.shape}"
            )
        for pixels in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24")
            frame.pts = self.frames
            self.frames += 1
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
        if final:
            return self.close()
        return self._sink.drain()

    def close(self) -> bytes:
        """End the stream: flush the encoder and the muxer; the bytes left (empty when already closed)."""
        if self.closed:
            return b""
        self.closed = True
        try:
            for packet in self._stream.encode(None):
                self._container.mux(packet)
        finally:
            self._container.close()
        return self._sink.drain()
