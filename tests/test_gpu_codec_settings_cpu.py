"""benchmarks/gpu_codec_settings.sh on CPU (CODEC_SETTINGS_SMOKE=1): the codec arms, the fastest arm's settings
served at every level, and the A/B servers, each with the settings it names, on the tiny models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_codec_settings.sh"


def test_the_fastest_arm_is_served_and_compared_in_one_run(tmp_path: Path) -> None:
    # the scripts call python3: this interpreter's
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PATH": path, "OUT": str(tmp_path), "GIT_COMMIT": "test", "CODEC_SETTINGS_SMOKE": "1",
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    for name in ("OMNI_STREAM_CODEC_PHASES", "OMNI_STREAM_CODEC_CHANNELS_LAST", "OMNI_STREAM_CODEC_STREAM"):
        env.pop(name, None)
    proc = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    codec = json.loads((tmp_path / "codec_decoder_tiny.json").read_text())  # every arm the script names ran
    assert set(codec["arms"]) == {"triton", "triton_phases_9", "triton_phases_3_9", "triton_channels_last_phases_9",
                                  "triton_channels_last_phases_3_9"}  # fmt: skip
    result = tmp_path / "codec_decoder_tiny.json"
    cmd = [sys.executable, str(SCRIPT.parent / "codec_decoder.py"), "--fastest", str(result)]
    chosen = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    settings = dict(kv.split("=", 1) for kv in chosen.stdout.split())
    arm = settings.pop("CODEC_ARM")
    runs = {
        arm: ([1, 2], settings),
        "plain": ([2], {"OMNI_STREAM_CODEC_PHASES": "none", "OMNI_STREAM_CODEC_CHANNELS_LAST": "off"}),
        f"{arm}_talker": ([2], settings | {"OMNI_STREAM_CODEC_STREAM": "off"}),
    }
    for tag, (levels, want) in runs.items():
        for transport in ("http", "ws"):
            res = json.loads((tmp_path / f"tts_bench_tiny-1.7b_test_{tag}_{transport}.json").read_text())
            codec_env = {k: v for k, v in res["env"].items() if k.startswith("OMNI_STREAM_CODEC_")}
            assert codec_env == want, (tag, transport)
            assert [lv["concurrency"] for lv in res["levels"]] == levels
            assert all(lv["exact_length_rate"] == 1.0 for lv in res["levels"])
    assert f"fastest: CODEC_ARM={arm}" in proc.stdout
