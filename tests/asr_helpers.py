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


def step_together(runner: Any, payloads: list[Any], slots: list[int] | None = None) -> list[tuple[str, list[int]]]:
    """Step a :class:`~omni_stream.models.whisper.runner.WhisperRunner` directly (its engine idle, ``record`` on):
    ``payloads`` admitted together, the ``i``-th in ``slots[i]`` (default ``i``), until each ends; each one's text
    and tokens. Every slot is released at the end."""
    from omni_stream.batch_model import Batch, Sequence

    assert runner.record
    mark = len(runner.log)
    seqs = [Sequence(i, p, slot=i if slots is None else slots[i]) for i, p in enumerate(payloads)]
    texts = [""] * len(seqs)
    batch, live = Batch(prefill=tuple(seqs)), list(seqs)
    while live:
        for out in runner.step(batch):
            if out.item is not None:
                texts[out.seq_id] += out.item.text
            if out.finished:
                live = [s for s in live if s.seq_id != out.seq_id]
        batch = Batch(decode=tuple(live))
    for seq in seqs:
        runner.release(seq)
    tokens: list[list[int]] = [[] for _ in seqs]
    for event in runner.log[mark:]:
        if event[0] == "token":
            tokens[event[1]].append(event[2])
    return list(zip(texts, tokens, strict=True))
