"""The frame admission policy (omni_stream/vision/frames.py): decoding and its refusals, the resolution cap, the
rate cap on a fake clock, the near-duplicate filter and the bounded window. No socket, no sleep."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from omni_stream.errors import InvalidRequestError
from omni_stream.vision.frames import (
    Frame,
    FrameLimits,
    FrameRateError,
    FrameWindow,
    decode_base64,
    decode_frame,
    difference,
    frame_from_pixels,
    split_data_url,
)


def encode(pixels: np.ndarray, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return buf.getvalue()


def flat(value: int, w: int = 64, h: int = 48) -> np.ndarray:
    return np.full((h, w, 3), value, dtype=np.uint8)


def noise(seed: int, w: int = 64, h: int = 48) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


LIMITS = FrameLimits()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_decodes_each_format(fmt: str) -> None:
    pixels = noise(1)
    frame = decode_frame(encode(pixels, fmt), LIMITS, "data")
    assert frame.pixels.dtype == np.uint8 and frame.pixels.shape == (48, 64, 3)
    assert frame.source == (64, 48)
    assert frame.thumb.shape == (32, 32)
    if fmt == "PNG":
        assert np.array_equal(frame.pixels, pixels)  # lossless: the very pixels


def test_grey_and_alpha_pictures_become_rgb() -> None:
    grey = Image.fromarray(np.arange(64 * 48, dtype=np.uint32).reshape(48, 64).astype(np.uint8))
    rgba = Image.fromarray(np.dstack([noise(2), np.full((48, 64), 128, np.uint8)]))
    for image in (grey, rgba):
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        assert decode_frame(buf.getvalue(), LIMITS, "data").pixels.shape == (48, 64, 3)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"hello, not an image", "is not a JPEG, PNG or WebP image"),
        (b"", "is not a JPEG, PNG or WebP image"),
        (encode(noise(3))[:60], "could not be decoded"),  # a truncated PNG
    ],
)
def test_not_an_image_names_the_field(data: bytes, words: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        decode_frame(data, LIMITS, "video.frame.data")
    assert info.value.param == "video.frame.data"
    assert words in info.value.message and "video.frame.data" in info.value.message


def test_other_image_formats_are_refused() -> None:
    buf = io.BytesIO()
    Image.fromarray(noise(4)).save(buf, format="GIF")
    with pytest.raises(InvalidRequestError, match="not a JPEG, PNG or WebP image") as info:
        decode_frame(buf.getvalue(), LIMITS, "data")
    assert info.value.param == "data"


def test_byte_cap_is_checked_before_decoding() -> None:
    limits = FrameLimits(max_bytes=1000)
    big = encode(noise(5, 200, 200))
    assert len(big) > 1000
    with pytest.raises(InvalidRequestError, match="larger than 1000 bytes") as info:
        decode_frame(big, limits, "data")
    assert info.value.param == "data"
    text = base64.b64encode(big).decode()
    with pytest.raises(InvalidRequestError, match="larger than 1000 bytes"):
        decode_base64(text, limits, "data")


def test_pixel_cap_reads_the_header_only() -> None:
    # a 5000 x 4000 PNG of one colour: a few KB of file, 20 M pixels
    big = encode(flat(7, 5000, 4000))
    with pytest.raises(InvalidRequestError, match="5000x4000: more than") as info:
        decode_frame(big, FrameLimits(max_pixels=4096 * 4096), "image_url")
    assert info.value.param == "image_url"


def test_resolution_cap_scales_down_keeping_aspect() -> None:
    limits = FrameLimits(max_side=100)
    for fmt in ("PNG", "JPEG"):
        frame = decode_frame(encode(noise(6, 400, 200), fmt), limits, "data")
        assert frame.pixels.shape == (50, 100, 3)
        assert frame.source == (400, 200)
    small = decode_frame(encode(noise(7, 80, 60)), limits, "data")
    assert small.pixels.shape == (60, 80, 3)  # never scaled up


def test_camera_pixels_take_the_same_caps_and_thumbnail_as_encoded_pictures() -> None:
    limits = FrameLimits(max_side=100, max_pixels=500 * 500)
    picture = noise(8, 400, 200)
    camera = frame_from_pixels(picture, limits, "video")
    decoded = decode_frame(encode(picture), limits, "data")
    assert camera.pixels.shape == (50, 100, 3) and camera.source == (400, 200)
    assert np.array_equal(camera.pixels, decoded.pixels) and np.array_equal(camera.thumb, decoded.thumb)
    assert frame_from_pixels(noise(9, 80, 60), limits, "video").pixels.shape == (60, 80, 3)
    with pytest.raises(InvalidRequestError, match="video is 600x500: more than 250000 pixels") as info:
        frame_from_pixels(flat(0, 600, 500), limits, "video")
    assert info.value.param == "video"


def test_base64_and_data_urls() -> None:
    data = encode(noise(8))
    text = base64.b64encode(data).decode()
    assert decode_base64(text, LIMITS, "data").pixels.shape == (48, 64, 3)
    assert split_data_url(f"data:image/png;base64,{text}", "image_url") == text
    for bad in ("not base64 !!", 5, ""):
        with pytest.raises(InvalidRequestError) as info:
            decode_base64(bad, LIMITS, "data")
        assert info.value.param == "data"
    for url in ("https://example.com/cat.png", "data:image/png,rawbytes", None):
        with pytest.raises(InvalidRequestError, match="data: URL") as info:
            split_data_url(url, "item.content[0].image_url")
        assert info.value.param == "item.content[0].image_url"


def frame_of(pixels: np.ndarray) -> Frame:
    return decode_frame(encode(pixels), LIMITS, "data")


def test_rate_cap_token_bucket_on_a_fake_clock() -> None:
    window = FrameWindow(FrameLimits(max_fps=2.0, burst=3), max_frames=8)
    for _ in range(3):  # the burst
        window.check_rate(10.0, "data")
    with pytest.raises(FrameRateError, match="faster than 2 per second") as info:
        window.check_rate(10.0, "data")
    assert info.value.param == "data"
    window.check_rate(10.5, "data")  # half a second: one more place
    with pytest.raises(FrameRateError):
        window.check_rate(10.6, "data")
    window.check_rate(11.5, "data")  # 0.9 s since the last refill: 1.8 places (refused frames took none)
    window.check_rate(11.5, "data")
    with pytest.raises(FrameRateError):
        window.check_rate(11.5, "data")
    assert window.refused == 3
    # a steady stream at the cap is never refused
    steady = FrameWindow(FrameLimits(max_fps=2.0, burst=1), max_frames=8)
    for i in range(100):
        steady.check_rate(i * 0.5, "data")
    assert steady.refused == 0


def test_near_duplicates_are_dropped_against_the_last_kept_frame() -> None:
    window = FrameWindow(LIMITS, max_frames=8, threshold=0.95)  # drop within 12.75 grey levels
    assert window.offer(frame_of(flat(100)))
    assert not window.offer(frame_of(flat(110)))  # 10 levels: a near duplicate
    assert not window.offer(frame_of(flat(112)))  # 12 from the last *kept* frame, not from the dropped one
    assert window.offer(frame_of(flat(114)))  # 14 levels: kept
    assert window.offer(frame_of(noise(9)))
    assert (window.kept, window.duplicates, len(window)) == (3, 2, 3)
    # a drift of small steps is caught once it adds up, since frames compare with the last kept one
    drift = FrameWindow(LIMITS, max_frames=64, threshold=0.95)
    kept = [drift.offer(frame_of(flat(v))) for v in range(0, 60, 4)]
    assert kept == [v % 16 == 0 for v in range(0, 60, 4)]


def test_threshold_and_filter_off() -> None:
    a, b = frame_of(flat(100)), frame_of(flat(101))
    assert difference(a.thumb, b.thumb) == pytest.approx(1.0)
    exact = FrameWindow(LIMITS, max_frames=8, threshold=1.0)
    assert exact.offer(a) and not exact.offer(frame_of(flat(100))) and exact.offer(b)
    off = FrameWindow(LIMITS, max_frames=8, threshold=None)
    assert all(off.offer(a) for _ in range(5)) and len(off) == 5
    loose = FrameWindow(LIMITS, max_frames=8, threshold=0.0)  # everything is a duplicate of the first
    assert loose.offer(a) and not loose.offer(frame_of(noise(10)))


def test_window_is_bounded_oldest_out() -> None:
    window = FrameWindow(LIMITS, max_frames=4, threshold=None)
    frames = [frame_of(flat(v)) for v in range(10)]
    for frame in frames:
        window.offer(frame)
        assert len(window) <= 4
    assert window.frames == tuple(frames[-4:])
    assert (window.kept, window.evicted) == (10, 6)


def test_sample_spreads_over_the_window_newest_last() -> None:
    window = FrameWindow(LIMITS, max_frames=50, threshold=None)
    frames = [frame_of(flat(v)) for v in range(10)]
    for frame in frames:
        window.offer(frame)
    assert window.sample(4) == (frames[0], frames[2], frames[4], frames[9])
    assert window.sample(10) == tuple(frames) and window.sample(20) == tuple(frames)
    assert window.sample(1) == (frames[9],)
    assert window.sample(0) == ()


def test_bad_window_settings_name_their_field() -> None:
    with pytest.raises(InvalidRequestError, match="max_frames must be 1-256") as info:
        FrameWindow(LIMITS, max_frames=257)
    assert info.value.param == "max_frames"
    with pytest.raises(InvalidRequestError) as info:
        FrameWindow(LIMITS, max_frames=4, threshold=1.5)
    assert info.value.param == "threshold"
    with pytest.raises(ValueError):
        FrameLimits(max_fps=0)


def test_window_is_bounded_in_pixels_too() -> None:
    window = FrameWindow(FrameLimits(max_window_pixels=3 * 64 * 48), max_frames=10, threshold=None)
    frames = [frame_of(flat(v)) for v in range(6)]  # 64 x 48 each
    for frame in frames:
        window.offer(frame)
    assert window.frames == tuple(frames[-3:]) and window.evicted == 3
    big = decode_frame(encode(noise(11, 200, 100)), LIMITS, "data")  # over the whole budget alone: kept alone
    window.offer(big)
    assert window.frames == (big,)
