"""benchmarks/burst_probe.py end to end on CPU, at a small size: every part of a burst's timeline reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "burst_probe.py"


def test_small_burst_reports_requests_worker_jobs_preparations_and_pauses(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "GIT_COMMIT": "test"}
    cmd = [sys.executable, str(BENCH), "--tiny", "--device", "cpu", "--bursts", "3", "--rounds", "2", "--frames", "3",
           "--sample-ms", "2"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    res = json.loads((tmp_path / "burst_probe_tiny.json").read_text())
    assert [(r["c"], r["round"]) for r in res["rounds"]] == [(3, 0), (3, 1)]
    for r in res["rounds"]:
        assert len(r["admitted_ms"]) == len(r["first_chunk_ms"]) == 3
        assert 0 < r["ttfa_ms_p50"] <= r["ttfa_ms_max"] and r["admitted_ms"][0] <= r["first_chunk_ms"][0]
        steps = [j for j in r["jobs"] if j[0] == "step"]
        assert sum(j[3] for j in steps) == 3  # every newcomer prefilled once before the last first chunk
        assert any(j[0] == "codec" for j in r["jobs"])
        start, end = r["prepare_ms"]
        assert 0 <= start <= end <= r["to_last_first_ms"]  # each prompt prepared on a thread, timed
        assert r["gc_ms"] >= 0 and r["loop_lag_ms_max"] >= 0
        assert set(r["stack_samples"]) == {"before the first step", "after", "steady, after the last first chunk"}
        assert {"loop", "worker"} == set(r["stack_samples"]["after"])
        steady = r["stack_samples"]["steady, after the last first chunk"]  # the round's later steps, sampled too
        assert sum(n for _, n in steady["worker"]) > 0 and r["round_ms"] > r["to_last_first_ms"]
