"""benchmarks/gpu_suite.sh's report: one JSON of every benchmark's status and results, and a short table of figures.

``python gpu_suite_report.py STATUS.tsv RESULTS_DIR OUT.json [--quiet]``: STATUS.tsv holds one line per benchmark
(name, ok|failed|timeout|skipped, exit status, wall s, limit s); RESULTS_DIR the JSON files the benchmarks wrote.
OUT.json gets ``{"git_commit", "benchmarks": [{name, status, rc, wall_s, limit_s, results: {file: json}}]}``;
without ``--quiet`` the headline figures of each level are printed (a subset of each file; the JSON has them all).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

# Result files by benchmark (the prefix each script writes) and the figures printed per level: (label, key path).
PREFIX = {"tts": "tts_bench", "text": "text_bench", "grammar": "constrained_bench", "asr": "asr_bench",
          "chat": "chat_bench",
          "voice": "voice_bench", "image": "image_bench", "video": "video_bench", "peers": "peers"}  # fmt: skip
# tts_load.py's runs (their bursts write tts_bench_*.json beside them: in suite.tgz)
PREFIX |= {name: "tts_load" for name in ("load_cv", "load_fixed", "load_base_ws", "load_base_http", "levers_base",
                                         "levers_cv", "load_http")}  # fmt: skip
FIGURES: dict[str, list[tuple[str, str]]] = {
    "tts": [("c", "concurrency"), ("TTFA p50 ms", "ttfa_p50_ms"), ("TTFA p95 ms", "ttfa_p95_ms"),
            ("xRT/stream", "xrt_per_stream_p50"), ("agg xRT", "aggregate_xrt"), ("underrun p99 ms", "underrun_p99_ms"),
            ("step ms", "server_step_ms_mean")],
    "text": [("c", "concurrency"), ("TTFT p50 ms", "ttft_p50_ms"), ("TPOT p50 ms", "tpot_p50_ms"),
             ("tok/s/stream", "tok_s_per_stream_p50"), ("agg tok/s", "aggregate_tok_s"),
             ("step ms", "step_wall_ms_full_batch_p50")],
    "grammar": [("batch", "batch"), ("constrained", "constrained_rows"), ("step p50 ms", "step_ms_p50"),
                ("mask wait ms", "mask_wait_ms"), ("mask job ms", "mask_job_ms")],
    "asr": [("c", "concurrency"), ("latency p50 ms", "latency_p50_ms"), ("p95 ms", "latency_p95_ms"),
            ("first text ms", "first_text_p50_ms"), ("utt/s", "utterances_per_s"), ("ms/step", "model_ms_per_step")],
    "chat": [("c", "concurrency"), ("TTFT p50 ms", "ttft_p50_ms"), ("first audio p50 ms", "first_audio_p50_ms"),
             ("first audio p95 ms", "first_audio_p95_ms"), ("agg xRT", "aggregate_x_realtime")],
    "voice": [("n", "concurrency"), ("answered", "answered"), ("v2v p50 ms", "voice_to_voice_ms.p50"),
              ("v2v p95 ms", "voice_to_voice_ms.p95"), ("server v2v p50 ms", "server_voice_to_voice_ms.p50"),
              ("barge-in p50 ms", "barge_in_ms.p50"), ("failures", "failures")],
    "image": [("c", "concurrency"), ("first AR delta ms", "first_ar_delta.p50_ms"),
              ("first preview ms", "first_preview.p50_ms"), ("final ms", "final_image.p50_ms"),
              ("img/s", "images_per_s")],
    "video": [("c", "concurrency"), ("TTFC p50 s", "ttfc_p50_s"), ("gap p50 s", "gap_p50_s"),
              ("chunk s", "chunk_playback_s"), ("xRT p50", "xrt_p50"), ("underrun max s", "underrun_max_s"),
              ("frames/s", "frames_per_s")],
}  # fmt: skip


def lookup(level: dict[str, Any], path: str) -> Any:
    value: Any = level
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    if isinstance(value, list):
        return str(len(value))
    return str(value)


def read_status(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text().splitlines():
        name, status, rc, wall, limit = line.split("\t")
        rows.append({"name": name, "status": status, "rc": None if rc == "-" else int(rc), "wall_s": int(wall),
                     "limit_s": int(limit)})  # fmt: skip
    return rows


def collect(status: Path, results: Path) -> dict[str, Any]:
    rows = read_status(status)
    for row in rows:
        files = sorted(results.glob(f"{PREFIX.get(row['name'], row['name'])}_*.json"))
        row["results"] = {}
        for f in files:
            try:
                row["results"][f.name] = json.loads(f.read_text())
            except json.JSONDecodeError as exc:  # a file cut off mid-write by the time cap
                row["results"][f.name] = {"unreadable": str(exc)}
    return {"git_commit": os.environ.get("GIT_COMMIT", "unknown"), "benchmarks": rows}


def table(report: dict[str, Any]) -> str:
    lines = [f"commit {report['git_commit']}", "", "| benchmark | status | rc | wall s | limit s |", "|---" * 5 + "|"]
    for row in report["benchmarks"]:
        lines.append(f"| {row['name']} | {row['status']} | {cell(row['rc'])} | {row['wall_s']} | {row['limit_s']} |")
    for row in report["benchmarks"]:
        figures = FIGURES.get(row["name"])
        for fname, data in row["results"].items():
            levels = data.get("levels") if isinstance(data, dict) else None
            if not figures or not levels:
                continue
            lines += ["", f"{row['name']}: {fname}", "| " + " | ".join(label for label, _ in figures) + " |",
                      "|" + "---|" * len(figures)]  # fmt: skip
            for level in levels:
                lines.append("| " + " | ".join(cell(lookup(level, key)) for _, key in figures) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    quiet = "--quiet" in argv
    status, results, out = (Path(a) for a in argv if a != "--quiet")
    report = collect(status, results)
    out.write_text(json.dumps(report, indent=1) + "\n")
    if not quiet:
        print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
