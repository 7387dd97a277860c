"""Audio samples as every model reads them: float32 mono in [-1, 1], one rule for every request that carries audio.

A request built in Python may hold int16 PCM (what a microphone, a WAV file or ``soundfile(dtype="int16")``
gives) or float64; both are read as the same sound (int16 scaled by 1/32768, as
:func:`omni_stream.codecs.pcm.to_float32` does), never as samples of ±32767. Any other dtype is refused: an
integer array of another width says nothing of its scale. Two-dimensional ``(n, channels)`` samples are averaged
to mono. NaN or infinite samples are refused.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from omni_stream.codecs.pcm import to_float32
from omni_stream.errors import InvalidRequestError


def mono_float(
    samples: npt.ArrayLike, param: str = "audio", error: type[InvalidRequestError] = InvalidRequestError
) -> np.ndarray:
    """``samples`` as float32 mono ``(n,)`` in the scale above; ``error`` (naming ``param``) when they cannot be."""
    x = np.asarray(samples)
    if x.dtype == np.int16:
        x = to_float32(x)
    elif x.dtype.kind != "f":
        raise error(f"{param} must be float samples in [-1, 1] or int16 PCM, got dtype {x.dtype}", param)
    if x.ndim == 2:
        x = x.mean(axis=1, dtype=np.float32)
    if x.ndim != 1:
        raise error(f"{param} must be mono samples (n,) or (n, channels), got shape {x.shape}", param)
    x = x.astype(np.float32, copy=False)
    if not np.isfinite(x).all():
        raise error(f"{param} holds NaN or infinite samples", param)
    return x
