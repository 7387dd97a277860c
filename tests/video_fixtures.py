"""Video test fixtures (load with ``pytest_plugins = ("video_fixtures",)``): a tiny random Helios checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def video_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from omni_stream.models.helios.checkpoint import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("helios") / "helios-tiny")
