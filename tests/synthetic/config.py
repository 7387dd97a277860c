"""Synthetic TTS checkpoint config (``model_type: synthetic_tts``) and the tone it speaks.

The synthetic family exists for tests and CPU benchmarks: its talker emits deterministic codes and its
codec turns them into a sine tone whose pitch names the voice, so a stream can be checked sample by sample.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from omni_stream.errors import ConfigError

MODEL_TYPE = "synthetic_tts"


@dataclass(slots=True, frozen=True)
class SyntheticConfig:
    """Units: ``sample_rate`` Hz, ``samples_per_frame`` samples (1920 = 80 ms at 24 kHz), costs in ms."""

    model_type: str = MODEL_TYPE
    model_name: str = "synthetic-tts"
    sample_rate: int = 24000
    samples_per_frame: int = 1920
    n_codebooks: int = 16
    codebook_size: int = 2048
    frames_per_char: float = 0.5  # output length: characters of text times this, at least one frame
    step_cost_ms: float = 0.0  # emulated device time per talker step (the worker thread sleeps)
    codec_cost_ms: float = 0.0  # emulated device time per codec batch
    codec_windows: tuple[int, ...] = (1, 2, 4, 8)  # frames per audio chunk: a ramp, then the last one repeats
    voices: tuple[str, ...] = ("alice", "bob", "carol", "dave")
    languages: tuple[str, ...] = ("English", "Chinese")
    task_types: tuple[str, ...] = ("CustomVoice", "VoiceDesign", "Base")
    default_task: str = "CustomVoice"
    fault_markers: bool = True  # honour [[fail:...]] markers in the text (see model.parse_faults)
    amplitude: float = 0.25

    def __post_init__(self) -> None:
        if self.model_type != MODEL_TYPE:
            raise ConfigError(f"model_type must be {MODEL_TYPE!r}, got {self.model_type!r}")
        if self.sample_rate <= 0 or self.samples_per_frame <= 0:
            raise ConfigError("sample_rate and samples_per_frame must be positive")
        if not self.codec_windows or min(self.codec_windows) < 1:
            raise ConfigError(f"codec_windows must be positive frame counts, got {self.codec_windows}")
        if self.default_task not in self.task_types:
            raise ConfigError(f"default_task {self.default_task!r} is not one of task_types {self.task_types}")
        if self.n_codebooks < 2:
            raise ConfigError("n_codebooks must be >= 2 (code 1 carries the tone)")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SyntheticConfig:
        check_keys(cls, data, MODEL_TYPE)
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @property
    def frame_seconds(self) -> float:
        return self.samples_per_frame / self.sample_rate


def write_checkpoint(path: str | Path, **options: Any) -> Path:
    """Write a synthetic checkpoint (``config.json``) into ``path``; ``options`` override SyntheticConfig fields."""
    return write_config(path, SyntheticConfig.from_dict(options).to_dict())


def check_keys(cls: type, data: dict[str, Any], model_type: str) -> None:
    """ConfigError naming every key of ``data`` that is no field of the dataclass ``cls``."""
    unknown = sorted(set(data) - {f.name for f in fields(cls)})
    if unknown:
        raise ConfigError(f"unknown {model_type} config keys: {', '.join(unknown)}")


def write_config(path: str | Path, config: dict[str, Any]) -> Path:
    """``config`` as ``path/config.json`` (the whole checkpoint of a synthetic family); returns ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return path


def tone_hz(tone: int) -> float:
    """Pitch of tone id ``tone`` (Hz): 20 Hz apart from 200 Hz, folded into 200-980 Hz."""
    return 200.0 + 20.0 * (tone % 40)


def tone_samples(config: SyntheticConfig, tone: int, start_frame: int, n_frames: int) -> np.ndarray:
    """The audio of frames ``[start_frame, start_frame + n_frames)`` of tone ``tone``: float32, phase-continuous."""
    spf = config.samples_per_frame
    n = np.arange(start_frame * spf, (start_frame + n_frames) * spf, dtype=np.float64)
    wave = config.amplitude * np.sin(2.0 * np.pi * tone_hz(tone) * n / config.sample_rate)
    return wave.astype(np.float32)


@dataclass(slots=True, frozen=True)
class Faults:
    """Where a request fails on purpose (frame or chunk index; None: never)."""

    step_at: int | None = None  # model.step raises (the whole batch fails) when this seq reaches the frame
    seq_at: int | None = None  # SeqOutput.error for this seq alone at the frame
    stage_at: int | None = None  # the codec stage raises after this many audio chunks
