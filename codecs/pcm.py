"""Sample conversions shared by the encoders: chunk validation, float32 <-> int16."""

from __future__ import annotations

import numpy as np

# Full scale for float -> int16: symmetric, so +1.0 and -1.0 both fit without clipping asymmetry.
INT16_SCALE = 32767.0


def as_frames(pcm: np.ndarray, channels: int) -> np.ndarray:
    """Validate a chunk and view it as ``(n, channels)``: float32 in [-1, 1] or int16, as given."""
    x = np.asarray(pcm)
    if x.dtype == np.int16:
        pass
    elif x.dtype.kind == "f":
        x = x.astype(np.float32, copy=False)
    else:
        raise TypeError(f"pcm must be float32 in [-1, 1] or int16, got dtype {x.dtype}")
    if x.ndim == 1:
        if channels != 1:
            raise ValueError(f"pcm of shape {x.shape} given to a {channels}-channel encoder; pass (n, {channels})")
        return x[:, None]
    if x.ndim == 2 and x.shape[1] == channels:
        return x
    raise ValueError(f"pcm must have shape (n,) or (n, {channels}), got {x.shape}")


def to_int16(x: np.ndarray) -> np.ndarray:
    """Quantize float samples to int16 (clipped, rounded to nearest, NaN -> 0); int16 input is returned as is."""
    if x.dtype == np.int16:
        return x
    y = np.clip(x, -1.0, 1.0) * np.float32(INT16_SCALE)
    np.nan_to_num(y, copy=False)
    return np.rint(y, out=y).astype(np.int16)


def to_float32(x: np.ndarray) -> np.ndarray:
    """float32 samples in [-1, 1); int16 is scaled by 1/32768."""
    if x.dtype == np.int16:
        return x.astype(np.float32) * np.float32(1.0 / 32768.0)
    return x.astype(np.float32, copy=False)
