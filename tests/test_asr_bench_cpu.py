"""benchmarks/asr_bench.py --smoke on CPU: the tiny checkpoint at two concurrencies, JSON with sane figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "asr_bench.py"


def test_smoke_run_writes_every_level_with_sane_figures(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "GIT_COMMIT": "test"}
    proc = subprocess.run([sys.executable, str(BENCH), "--smoke"], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    res = json.loads((tmp_path / "asr_bench_whisper-tiny-random_smoke.json").read_text())
    assert res["git_commit"] == "test" and res["device"] == "cpu" and res["max_tokens"] == 4
    assert res["feature_extraction_ms"] > 0
    passes = res["encoder_pass_ms_by_bucket"]  # every bucket the engine encodes at (levels 1, 2: slots 2)
    assert list(passes) == ["1", "2"] and all(ms > 0 for ms in passes.values()), passes
    assert "encoder pass by batch bucket (ms): 1: " in proc.stdout
    assert res["encoder_windows"] == [1500] and res["encoder_pass_ms_by_window"] == {}  # the whole window alone
    assert [lv["concurrency"] for lv in res["levels"]] == [1, 2]
    for lv in res["levels"]:
        assert lv["utterances"] == lv["concurrency"]  # one round per client
        assert 0 < lv["first_text_p50_ms"] <= lv["latency_p50_ms"] <= lv["latency_p95_ms"] <= lv["latency_max_ms"]
        assert 1 <= lv["tokens_per_utterance"] <= 4 and 0 <= lv["at_max_tokens_rate"] <= 1
        assert lv["utterances_per_s"] > 0 and lv["steps"] >= 4 and 1 <= lv["max_batch"] <= lv["concurrency"]
        assert lv["mean_batch"] <= lv["max_batch"] and lv["model_ms_per_step"] > 0


def test_a_shorter_window_encodes_each_utterance_in_it_and_times_every_window(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "GIT_COMMIT": "test"}
    cmd = [sys.executable, str(BENCH), "--smoke", "--window-ms", "2000"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    res = json.loads((tmp_path / "asr_bench_whisper-tiny-random_smoke_window2000.json").read_text())
    assert res["transcription_window_ms"] == 2000
    assert res["encoder_windows"] == [100, 200, 400, 800, 1500]
    assert res["utterance_window"] == 200  # the smoke run's 1 s utterances, with the 2 s margin: 150 frames
    by_window = res["encoder_pass_ms_by_window"]
    assert list(by_window) == ["100", "200", "400", "800"]
    assert all(list(b) == ["1", "2"] and all(ms > 0 for ms in b.values()) for b in by_window.values())
    assert "a 1.0 s utterance is encoded in 200 frames" in proc.stdout
    assert all(lv["utterances"] == lv["concurrency"] for lv in res["levels"])
