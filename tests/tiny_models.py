"""The real tiny families' checkpoints as the tests share them: built once per machine into the embedded-checkpoint
cache (atomically, so parallel test workers and later runs reuse one build), never per test.

Each is the family's own tiny random-weight checkpoint in its real layout: the embedded default where the family
declares one (Qwen3-TTS CustomVoice, the Qwen3 chat model, Whisper), else the same writer keyed by the family's
embedded name (so a change to a writer, which renames its embedded default, rebuilds these too).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from omni_stream.family import ModelKind
from omni_stream.family_registry import embedded_checkpoint
from omni_stream.runtime.cache import embedded_checkpoint_dir

TTS_KINDS = ("custom_voice", "base", "voice_design")


def tiny_tts(kind: str = "custom_voice", *, greedy_frames: int | None = None) -> Path:
    """The tiny Qwen3-TTS checkpoint of ``kind`` (``custom_voice``: the embedded default; ``base``: voice cloning,
    uploads; ``voice_design``).

    ``greedy_frames``: the same weights with a ``generation_config.json`` of greedy decoding (both code predictors)
    and ``max_new_tokens = greedy_frames``, so a request that names no bound speaks at most ``greedy_frames - 1``
    frames (the length rule of the runner), and the same text in the same voice gives the same codes each time:
    what a test of a route needs to compare two ways of asking, quickly, from a model that never stops on its own.
    """
    if kind not in TTS_KINDS:
        raise ValueError(f"kind must be one of {TTS_KINDS}, got {kind!r}")
    from omni_stream.models.qwen3_tts.checkpoint import write_tiny_checkpoint
    from omni_stream.models.qwen3_tts.family import EMBEDDED_NAME

    if kind == "custom_voice":
        source = embedded_checkpoint(ModelKind.SPEECH)
    else:
        name = f"tests-{EMBEDDED_NAME}-{kind}"
        source = embedded_checkpoint_dir(name, lambda out: write_tiny_checkpoint(out, kind, "0.6b", seed=0), kind)
    if greedy_frames is None:
        return source

    def greedy_copy(out: Path) -> None:
        shutil.copytree(source, out, dirs_exist_ok=True)
        path = out / "generation_config.json"
        config = json.loads(path.read_text())
        config.update(do_sample=False, subtalker_dosample=False, max_new_tokens=greedy_frames)
        path.write_text(json.dumps(config, indent=2))

    name = f"tests-{EMBEDDED_NAME}-{kind}-greedy-{greedy_frames}"
    return embedded_checkpoint_dir(name, greedy_copy, f"{kind}, greedy, at most {greedy_frames - 1} frames")


def tiny_lm() -> Path:
    """The tiny Qwen3 chat checkpoint (the embedded text default)."""
    return embedded_checkpoint(ModelKind.TEXT)


def tiny_asr() -> Path:
    """The tiny multilingual Whisper (the embedded transcription default)."""
    return embedded_checkpoint(ModelKind.TRANSCRIPTION)
