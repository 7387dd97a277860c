"""ASR test fixtures (load with ``pytest_plugins = ("asr_fixtures",)``): tiny Whisper checkpoints, built once per
run (multilingual and English-only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_stream.models.whisper.checkpoint import write_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_whisper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("whisper") / "whisper-tiny")


@pytest.fixture(scope="session")
def tiny_whisper_en(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("whisper-en") / "whisper-tiny.en", multilingual=False)
