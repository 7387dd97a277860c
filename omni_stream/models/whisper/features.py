"""Whisper's log-mel features of an utterance in its encoder window, computed over the audio alone.

``transformers``' ``WhisperFeatureExtractor`` pads an utterance with zeros to the whole 30 s window and computes the
spectrogram of all of it: 17 ms of a core for a 3 s turn here (7 ms on the H200 host, ``asr_bench``), and when 32
voice sessions pause together their 32 extractions share the host's cores and the interpreter with the turn
detectors and the event loop. Past the audio, the window is silence, and every frame whose 25 ms reads only zeros has
one value: the floor the extractor clamps to, normalized like the rest (the extractor's maximum is taken over the
whole spectrogram, and a silent frame is never above it). So :func:`window_features` runs the extractor over the
audio and enough zeros that its last frames read silence only, then repeats that last frame to the window's end:
the extractor's own arithmetic on every frame it computes, the same values as its 30 s pass (the tests compare them
over lengths from 10 ms to 30 s). A checkpoint that dithers (random noise over the whole window) takes the
extractor's whole pass.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

SAMPLE_RATE = 16000
HOP = 160  # samples per log-mel frame (10 ms)
SAMPLES_PER_FRAME = 2 * HOP  # per encoder frame (its convolutions halve the log-mel frames)
# Zeros past the audio before the first frame that reads none of it: a frame reads n_fft = 400 samples around its
# centre (200 each side); with 400 more, the computed part's last frame (its centre 160 samples before the end, its
# reflected padding zeros too) reads silence only.
SILENT_TAIL = 400
# At least this much is computed: over a few frames the mel filters' product took another kernel here, and its values
# differed from the 30 s pass's in the last bit (under 20 frames); a second costs well under a millisecond.
LEAST = SAMPLE_RATE


def window_features(extractor: Any, samples: np.ndarray, window: int) -> torch.Tensor:
    """Log-mel features ``[n_mels, 2 * window]`` (float32) of ``samples`` (16 kHz mono) zero-padded to ``window``
    encoder frames: what ``extractor`` gives for the whole padded window, cut to it."""
    frames = 2 * window
    if samples.size > window * SAMPLES_PER_FRAME:
        raise ValueError(f"{samples.size} samples do not fit a window of {window} frames")
    computed = extractor.n_samples  # the whole 30 s window
    if not getattr(extractor, "dither", 0.0):  # silence stays silent: stop after the first silent frames
        tail = math.ceil((samples.size + SILENT_TAIL) / SAMPLES_PER_FRAME) * SAMPLES_PER_FRAME
        computed = min(computed, max(LEAST, tail))
    out = extractor(
        samples, sampling_rate=SAMPLE_RATE, padding="max_length", max_length=computed, return_tensors="pt"
    ).input_features[0]
    if out.shape[-1] >= frames:  # audio up to the window's end: its last frames read the zeros past it
        return out[:, :frames].contiguous()
    full = torch.empty(out.shape[0], frames, dtype=out.dtype)
    full[:, : out.shape[-1]] = out
    full[:, out.shape[-1] :] = out[:, -1:]  # a silent frame: the rest of the window is the same
    return full
