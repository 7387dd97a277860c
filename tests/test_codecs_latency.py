"""Encoders hand bytes back from ``encode`` as soon as the codec allows: hold-back stays under the documented bound.

Hold-back after feeding N samples is N minus the samples an independent decoder recovers from the bytes returned so
far (less the codec's priming delay, found by cross-correlation on the whole stream).
"""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from omni_stream.codecs import open_encoder
from omni_stream.codecs.testsignal import find_delay, speech_like
from omni_stream.codecs.wav import WAV_HEADER_BYTES

STEP = 160  # input samples per encode() call
# Demuxer per format: probing needs several ADTS frames, which would overstate the hold-back of short prefixes.
DEMUXER = {"flac": "flac", "opus": "ogg", "mp3": "mp3", "aac": "aac"}


def decoded_samples(data: bytes, input_rate: int, demuxer: str) -> float:
    """Samples (at ``input_rate``) FFmpeg recovers from a stream prefix; 0 if nothing decodes yet."""
    if not data:
        return 0.0
    try:
        with av.open(io.BytesIO(data), format=demuxer) as c:
            frames = list(c.decode(audio=0))
    except av.FFmpegError:
        return 0.0
    if not frames:
        return 0.0
    return sum(f.samples for f in frames) * input_rate / frames[0].sample_rate


def decode_all(data: bytes) -> tuple[np.ndarray, int]:
    with av.open(io.BytesIO(data)) as c:
        frames = list(c.decode(audio=0))
    return np.concatenate([f.to_ndarray()[0] for f in frames]).astype(np.float32), frames[0].sample_rate


def measure_holdback(fmt: str, rate: int) -> tuple[int, int, list[int]]:
    """(largest measured hold-back, the encoder's stated bound, bytes returned by each encode call)."""
    x = speech_like(1.0, rate, seed=5)
    enc = open_encoder(fmt, rate)
    sizes, fed, stream = [], [], b""
    for i in range(0, len(x), STEP):
        out = enc.encode(x[i : i + STEP])
        sizes.append(len(out))
        stream += out
        fed.append((min(i + STEP, len(x)), len(stream)))
    whole = stream + enc.flush()

    if fmt == "pcm":
        coverage = lambda n: n / 2  # noqa: E731
    elif fmt == "wav":
        coverage = lambda n: max(0, n - WAV_HEADER_BYTES) / 2  # noqa: E731
    elif fmt in ("mulaw", "alaw"):
        coverage = lambda n: n * rate / 8000  # noqa: E731
    else:
        decoded, decoded_rate = decode_all(whole)
        priming = 0
        if decoded_rate == rate:  # opus decodes at 48 kHz with its pre-skip already removed
            priming = find_delay(x, decoded, max_delay=4000)
        coverage = lambda n: decoded_samples(whole[:n], rate, DEMUXER[fmt]) - priming  # noqa: E731
    cache: dict[int, float] = {}
    worst = 0
    for n_fed, n_bytes in fed:
        if n_bytes not in cache:
            cache[n_bytes] = coverage(n_bytes)
        worst = max(worst, int(np.ceil(n_fed - cache[n_bytes])))
    return worst, enc.max_holdback, sizes


CASES = [
    ("pcm", 24000),
    ("wav", 24000),
    ("mulaw", 8000),
    ("alaw", 8000),
    ("mulaw", 24000),
    ("alaw", 24000),
    ("flac", 24000),
    ("flac", 48000),
    ("opus", 24000),
    ("opus", 22050),
    ("mp3", 24000),
    ("mp3", 44100),
    ("aac", 24000),
]


@pytest.mark.parametrize(("fmt", "rate"), CASES)
def test_holdback_stays_within_the_documented_bound(fmt: str, rate: int) -> None:
    worst, bound, sizes = measure_holdback(fmt, rate)
    assert worst <= bound, f"{fmt}@{rate}: held back {worst} samples, documented bound {bound}"
    # Bytes come back from encode() long before the 1 s input ends, not at flush().
    first = next(i for i, n in enumerate(sizes) if n)
    assert (first + 1) * STEP <= bound + STEP
    assert sum(1 for n in sizes if n) >= rate // (bound + STEP)


@pytest.mark.parametrize(("fmt", "rate"), [("pcm", 24000), ("wav", 24000), ("mulaw", 8000), ("alaw", 8000)])
def test_sample_formats_hold_nothing_back(fmt: str, rate: int) -> None:
    worst, bound, sizes = measure_holdback(fmt, rate)
    assert worst == bound == 0
    assert all(sizes)


def test_bounds_are_not_vacuous() -> None:
    # The codecs that buffer do buffer, so the measurement above has something to measure.
    for fmt, rate in [("flac", 24000), ("opus", 24000), ("mp3", 24000), ("aac", 24000)]:
        worst, bound, _ = measure_holdback(fmt, rate)
        assert 0 < worst <= bound < rate // 4
