"""ASR test helpers: the reference ``transformers`` model on a checkpoint, deterministic test utterances."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def reference(path: Path) -> tuple[Any, Any]:
    """``transformers``' own model and feature extractor on a checkpoint directory."""
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    return WhisperForConditionalGeneration.from_pretrained(str(path)).eval(), WhisperFeatureExtractor.from_pretrained(
        str(path)
    )


def utterance(kind: str, seconds: float, rate: int = 16000, seed: int = 0) -> np.ndarray:
    """Deterministic test audio: ``noise``, or ``tone<Hz>`` (a sine), float32 mono."""
    n = int(seconds * rate)
    if kind == "noise":
        return (np.random.default_rng(seed).standard_normal(n) * 0.1).astype(np.float32)
    hz = float(kind.removeprefix("tone"))
    return (0.3 * np.sin(2 * np.pi * hz * np.arange(n) / rate)).astype(np.float32)


UTTERANCES = [("noise", 1.0), ("tone440", 2.0), ("tone220", 1.5), ("noise", 3.2), ("tone900", 0.7)]
