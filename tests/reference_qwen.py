"""The reference ``qwen_tts`` talker side, built from our checkpoint directories (tests only).

The reference imports its 25 Hz tokenizer eagerly (torchaudio, sox, onnxruntime), which the 12 Hz models
never use; stub modules stand in for them. The wrapper (``Qwen3TTSModel``) runs with our tokenizer files
and a speech tokenizer double that records the codes it is asked to decode, so parity tests compare codes
and do not depend on the codec side.
"""

from __future__ import annotations

import importlib.machinery
import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file


def _stub_unused_audio_deps() -> None:
    import transformers
    import transformers.modeling_utils  # noqa: F401

    for name in ("sox", "onnxruntime", "torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"):
        if name in sys.modules:
            continue
        try:
            __import__(name)
        except Exception:
            module = types.ModuleType(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)
            sys.modules[name] = module
    sys.modules["torchaudio"].compliance = sys.modules["torchaudio.compliance"]  # type: ignore[attr-defined]
    sys.modules["torchaudio.compliance"].kaldi = sys.modules["torchaudio.compliance.kaldi"]  # type: ignore[attr-defined]


def import_qwen_tts() -> Any:
    """Import the reference package, or skip the calling test when it is not installed."""
    _stub_unused_audio_deps()
    return pytest.importorskip("qwen_tts")


class CodeRecorder:
    """Stands in for the reference speech tokenizer: records the codes passed to ``decode``."""

    def __init__(self) -> None:
        self.codes: list[torch.Tensor] = []

    def decode(self, items: list[dict[str, Any]]) -> tuple[list[np.ndarray], int]:
        self.codes = [torch.as_tensor(it["audio_codes"]).cpu() for it in items]
        return [np.zeros(1920, dtype=np.float32) for _ in items], 24000


def reference_model(model_dir: Path) -> Any:
    """``Qwen3TTSForConditionalGeneration`` (fp32, eager attention) with our checkpoint's weights."""
    import_qwen_tts()
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration

    raw = json.loads((model_dir / "config.json").read_text())
    kwargs = {k: v for k, v in raw.items() if k not in ("architectures", "model_type", "dtype", "transformers_version")}
    cfg = Qwen3TTSConfig(**kwargs)
    for c in (cfg, cfg.talker_config, cfg.talker_config.code_predictor_config):
        c._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Qwen3TTSForConditionalGeneration(cfg).to(torch.float32).eval()
    state = load_file(str(model_dir / "model.safetensors"))
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    missing = [k for k in missing if not k.startswith("speaker_encoder.")]
    assert not missing and not unexpected, (missing, unexpected)
    model.load_generate_config(json.loads((model_dir / "generation_config.json").read_text()))
    return model


def reference_wrapper(model_dir: Path) -> tuple[Any, CodeRecorder]:
    """``Qwen3TTSModel`` over :func:`reference_model` with our tokenizer files and a :class:`CodeRecorder`."""
    import_qwen_tts()
    from qwen_tts import Qwen3TTSModel
    from qwen_tts.core.models.processing_qwen3_tts import Qwen3TTSProcessor
    from transformers import Qwen2TokenizerFast

    model = reference_model(model_dir)
    recorder = CodeRecorder()
    model.load_speech_tokenizer(recorder)
    processor = Qwen3TTSProcessor(tokenizer=Qwen2TokenizerFast.from_pretrained(str(model_dir)))
    return Qwen3TTSModel(model=model, processor=processor, generate_defaults=model.generate_config), recorder


GREEDY_KW = dict(do_sample=False, subtalker_dosample=False, repetition_penalty=1.05)


def voice_clone_item(x_vector: np.ndarray, ref_codes: np.ndarray | None, ref_text: str | None) -> Any:
    """A reference ``VoiceClonePromptItem`` (ICL when ``ref_codes`` is given, else x-vector only)."""
    import_qwen_tts()
    from qwen_tts.inference.qwen3_tts_model import VoiceClonePromptItem

    icl = ref_codes is not None
    return VoiceClonePromptItem(
        ref_code=torch.as_tensor(ref_codes, dtype=torch.long) if icl else None,
        ref_spk_embedding=torch.as_tensor(x_vector, dtype=torch.float32),
        x_vector_only_mode=not icl,
        icl_mode=icl,
        ref_text=ref_text,
    )


_CHECKPOINTS: dict[tuple[str, str], Path] = {}


def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory, kind: str, size: str = "0.6b") -> Path:
    """A tiny fp32 checkpoint (no speech tokenizer), written once per test session."""
    from omni_stream.models.qwen3_tts.checkpoint import write_tiny_checkpoint

    key = (kind, size)
    if key not in _CHECKPOINTS:
        out = tmp_path_factory.mktemp(f"qwen3-{kind}-{size}")
        _CHECKPOINTS[key] = write_tiny_checkpoint(out, kind, size, speech_tokenizer=False)
    return _CHECKPOINTS[key]
