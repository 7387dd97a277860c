"""benchmarks/gpu_suite_report.py: the suite's status lines and result files become one report and a table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from gpu_suite_report import collect, main, table


def write_run(tmp: Path) -> tuple[Path, Path]:
    status = tmp / "status.tsv"
    status.write_text("tts\tok\t0\t61\t150\nasr\ttimeout\t124\t100\t100\nvideo\tskipped\t-\t0\t180\n")
    results = tmp / "results"
    results.mkdir()
    levels = [{"concurrency": 1, "ttfa_p50_ms": 37.04, "aggregate_xrt": 9.2}, {"concurrency": 32, "ttfa_p50_ms": 251.0}]
    (results / "tts_bench_1.7b_http.json").write_text(json.dumps({"levels": levels}))
    (results / "asr_bench_whisper_cuda.json").write_text('{"levels": [')  # cut off by the time cap
    (results / "text_bench_qwen3.json").write_text("{}")  # no status line: not attached to any benchmark
    return status, results


def test_each_benchmark_carries_its_status_and_its_own_result_files(tmp_path):
    report = collect(*write_run(tmp_path))
    rows = {r["name"]: r for r in report["benchmarks"]}
    assert list(rows) == ["tts", "asr", "video"]
    tts = rows["tts"]
    assert (tts["status"], tts["rc"], tts["wall_s"], tts["limit_s"]) == ("ok", 0, 61, 150)
    assert rows["video"]["rc"] is None and rows["video"]["results"] == {}
    assert rows["tts"]["results"]["tts_bench_1.7b_http.json"]["levels"][1]["concurrency"] == 32
    assert "unreadable" in rows["asr"]["results"]["asr_bench_whisper_cuda.json"]


def test_the_table_prints_every_level_and_the_json_is_written(tmp_path):
    status, results = write_run(tmp_path)
    text = table(collect(status, results))
    assert "| asr | timeout | 124 | 100 | 100 |" in text
    assert "| 1 | 37.0 | - | - | 9.2 | - | - |" in text and "| 32 | 251.0 |" in text
    out = tmp_path / "suite.json"
    assert main([str(status), str(results), str(out), "--quiet"]) == 0
    assert [r["name"] for r in json.loads(out.read_text())["benchmarks"]] == ["tts", "asr", "video"]
