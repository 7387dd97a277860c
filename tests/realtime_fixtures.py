"""Realtime test fixtures: the voice agent's engine on the real tiny families (:func:`real_agent_loader`: the tests'
greedy Qwen3-TTS, the tiny Qwen3 chat model, the tiny Whisper; the server's own Silero VAD), the same on doubles
(:func:`agent_checkpoints`: synthetic TTS + echo LM + an ASR model, for the tests that need an exact transcript and
answer), spoken test audio.

The doubles' speech-input models are chosen by environment so the same tests run on the real ones:
``OMNI_STREAM_TEST_VAD`` names a VAD factory (``module:attr``, a ``VadParams -> VoiceActivityDetector``) and
``OMNI_STREAM_TEST_ASR`` an ASR checkpoint directory; unset, the deterministic doubles of
:mod:`realtime_doubles` serve.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from realtime_doubles import energy_vad, write_tone_asr
from synthetic import write_checkpoint
from synthetic.lm_family import write_lm_checkpoint

from omni_stream.codecs.resample import resample
from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.family import ModelKind

REAL_MODELS = bool(os.environ.get("OMNI_STREAM_TEST_ASR"))  # exact transcripts hold for the doubles only


def vad_factory() -> Any:
    target = os.environ.get("OMNI_STREAM_TEST_VAD")
    if not target:
        return energy_vad
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def agent_checkpoints(root: Path, *, reply_prefix: str = "", tts: dict | None = None) -> dict[str, Path]:
    asr = os.environ.get("OMNI_STREAM_TEST_ASR")
    return {
        "tts": write_checkpoint(root / "tts", **(tts or {})),
        "lm": write_lm_checkpoint(root / "lm", reply_prefix=reply_prefix),
        "asr": Path(asr) if asr else write_tone_asr(root / "asr"),
    }


def agent_loader(checkpoints: dict[str, Path], **options: Any) -> Any:
    """An async factory of the agent's engine (what ``create_app`` takes)."""

    async def load() -> AsyncEngine:
        sources = {
            "tts": ModelSource(checkpoints["tts"]),
            "lm": ModelSource(checkpoints["lm"], kind=ModelKind.TEXT),
            "asr": ModelSource(checkpoints["asr"], kind=ModelKind.TRANSCRIPTION),
        }
        return await AsyncEngine.load(sources, progress=False, **options)

    return load


def real_agent_loader(**options: Any) -> Any:
    """An async factory of the agent's engine on the real tiny families (checkpoints built once per machine)."""
    from serving_helpers import tts_checkpoint
    from tiny_models import tiny_asr, tiny_lm

    checkpoints = {"tts": tts_checkpoint(), "lm": tiny_lm(), "asr": tiny_asr()}
    return agent_loader(checkpoints, **options)


def espeak(text: str, rate: int = 24000) -> np.ndarray:
    """``text`` spoken by espeak-ng, as int16 at ``rate`` (skips the test without espeak-ng)."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        pytest.skip("espeak-ng is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "speech.wav"
        subprocess.run([exe, "-w", str(path), text], check=True, capture_output=True, timeout=60)
        audio, src = sf.read(path, dtype="float32")
    audio = resample(audio, src, rate) if src != rate else audio
    return np.rint(np.clip(audio, -1, 1) * 32767).astype(np.int16)


def framed(speech: np.ndarray, rate: int = 24000, lead_ms: int = 300, tail_ms: int = 1200) -> np.ndarray:
    """``speech`` with silence before and after (so a detector hears where it ends)."""
    return np.concatenate(
        [np.zeros(rate * lead_ms // 1000, np.int16), speech, np.zeros(rate * tail_ms // 1000, np.int16)]
    )
