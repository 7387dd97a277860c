"""benchmarks/codec_decoder.py on CPU at the tiny size: every arm sets up the decoder it names and times it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "codec_decoder.py"


def test_every_arm_runs_with_the_settings_it_names(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path), "GIT_COMMIT": "test", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(BENCH), "--tiny", "--device", "cpu", "--reps", "1"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=280, cwd=BENCH.parent)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    res = json.loads((tmp_path / "codec_decoder_tiny.json").read_text())
    arms = res["arms"]
    # (dilated convolutions over phases, channel-major weights) per arm: 4 decoder blocks, 29 vocoder convolutions
    # with more than one output channel
    assert {name: (a["phase_convs"], a["channels_last_weights"]) for name, a in arms.items()} == {
        "module": (0, 0),
        "triton": (0, 0),
        "triton_phases_9": (4, 0),
        "triton_phases_3_9": (8, 0),
        "triton_channels_last": (0, 29),
        "triton_channels_last_phases_9": (4, 29),
    }
    for a in arms.values():
        assert set(a["graphs"]) == {"1x1", "2x4"} and all(g["ms"] > 0 for g in a["graphs"].values())
    assert "window eager, host ms" in proc.stdout
