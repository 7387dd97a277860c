"""benchmarks/ws_deflate.py end to end on CPU, at a small size: both parts report, and each server run negotiated
what it claims to measure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "ws_deflate.py"


def test_small_run_reports_the_compressor_and_both_servers(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "GIT_COMMIT": "test"}
    cmd = [sys.executable, str(BENCH), "--seconds", "1", "--rounds", "1", "--sessions", "2", "--chars", "40"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    res = json.loads((tmp_path / "ws_deflate.json").read_text())
    assert set(res["compressor"]) == {"synthetic tone", "speech-like", "white noise"}
    for name, rows in res["compressor"].items():
        assert [r["message_bytes"] for r in rows] == [3840, 7680, 15360, 30720], name
        assert all(r["mb_per_s"] > 0 and r["us_per_message"] > 0 for r in rows)
    ratio = {name: rows[-1]["compressed_ratio"] for name, rows in res["compressor"].items()}
    assert ratio["synthetic tone"] < 0.2 < 0.6 < ratio["speech-like"] < ratio["white noise"] < 1.0
    runs = res["end_to_end"]
    assert [(r["deflate"], r["negotiated"]) for r in runs] == [(False, []), (True, ["permessage-deflate"])]
    assert all(r["audio_s"] > 0 and r["loop_cpu_ms_per_audio_s"] > 0 for r in runs)
