"""benchmarks/vl_session_bench.py --smoke end to end on CPU: every level reported, a question on held frames
prefills only itself and answers as the rebuilt prompt does, the JSON written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "vl_session_bench.py"


def test_smoke_run_reports_every_level(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "GIT_COMMIT": "test"}
    proc = subprocess.run([sys.executable, str(BENCH), "--smoke"], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    res = json.loads((tmp_path / "vl_session_bench_tiny-vl.json").read_text())
    assert res["git_commit"] == "test" and res["device"] == "cpu" and res["parameters"] > 0
    assert [lv["sessions"] for lv in res["levels"]] == [1, 2]
    for lv in res["levels"]:
        assert lv["same_tokens"] is True and lv["same_sessions"] == lv["sessions"]
        assert lv["frame_tokens"] == 8  # a 56 x 84 frame: 6 pads and the two vision markers
        assert 3 * 8 < lv["held_rows"] < 3 * 8 + 10  # the frames after the template's first turn
        assert lv["held_prefilled_tokens"] == lv["prompt_tokens"] - lv["held_rows"]  # the question alone
        assert lv["rebuilt_prefilled_tokens"] == lv["prompt_tokens"]
        assert lv["images_encoded"] == 2 * 3 * lv["sessions"]  # ingested once, encoded again for the rebuild
        assert lv["frames_per_s_total"] > 0 and 0 < lv["frames_per_s_per_session_min"]
        assert 0 < lv["held_ttft_p50_ms"] <= lv["held_ttft_max_ms"]
        assert 0 < lv["rebuilt_ttft_p50_ms"] <= lv["rebuilt_ttft_max_ms"]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| tiny-vl |")]
    assert [row.split(" | ")[1] for row in rows] == ["1", "2"]
