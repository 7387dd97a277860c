"""benchmarks/video_bench.py --smoke on CPU: the tiny Helios in process and through the real server."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("diffusers", reason="needs the [video] extra (diffusers)")

BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"


def test_the_smoke_run_measures_every_level_of_both_transports(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setenv("GIT_COMMIT", "test")
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    sys.modules.pop("video_bench", None)
    import video_bench

    assert video_bench.main(["--smoke"]) == 0
    for name, transport in (("video_bench_cpu_tiny.json", "inproc"), ("video_bench_cpu_tiny_ws.json", "ws")):
        result = json.loads((tmp_path / name).read_text())
        assert result["commit"] == "test" and result["transport"] == transport and result["model"] == "tiny"
        assert [level["concurrency"] for level in result["levels"]] == [1, 2]
        for level in result["levels"]:
            assert level["sessions"] == level["concurrency"] and level["chunks_per_session"] == 2
            assert level["chunk_playback_s"] == pytest.approx(33 / 16)
            assert 0 < level["ttfc_p50_s"] <= level["ttfc_max_s"] < level["wall_s"]
            assert level["gap_p50_s"] > 0 and level["frames_per_s"] > 0 and level["bytes_per_session"] > 0
            if transport == "inproc":  # the model's calls from the worker's log: a session's 2 chunks, 1 step each
                calls = level["model_calls"]
                assert calls, level
                for kind in calls.values():
                    assert kind["calls"] >= 2 and 1 <= kind["mean_rows"] <= kind["max_rows"] <= level["concurrency"]
                    assert kind["ms_per_call"] > 0
    assert "ttfc p50" in capsys.readouterr().out
    assert video_bench.main(["--summarize"]) == 0
    assert "video_bench_cpu_tiny_ws.json" in capsys.readouterr().out
