"""Loads the reference ``qwen_tts`` speech tokenizer and speaker encoder for parity tests (tests only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import reference_qwen
import torch


def import_qwen_tts() -> Any:
    """Import the reference package, or skip the calling test when it is not installed."""
    pytest.importorskip("librosa")
    return reference_qwen.import_qwen_tts()


def reference_speech_tokenizer(directory: Path, dtype: torch.dtype = torch.float32) -> Any:
    """``Qwen3TTSTokenizer.from_pretrained`` (eager attention) on a ``speech_tokenizer`` directory."""
    import_qwen_tts()
    from qwen_tts import Qwen3TTSTokenizer

    return Qwen3TTSTokenizer.from_pretrained(str(directory), dtype=dtype, attn_implementation="eager")


def reference_mel(audio: torch.Tensor) -> torch.Tensor:
    """The reference speaker-encoder mel front end on float32 audio ``[T]`` -> ``[1, 128, frames]``."""
    import_qwen_tts()
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram

    return mel_spectrogram(
        audio[None], n_fft=1024, num_mels=128, sampling_rate=24000, hop_size=256, win_size=1024, fmin=0, fmax=12000
    )


def reference_speaker_encoder(config: dict[str, Any], state: dict[str, torch.Tensor]) -> Any:
    """The reference ECAPA-TDNN built from ``config`` with ``speaker_encoder.*`` weights loaded strictly."""
    import_qwen_tts()
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSSpeakerEncoderConfig
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSSpeakerEncoder

    model = Qwen3TTSSpeakerEncoder(Qwen3TTSSpeakerEncoderConfig(**config)).eval()
    prefix = "speaker_encoder."
    model.load_state_dict({k[len(prefix) :]: v for k, v in state.items()}, strict=True)
    return model


_TINY_DIRS: dict[int, Path] = {}


def tiny_checkpoint_dir(tmp_path_factory: pytest.TempPathFactory, seed: int = 0) -> Path:
    """A directory holding a tiny ``speech_tokenizer/`` (written once per test session and seed)."""
    if seed not in _TINY_DIRS:
        from omni_stream.models.qwen3_tts.codec_checkpoint import write_tiny_speech_tokenizer

        out = tmp_path_factory.mktemp(f"qwen3_codec_{seed}")
        write_tiny_speech_tokenizer(out, seed=seed)
        _TINY_DIRS[seed] = out
    return _TINY_DIRS[seed]
