"""The synthetic families live with the tests: the installed package neither holds nor serves them, and a process
finds them only as a plugin (declared at run time, or through the entry point ``synthetic.plugin_site`` writes)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
from synthetic import TESTS, subprocess_env, write_checkpoint

from omni_stream import family_registry
from omni_stream.engine import AsyncEngine
from omni_stream.errors import ConfigError

PROBE = "from omni_stream.family_registry import known_families; print(' '.join(known_families()))"


def test_the_package_holds_no_synthetic_family():
    assert importlib.util.find_spec("omni_stream.models.synthetic") is None


async def test_a_registry_of_the_package_alone_refuses_a_synthetic_checkpoint(monkeypatch, tmp_path):
    monkeypatch.setattr(family_registry, "_REGISTRY", family_registry._Registry())
    assert not [t for t in family_registry.known_families() if t.startswith("synthetic")]
    with pytest.raises(ConfigError, match="unknown model_type 'synthetic_tts'"):
        await AsyncEngine.from_pretrained(write_checkpoint(tmp_path / "tts"), progress=False)


def test_a_process_finds_them_only_through_the_plugin_entry_point(tmp_path):
    plain = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = [sys.executable, "-c", PROBE]
    without = subprocess.run(run, env=plain, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True)
    assert "qwen3_tts" in without.stdout.split() and "synthetic" not in without.stdout
    env = plain | subprocess_env(tmp_path / "site")
    assert str(TESTS) in env["PYTHONPATH"]
    found = subprocess.run(run, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True)
    assert {"synthetic_tts", "synthetic_lm", "synthetic_asr"} <= set(found.stdout.split())
