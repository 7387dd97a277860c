"""Serving test fixtures (load with ``pytest_plugins = ("serving_fixtures",)``), session-scoped: the shared server
on the tiny Qwen3-TTS (``live_server``), and the synthetic checkpoint and its server (``synthetic_server``) for the
tests that need the synthetic TTS's tones or fault markers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from serving_helpers import LiveServer, make_checkpoint, running_server, tts_checkpoint
from synthetic import subprocess_env

from omni_stream.realtime.settings import Settings


@pytest.fixture(scope="session")
def synthetic_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("synthetic"))


@pytest.fixture(scope="session")
def synthetic_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment additions under which ``omni-stream serve`` in a subprocess serves synthetic checkpoints."""
    return subprocess_env(tmp_path_factory.mktemp("synthetic-site"))


@pytest.fixture(scope="session")
def synthetic_server(synthetic_checkpoint: Path) -> Iterator[LiveServer]:
    """The synthetic TTS's shared server: default settings, no auth, voices in memory only."""
    with running_server(synthetic_checkpoint, Settings(ws_config_timeout=2.0, ws_idle_timeout=5.0)) as live:
        yield live


@pytest.fixture(scope="session")
def live_server() -> Iterator[LiveServer]:
    """The shared server on the tiny Qwen3-TTS CustomVoice (``serving_helpers.tts_checkpoint``): default settings
    but short socket timeouts and the benchmark fields (``ignore_eos``: an exact number of frames), no auth, voices
    in memory only."""
    settings = Settings(ws_config_timeout=2.0, ws_idle_timeout=5.0, enable_benchmark_fields=True)
    with running_server(tts_checkpoint(), settings) as live:
        yield live
