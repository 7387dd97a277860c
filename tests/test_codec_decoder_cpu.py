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
        "triton_channels_last_phases_3_9_copied": (8, 29),
        "triton_channels_last_phases_3_9": (8, 29),
    }
    for a in arms.values():
        assert set(a["graphs"]) == {"1x1", "2x4"} and all(g["ms"] > 0 for g in a["graphs"].values())
    assert "window eager, host ms" in proc.stdout


WINDOWS = ("1x1", "32x4", "128x25")


def _fastest(tmp_path: Path, ms: dict[str, tuple[float, ...] | None]) -> dict[str, str]:
    # ms: each window's milliseconds (WINDOWS), None for an arm that failed (its entry holds the error alone)
    arms = {
        name: {"error": "CompilationError"}
        if t is None
        else {"graphs": {k: {"ms": v} for k, v in zip(WINDOWS, t, strict=True)}}
        for name, t in ms.items()
    }
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"arms": arms}))
    cmd = [sys.executable, str(BENCH), "--fastest", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=BENCH.parent)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(kv.split("=", 1) for kv in proc.stdout.split())


def test_the_fastest_arm_is_served_by_its_settings_unless_it_costs_another_window(tmp_path: Path) -> None:
    from omni_stream.models.qwen3_tts.codec import channels_last_setting
    from omni_stream.runtime.settings import Tuning

    ms: dict[str, tuple[float, ...] | None] = {
        "module": (2.4, 12.0, 212.0), "triton": (2.2, 8.7, 118.0), "triton_phases_9": (2.25, 7.9, 90.0),
        "triton_phases_3_9": (2.2, 7.0, 95.0), "triton_channels_last_phases_9": (2.5, 7.0, 70.0),
        "triton_channels_last_phases_3_9": (2.0, 76.0, 60.0),
    }  # fmt: skip
    # the two fastest 128 x 25 windows cost the one-frame window 14 % and the 32 x 4 one 9x: the next is served
    settings = _fastest(tmp_path, ms)
    assert settings == {"CODEC_ARM": "triton_phases_9", "OMNI_STREAM_CODEC_PHASES": "9",
                        "OMNI_STREAM_CODEC_CHANNELS_LAST": "off"}  # fmt: skip
    ms["triton_channels_last_phases_3_9"] = (2.0, 6.0, 60.0)
    ms["triton_channels_last_phases_3_9_copied"] = (1.9, 5.0, 50.0)  # not a setting: the previous code's path
    settings = _fastest(tmp_path, ms)
    assert settings["CODEC_ARM"] == "triton_channels_last_phases_3_9"
    tuning = Tuning.from_env(settings)
    assert tuning.codec_phases == frozenset({3, 9}) and channels_last_setting(tuning)
    ms["triton_channels_last_phases_3_9"] = None
    assert _fastest(tmp_path, ms)["CODEC_ARM"] == "triton_phases_9"
    ms = {name: (2.2, 8.7, 118.0 if name == "triton" else 130.0) for name in ms}
    settings = _fastest(tmp_path, ms)
    tuning = Tuning.from_env(settings)
    assert settings["CODEC_ARM"] == "triton" and not tuning.codec_phases
    assert not channels_last_setting(tuning)
