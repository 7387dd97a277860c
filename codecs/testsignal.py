"""Deterministic speech-like signals and comparison metrics, for the codec tests and benchmarks."""

from __future__ import annotations

import numpy as np


def speech_like(seconds: float, sample_rate: int, *, seed: int = 0, peak: float = 0.5) -> np.ndarray:
    """Voiced harmonics (f0 110-220 Hz with 5 Hz vibrato, syllable envelope) plus noise bursts; float32 mono."""
    rng = np.random.default_rng(seed)
    n = round(seconds * sample_rate)
    t = np.arange(n) / sample_rate
    f0 = 150 + 40 * np.sin(2 * np.pi * 0.7 * t + rng.uniform(0, 6.3)) + 6 * np.sin(2 * np.pi * 5.0 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sample_rate
    voiced = np.zeros(n)
    for k in range(1, 40):
        if k * 220 >= min(sample_rate / 2, 5000):
            break
        voiced += np.sin(k * phase + rng.uniform(0, 6.3)) / k
    syllables = np.clip(np.sin(2 * np.pi * 3.5 * t + rng.uniform(0, 6.3)), 0, None) ** 0.5
    noise = rng.standard_normal(n)
    noise = np.convolve(noise, [0.5, -0.3, 0.2], mode="same")  # tilt toward fricative-like highs
    bursts = (np.sin(2 * np.pi * 1.3 * t + rng.uniform(0, 6.3)) > 0.85).astype(np.float64)
    bursts = np.convolve(bursts, np.hanning(max(3, sample_rate // 100)), mode="same")
    bursts /= max(bursts.max(), 1e-9)
    x = 0.8 * voiced * syllables + 0.25 * noise * bursts
    return (peak * x / np.abs(x).max()).astype(np.float32)


def find_delay(reference: np.ndarray, decoded: np.ndarray, max_delay: int) -> int:
    """Lag ``d`` in ``0..max_delay`` maximizing the correlation of ``decoded[d:]`` with ``reference``."""
    ref = np.asarray(reference, dtype=np.float64)
    dec = np.asarray(decoded, dtype=np.float64)
    n = min(len(ref), len(dec) - max_delay)
    if n <= 0:
        raise ValueError("decoded signal is shorter than max_delay")
    scores = [float(np.dot(ref[:n], dec[d : d + n])) for d in range(max_delay + 1)]
    return int(np.argmax(scores))


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    """Signal-to-noise ratio of ``test`` against ``reference`` (same length), in dB."""
    ref = np.asarray(reference, dtype=np.float64)
    err = np.asarray(test, dtype=np.float64) - ref
    return float(10 * np.log10(np.sum(ref**2) / max(np.sum(err**2), 1e-30)))


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation of two equal-length signals."""
    return float(np.corrcoef(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))[0, 1])


def random_splits(n: int, *, seed: int, low: int = 1, high: int = 4000) -> list[slice]:
    """Consecutive slices covering ``range(n)`` with seeded random lengths in ``low..high``."""
    rng = np.random.default_rng(seed)
    out, i = [], 0
    while i < n:
        step = int(rng.integers(low, high + 1))
        out.append(slice(i, min(i + step, n)))
        i += step
    return out
