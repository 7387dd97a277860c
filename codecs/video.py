"""Streaming video containers: fragmented MP4 (H.264) and WebM (VP9) through PyAV, for Media Source Extensions.

:class:`VideoStreamEncoder` takes uint8 RGB frames a chunk at a time and returns, for each chunk, container bytes
that hold exactly that chunk's frames; the first call's bytes begin with the init segment (``ftyp`` + ``moov`` for
MP4, the EBML header and track info for WebM). Concatenating every call's bytes (``encode`` ...
``encode(final=True)``) gives a complete, playable file; a browser can append each call's bytes to a
``SourceBuffer`` as they come, and a chunk's frames are playable as soon as its bytes arrive.

- ``m4s``: H.264 (libx264, ``preset=ultrafast``, ``tune=zerolatency``: no B-frames, no look-ahead, so every frame
  leaves the encoder at once) in fragmented MP4 with ``movflags=frag_every_frame+empty_moov+default_base_moof``
  (an empty ``moov`` up front and one ``moof``/``mdat`` per frame, which is what MSE wants).
- ``webm``: VP9 (libvpx-vp9, ``deadline=realtime``, ``lag-in-frames=0``) in live WebM, one cluster per frame.

Why a muxer per chunk: both muxers write a frame only once they know its duration, i.e. when the next frame
arrives, and PyAV has no call that flushes a muxer short of closing it. So one encoder (one codec context, one
H.264/VP9 stream) lives for the whole video, and each chunk's packets go through a muxer of their own, closed at
the chunk's end: its last frame is written then, with the duration the packets carry. The chunks after the first
drop that muxer's init segment (the same one again: same codec parameters) and continue the first one's
timeline (timestamps are kept as they are, never shifted to zero; MP4 fragment sequence numbers keep rising).
Encoding is CPU work: call it off the event loop.
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
        # frag_discont and make_non_negative: a chunk's muxer starts its fragments at the timestamps it is given
        # (with an empty moov it would otherwise restart them at zero); skip_trailer: no mfra index per chunk
        (
            ("movflags", "frag_every_frame+empty_moov+default_base_moof+frag_discont+skip_trailer"),
            ("avoid_negative_ts", "make_non_negative"),
        ),
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

    ``encode(frames)`` takes uint8 ``(n, height, width, 3)`` and returns container bytes holding exactly those
    ``n`` frames; ``encode(frames, final=True)`` (or ``close()``) also ends the stream. Not thread-safe: one caller
    at a time (it may be any thread).
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
        self._chunks = 0  # chunks muxed so far
        self._fragments = 0  # MP4 fragments written so far (their sequence numbers continue across chunks)
        # The encoder's stream lives in a container of its own whose output is dropped: its codec parameters are
        # the template of every chunk's muxer.
        self._encoder_box = av.open(ByteSink(), "w", format=spec.container, options=dict(spec.container_options))
        stream = self._encoder_box.add_stream(spec.codec, rate=fps, options=dict(spec.codec_options))
        assert isinstance(stream, av.VideoStream)  # a video codec gives a video stream
        self._stream = stream
        self._stream.width, self._stream.height, self._stream.pix_fmt = width, height, "yuv420p"
        self._encoder_box.start_encoding()  # opens the codec: its parameters (SPS) are known before a frame

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
        packets: list[av.Packet] = []
        for pixels in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24")
            frame.pts = self.frames
            self.frames += 1
            packets += self._stream.encode(frame)
        if final:
            return self._mux(packets) + self.close()
        return self._mux(packets)

    def close(self) -> bytes:
        """End the stream: flush the encoder; the bytes left (empty when none were held or already closed)."""
        if self.closed:
            return b""
        self.closed = True
        try:
            return self._mux(self._stream.encode(None))
        finally:
            self._encoder_box.close()

    def _mux(self, packets: list[av.Packet]) -> bytes:
        """``packets`` as container bytes, through a muxer closed at the end (so every frame is written)."""
        if not packets:
            return b""
        sink = ByteSink()
        spec = self.format
        with av.open(sink, "w", format=spec.container, options=dict(spec.container_options)) as container:
            stream = container.add_stream_from_template(self._stream)
            for packet in packets:
                packet.duration = packet.duration or 1  # in 1/fps: the last frame's duration, known at once
                packet.stream = stream
                container.mux(packet)
        data = sink.drain()
        first = self._chunks == 0
        self._chunks += 1
        if spec.container == "mp4":
            data, self._fragments = _continue_mp4(data, self._fragments, keep_init=first)
        elif not first:
            data = _webm_clusters(data)
        return data


# --- joining each chunk's muxer output to the stream ---------------------------------------------------------------


def _mp4_boxes(data: bytes, start: int = 0, end: int | None = None) -> list[tuple[bytes, int, int]]:
    """The boxes of ``data[start:end]`` as ``(type, offset, size)``."""
    end = len(data) if end is None else end
    boxes, i = [], start
    while i + 8 <= end:
        size = int.from_bytes(data[i : i + 4], "big")
        if size < 8:
            raise ValueError(f"malformed MP4 box at byte {i}")
        boxes.append((data[i + 4 : i + 8], i, size))
        i += size
    return boxes


def _continue_mp4(data: bytes, fragments: int, keep_init: bool) -> tuple[bytes, int]:
    """One chunk's fragmented MP4 with its init segment dropped (unless ``keep_init``) and its fragments numbered
    on from ``fragments`` (``mfhd`` sequence numbers rise over the whole stream); returns it and the new count."""
    out = bytearray()
    for kind, offset, size in _mp4_boxes(data):
        if kind in (b"ftyp", b"moov") and not keep_init:
            continue
        box = bytearray(data[offset : offset + size])
        if kind == b"moof":
            for child, at, _ in _mp4_boxes(bytes(box), 8):
                if child == b"mfhd":  # size, type, version and flags, then the sequence number
                    fragments += 1
                    box[at + 12 : at + 16] = fragments.to_bytes(4, "big")
        out += box
    return bytes(out), fragments


_SEGMENT, _CLUSTER = 0x18538067, 0x1F43B675


def _ebml_number(data: bytes, i: int, keep_marker: bool) -> tuple[int, int, bool]:
    """An EBML variable-length number at ``i``: ``(value, next offset, all value bits set)``."""
    first = data[i]
    length = 9 - first.bit_length()  # leading zero bits + 1
    if not 1 <= length <= 8:
        raise ValueError(f"malformed EBML number at byte {i}")
    value = int.from_bytes(data[i : i + length], "big")
    bits = 7 * length
    unknown = value & ((1 << bits) - 1) == (1 << bits) - 1
    return (value if keep_marker else value & ((1 << bits) - 1)), i + length, unknown


def _webm_clusters(data: bytes) -> bytes:
    """One chunk's live WebM from its first cluster on: the EBML header, the segment's start and its track
    info (the same as the first chunk's) dropped."""
    i = 0
    while i < len(data):
        start = i
        element, i, _ = _ebml_number(data, i, keep_marker=True)
        size, body, unknown = _ebml_number(data, i, keep_marker=False)
        if element == _CLUSTER:
            return data[start:]
        if element == _SEGMENT:  # a live segment has an unknown size: walk into it
            i = body
            continue
        if unknown:
            raise ValueError("an EBML element of unknown size before the first cluster")
        i = body + size
    return b""
