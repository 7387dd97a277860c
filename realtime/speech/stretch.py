"""Tempo change without pitch change (WSOLA), for the non-streamed ``speed`` field."""

from __future__ import annotations

import numpy as np


def time_stretch(x: np.ndarray, speed: float, sample_rate: int) -> np.ndarray:
    """Play ``x`` (float32 mono) ``speed`` times faster at the same pitch; output length ~ ``len(x) / speed``."""
    if speed == 1.0 or x.size == 0:
        return x
    frame = max(64, int(0.040 * sample_rate)) & ~1  # 40 ms windows, 50 % overlap at the output
    hop_out = frame // 2
    tolerance = frame // 4  # how far a window may slide to line up with the previous one
    pad = np.concatenate(
        [np.zeros(tolerance, np.float32), x.astype(np.float32), np.zeros(frame + tolerance, np.float32)]
    )
    n_out = round(x.size / speed)
    n_frames = n_out // hop_out + 1
    window = np.hanning(frame).astype(np.float32)
    y = np.zeros(n_frames * hop_out + frame, np.float32)
    weight = np.zeros_like(y)
    prev = tolerance  # where the previous window started in ``pad``
    for k in range(n_frames):
        nominal = tolerance + round(k * hop_out * speed)
        if k == 0 or nominal + frame + tolerance > pad.size:
            pos = min(nominal, pad.size - frame)
        else:
            natural = pad[prev + hop_out : prev + hop_out + frame]
            region = pad[nominal - tolerance : nominal + tolerance + frame]
            score = np.correlate(region, natural, mode="valid")
            pos = nominal - tolerance + int(np.argmax(score))
        y[k * hop_out : k * hop_out + frame] += pad[pos : pos + frame] * window
        weight[k * hop_out : k * hop_out + frame] += window
        prev = pos
    out = y / np.maximum(weight, 1e-3)
    return out[hop_out // 2 : hop_out // 2 + n_out].astype(np.float32) if n_out > 0 else out[:0]
