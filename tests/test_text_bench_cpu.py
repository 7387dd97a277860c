"""benchmarks/text_bench.py --smoke end to end on CPU: every level reported with sane figures, a table, the JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "text_bench.py"
LEVEL_FIELDS = (
    "concurrency", "tokens_per_request", "prompt_tokens", "exact_length_rate", "ttft_p50_ms", "ttft_p95_ms",
    "ttft_max_ms", "tpot_p50_ms", "tok_s_per_stream_p50", "tok_s_per_stream_min", "aggregate_tok_s", "wall_s",
    "steps", "step_wall_ms_p50", "step_wall_ms_full_batch_p50", "batch_size_mean", "graph_steps", "eager_steps",
)  # fmt: skip


def test_smoke_run_reports_every_level(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "GIT_COMMIT": "test"}
    proc = subprocess.run([sys.executable, str(BENCH), "--smoke"], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    res = json.loads((tmp_path / "text_bench_tiny-chat.json").read_text())
    assert res["git_commit"] == "test" and res["device"] == "cpu" and res["model_type"] == "qwen3"
    assert res["cuda_graphs"] is False and res["parameters"] > 0
    assert [lv["concurrency"] for lv in res["levels"]] == [1, 2]
    for lv in res["levels"]:
        assert all(lv[f] is not None for f in LEVEL_FIELDS), lv
        assert lv["exact_length_rate"] == 1.0 and lv["tokens_per_request"] == 8 and lv["prompt_tokens"] >= 16
        assert 0 < lv["ttft_p50_ms"] <= lv["ttft_p95_ms"] <= lv["ttft_max_ms"]
        assert 0 < lv["tok_s_per_stream_min"] <= lv["tok_s_per_stream_p50"]
        # all tokens over one wall clock, which lasts at least the slowest first token
        assert 0 < lv["aggregate_tok_s"] <= lv["concurrency"] * 8 / (lv["ttft_max_ms"] / 1000)
        # one step per token (the first also prefills); requests may join a level a step apart
        assert lv["steps"] >= 8 and 1 <= lv["batch_size_mean"] <= lv["concurrency"]
        assert lv["eager_steps"] == lv["steps"] and lv["graph_steps"] == 0
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| tiny-chat |")]
    assert [row.split(" | ")[1] for row in rows] == ["1", "2"]
