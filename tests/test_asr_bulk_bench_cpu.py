"""benchmarks/asr_bulk_bench.py --smoke on CPU: the three arms on the tiny Whisper, JSON with sane figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "asr_bulk_bench.py"


def test_smoke_run_writes_every_arm_with_sane_figures(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "GIT_COMMIT": "test"}
    proc = subprocess.run([sys.executable, str(BENCH), "--smoke"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    res = json.loads((tmp_path / "asr_bulk_bench_whisper-tiny-random_smoke.json").read_text())
    assert res["git_commit"] == "test" and res["device"] == "cpu" and res["bulk_slots"] == 4  # half of 8 slots
    assert [a["arm"] for a in res["arms"]] == ["alone", "files_bulk", "files_plain"]
    for a in res["arms"]:
        assert a["turns"] == 2 and 0 < a["turn_latency_p50_ms"] <= a["turn_latency_p95_ms"] <= a["turn_latency_max_ms"]
        assert (a["file_audio_s_per_s"] is None) == (a["arm"] == "alone") and a["wall_s"] > 0
    assert res["arms"][0]["file_windows_finished"] == 0
    assert res["state_after"] == dict.fromkeys(res["state_after"], 0)  # every window and turn released
    assert "files_bulk   turn latency p50" in proc.stdout
