"""benchmarks/constrained_bench.py --smoke on CPU: constrained and free rows at batch 1 and 64, every figure sane."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "constrained_bench.py"


def test_smoke_run_measures_constrained_and_free_rows_at_batch_1_and_64(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "GIT_COMMIT": "test"}
    proc = subprocess.run([sys.executable, str(BENCH), "--smoke"], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    res = json.loads((tmp_path / "constrained_bench_cpu_smoke.json").read_text())
    assert res["git_commit"] == "test" and res["device"] == "cpu" and res["steps_per_row"] == 8
    levels = {(lv["batch"], lv["constrained_rows"]): lv for lv in res["levels"]}
    assert set(levels) == {(1, 0), (1, 1), (64, 0), (64, 32), (64, 64)}
    for (batch, constrained), lv in levels.items():
        assert lv["steps"] >= 7 and 0 < lv["step_ms_p50"] <= lv["step_ms_p90"]
        assert 1 <= lv["mean_rows"] <= batch
        assert (lv["mask_job_ms"] > 0) == (constrained > 0) and lv["mask_wait_ms"] >= 0
