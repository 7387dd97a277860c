"""benchmarks/sampling_bench.py --smoke on CPU: the sampler timed for 1 and 32 rows at two vocabularies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "sampling_bench.py"


def test_smoke_run_times_the_sampler_for_each_vocabulary_and_row_count(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "GIT_COMMIT": "test"}
    proc = subprocess.run([sys.executable, str(BENCH), "--smoke"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    res = json.loads((tmp_path / "sampling_bench_cpu_smoke.json").read_text())
    assert res["git_commit"] == "test" and res["device"] == "cpu" and res["repeats"] == 3
    assert res["sampling"] == {"temperature": 0.6, "top_k": 20, "top_p": 0.95}
    assert {(lv["vocab"], lv["rows"]) for lv in res["levels"]} == {(4096, 1), (4096, 32), (3072, 1), (3072, 32)}
    assert all(lv["sample_ms"] > 0 for lv in res["levels"])
    assert "sample ms" in proc.stdout
