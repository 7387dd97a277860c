"""The streaming resampler keeps frequency and level, joins chunks seamlessly, and equals one-shot resampling."""

from __future__ import annotations

import numpy as np
import pytest

from omni_stream.codecs import Resampler, resample
from omni_stream.codecs.testsignal import random_splits, speech_like

PAIRS = [(24000, 16000), (24000, 8000), (24000, 48000), (16000, 24000), (8000, 24000), (48000, 24000), (44100, 24000)]


def streamed(x: np.ndarray, src: int, dst: int, *, seed: int, high: int = 4000) -> tuple[np.ndarray, list[int]]:
    r = Resampler(src, dst, 1 if x.ndim == 1 else x.shape[1])
    parts = [r.process(x[s]) for s in random_splits(len(x), seed=seed, high=high)]
    parts.append(r.flush())
    joins = np.cumsum([len(p) for p in parts])[:-1].tolist()
    return np.concatenate(parts), joins


def sine(freq: float, rate: int, seconds: float = 1.0, amp: float = 0.5) -> np.ndarray:
    return (amp * np.sin(2 * np.pi * freq * np.arange(round(seconds * rate)) / rate)).astype(np.float32)


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_sine_keeps_frequency_and_amplitude_across_random_chunks(src: int, dst: int) -> None:
    freq = 997.0
    y, _ = streamed(sine(freq, src), src, dst, seed=src + dst)
    assert abs(len(y) - dst) <= 1
    body = y[dst // 10 : -dst // 10]
    spectrum = np.abs(np.fft.rfft(body * np.hanning(len(body))))
    peak_hz = np.argmax(spectrum) * dst / len(body)
    assert abs(peak_hz - freq) < dst / len(body)
    assert abs(np.sqrt(2) * np.sqrt(np.mean(body.astype(np.float64) ** 2)) - 0.5) < 0.005
    # Against the ideal sine at the output rate: no glitch anywhere, joins included.
    ideal = sine(freq, dst)[dst // 10 : -dst // 10]
    assert np.max(np.abs(body - ideal)) < 1e-3


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_no_discontinuity_at_chunk_joins(src: int, dst: int) -> None:
    y, joins = streamed(sine(440.0, src), src, dst, seed=3, high=700)
    # A 440 Hz sine at amplitude 0.5 moves at most 2*pi*440*0.5/dst per sample; a click would jump far more.
    limit = 2 * np.pi * 440 * 0.5 / dst * 1.05
    steps = np.abs(np.diff(y[dst // 20 : -dst // 20]))
    assert steps.max() < limit
    inner = [j for j in joins if dst // 20 < j < len(y) - dst // 20]
    assert inner and max(abs(float(y[j]) - float(y[j - 1])) for j in inner) < limit


@pytest.mark.parametrize(("src", "dst"), [*PAIRS, (44100, 23999)])
@pytest.mark.parametrize("channels", [1, 2])
def test_streamed_output_equals_one_shot_output(src: int, dst: int, channels: int) -> None:
    x = speech_like(1.0, src, seed=11)
    if channels == 2:
        x = np.stack([x, x[::-1]], axis=1)
    whole = resample(x, src, dst)
    for seed, high in [(1, 4000), (2, 37), (3, 1)]:
        n = len(x) if high > 1 else 2000  # one sample at a time on a prefix only, to stay fast
        part, _ = streamed(x[:n], src, dst, seed=seed, high=high)
        expected = whole if n == len(x) else resample(x[:n], src, dst)
        np.testing.assert_array_equal(part, expected)


def test_output_length_is_exact_and_int16_input_is_scaled() -> None:
    x = (sine(300.0, 24000, 0.5) * 32767).astype(np.int16)
    y = resample(x, 24000, 16000)
    assert y.dtype == np.float32 and len(y) == 8000
    assert 0.45 < np.abs(y).max() < 0.55


def test_identical_rates_pass_samples_through() -> None:
    x = speech_like(0.2, 16000)
    r = Resampler(16000, 16000)
    np.testing.assert_array_equal(np.concatenate([r.process(x[:1000]), r.process(x[1000:]), r.flush()]), x)


def test_downsampling_rejects_content_above_the_new_nyquist() -> None:
    y = resample(sine(7000.0, 24000), 24000, 8000)  # 7 kHz would alias to 1 kHz at 8 kHz
    assert np.sqrt(np.mean(y[800:-800].astype(np.float64) ** 2)) < 0.5 * 10 ** (-60 / 20)


def test_rejects_bad_rates_and_use_after_flush() -> None:
    with pytest.raises(ValueError, match="src_rate"):
        Resampler(0, 16000)
    with pytest.raises(ValueError, match="dst_rate"):
        Resampler(16000, 10**7)
    r = Resampler(24000, 16000)
    r.flush()
    with pytest.raises(ValueError, match="flush"):
        r.process(np.zeros(10, dtype=np.float32))


@pytest.mark.parametrize(("src", "dst"), [(24000, 16000), (16000, 24000), (44100, 16000), (16000, 16000)])
def test_process_pieces_gives_each_piece_what_process_would(src: int, dst: int) -> None:
    x = speech_like(1.3, src, seed=3)
    pieces = [x[s] for s in random_splits(x.size, seed=4, high=700)]
    pieces.insert(2, x[:0])  # an empty piece gets nothing
    one_by_one, together = Resampler(src, dst), Resampler(src, dst)
    head = x[:333]  # both part-way through a stream
    np.testing.assert_allclose(together.process(head), one_by_one.process(head), atol=1e-6)
    expected = [one_by_one.process(p) for p in pieces]
    got = together.process_pieces(pieces)
    assert [g.size for g in got] == [e.size for e in expected]
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, atol=1e-6)
    np.testing.assert_allclose(together.flush(), one_by_one.flush(), atol=1e-6)
