"""The tiny random Qwen2.5-VL checkpoint of a test run (written once) and transformers' model of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_stream.models.qwen_vl.checkpoint import write_tiny_checkpoint

_BUILT: dict[str, Path] = {}


def tiny_vl_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Qwen2.5-VL checkpoint of this test run (written once)."""
    if "vl" not in _BUILT:
        _BUILT["vl"] = write_tiny_checkpoint(tmp_path_factory.mktemp("vl"), seed=0)
    return _BUILT["vl"]
