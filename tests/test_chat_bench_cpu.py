"""benchmarks/chat_bench.py --smoke end to end on CPU: the real server with a TTS and an LLM, every level reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "chat_bench.py"


def test_smoke_run_reports_first_text_then_first_audio_at_every_level(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "GIT_COMMIT": "test"}
    proc = subprocess.run([sys.executable, str(BENCH), "--smoke"], env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    res = json.loads((tmp_path / "chat_bench_smoke.json").read_text())
    assert res["device"] == "cpu" and [lv["concurrency"] for lv in res["levels"]] == [1, 2]
    for lv in res["levels"]:
        assert 0 < lv["ttft_p50_ms"] <= lv["first_audio_p50_ms"], lv  # text first, then its speech
        assert lv["audio_s_per_request"] > 0 and lv["aggregate_x_realtime"] > 0
