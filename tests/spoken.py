"""Real speech for tests, rendered offline by espeak-ng (a Debian package; tests that need it skip without it)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

ESPEAK = shutil.which("espeak-ng")
needs_espeak = pytest.mark.skipif(ESPEAK is None, reason="espeak-ng is not installed (apt-get install espeak-ng)")


def speak(text: str, voice: str = "en-us") -> tuple[np.ndarray, int]:
    """``text`` spoken by espeak-ng: float32 mono samples and their rate (22050 Hz)."""
    assert ESPEAK is not None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "speech.wav"
        subprocess.run([ESPEAK, "-v", voice, "-w", str(path), text], check=True, capture_output=True, timeout=60)
        samples, rate = sf.read(path, dtype="float32")
    return samples, int(rate)


def spoken_span(samples: np.ndarray, rate: int, floor: float = 0.01) -> tuple[float, float]:
    """Seconds from the first to the last sample louder than ``floor`` times the peak (-40 dB): the spoken part."""
    loud = np.flatnonzero(np.abs(samples) > floor * np.abs(samples).max())
    return loud[0] / rate, (loud[-1] + 1) / rate
