"""Streaming video containers: fragmented MP4 (H.264) and WebM (VP9), decoded back with PyAV."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from omni_stream.codecs import UnsupportedFormatError
from omni_stream.codecs.video import VideoStreamEncoder, avc_codec_string

W, H, FPS, CHUNK = 48, 32, 16, 33


def frames(n: int, seed: int) -> np.ndarray:
    """A moving gradient (compressible, so the round trip can be compared pixel by pixel)."""
    y, x = np.mgrid[0:H, 0:W]
    out = np.empty((n, H, W, 3), np.uint8)
    for i in range(n):
        out[i, ..., 0] = (x * 5 + i * 3 + seed) % 256
        out[i, ..., 1] = (y * 7 + i * 2) % 256
        out[i, ..., 2] = 128
    return out


def decode(data: bytes) -> list[np.ndarray]:
    return [f.to_ndarray(format="rgb24") for f in _frames(data)]


def _frames(data: bytes) -> list[av.VideoFrame]:
    with av.open(io.BytesIO(data)) as container:
        return list(container.decode(video=0))


@pytest.mark.parametrize("fmt", ["m4s", "webm"])
def test_chunks_concatenate_into_a_playable_video_of_every_frame(fmt):
    encoder = VideoStreamEncoder(fmt, W, H, FPS)
    source = [frames(CHUNK, k) for k in range(2)] + [frames(14, 2)]
    parts = [encoder.encode(chunk, final=i == len(source) - 1) for i, chunk in enumerate(source)]
    assert encoder.closed and encoder.close() == b""
    decoded = decode(b"".join(parts))
    expected = np.concatenate(source)
    assert len(decoded) == len(expected) == 80
    assert all(f.shape == (H, W, 3) for f in decoded)
    error = np.abs(np.stack(decoded).astype(int) - expected.astype(int)).mean()
    assert error < 12  # lossy, but the same pictures (a wrong frame order or size would be far off)


@pytest.mark.parametrize("fmt", ["m4s", "webm"])
def test_each_chunk_carries_exactly_its_own_frames(fmt):
    encoder = VideoStreamEncoder(fmt, W, H, FPS)
    received = b""
    for k in range(3):
        part = encoder.encode(frames(CHUNK, k))
        if k == 0:  # the init segment comes first, and only there
            assert part[4:8] == b"ftyp" if fmt == "m4s" else part[:4] == b"\x1a\x45\xdf\xa3"
        else:
            assert b"ftyp" not in part[:8] and part[:4] != b"\x1a\x45\xdf\xa3"
        received += part
        decoded = decode(received)
        assert len(decoded) == CHUNK * (k + 1)  # nothing held back for the next chunk
    assert encoder.close() == b""
    pts = [f.pts for f in _frames(received)]
    assert pts == sorted(pts) and len(set(pts)) == 3 * CHUNK  # one timeline across the chunks


def test_fragment_sequence_numbers_rise_across_chunks():
    encoder = VideoStreamEncoder("m4s", W, H, FPS)
    data = b"".join(encoder.encode(frames(CHUNK, k), final=k == 1) for k in range(2))
    numbers = []
    i = 0
    while i < len(data):
        size = int.from_bytes(data[i : i + 4], "big")
        if data[i + 4 : i + 8] == b"moof":  # moof > mfhd: size, type, version/flags, sequence_number
            assert data[i + 12 : i + 16] == b"mfhd"
            numbers.append(int.from_bytes(data[i + 20 : i + 24], "big"))
        i += size
    assert numbers == list(range(1, 2 * CHUNK + 1))


def test_fragments_are_one_per_frame_after_an_empty_moov():
    encoder = VideoStreamEncoder("m4s", W, H, FPS)
    data = encoder.encode(frames(CHUNK, 0), final=True)
    boxes = []
    i = 0
    while i < len(data):
        size = int.from_bytes(data[i : i + 4], "big")
        boxes.append(data[i + 4 : i + 8].decode())
        i += size
    assert boxes[:2] == ["ftyp", "moov"]
    assert boxes.count("moof") == CHUNK and boxes.count("mdat") == CHUNK


def test_the_mime_type_names_the_stream_profile_before_any_frame():
    encoder = VideoStreamEncoder("m4s", 640, 384, FPS)
    assert encoder.mime_type == 'video/mp4; codecs="avc1.42c016"'  # constrained baseline (ultrafast), level 2.2
    assert VideoStreamEncoder("webm", W, H, FPS).mime_type.startswith('video/webm; codecs="vp09')
    assert avc_codec_string(bytes([1, 0x64, 0x00, 0x1F, 0xFF])) == "avc1.64001f"  # avcC form
    assert avc_codec_string(None) == "avc1.42e01e"


@pytest.mark.parametrize(("fmt", "w", "h", "fps"), [("gif", W, H, FPS), ("m4s", 47, H, FPS), ("m4s", 8, 8, FPS),
                                                   ("m4s", W, H, 0)])  # fmt: skip
def test_bad_parameters_raise_a_typed_error(fmt, w, h, fps):
    with pytest.raises(UnsupportedFormatError):
        VideoStreamEncoder(fmt, w, h, fps)


def test_frames_of_the_wrong_shape_are_refused():
    encoder = VideoStreamEncoder("m4s", W, H, FPS)
    with pytest.raises(ValueError, match="frames must be"):
        encoder.encode(np.zeros((2, H + 2, W, 3), np.uint8))
    encoder.close()
    with pytest.raises(ValueError, match="closed"):
        encoder.encode(frames(1, 0))
