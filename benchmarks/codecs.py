"""Codec throughput on one core: x-real-time of every encoder, the resampler and decode_audio.

Run: ``OMP_NUM_THREADS=1 python benchmarks/codecs.py`` (writes benchmarks/results/codecs.json and codecs.md).
x-real-time is seconds of audio per second of CPU time of this process (pinned to one core), so a busy neighbour
on a shared machine slows the wall clock but not the figure. Per-chunk cost is wall time per ``encode`` call.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from omni_stream.codecs import Resampler, decode_audio, encode_whole, open_encoder, resample
from omni_stream.codecs.testsignal import speech_like

RATE = 24000
CHUNK_MS = 20  # streaming chunk: what a TTS engine hands the encoder per codec step or so
FORMATS = ["pcm", "wav", "flac", "mp3", "opus", "aac", "mulaw", "alaw"]
RESAMPLE_PAIRS = [(24000, 16000), (24000, 8000), (24000, 48000), (16000, 24000), (44100, 24000)]
UPLOADS = ["wav", "flac", "mp3", "opus", "aac"]
ROOT = Path(__file__).resolve().parent


def timed(fn, repeats: int) -> tuple[float, float]:
    """(best CPU seconds, best wall seconds) over ``repeats`` runs."""
    cpu, wall = [], []
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return min(cpu), min(wall)


def bench_encoder(fmt: str, x: np.ndarray, repeats: int) -> dict:
    chunk = RATE * CHUNK_MS // 1000
    per_call: list[float] = []

    def run() -> None:
        enc = open_encoder(fmt, RATE)
        for i in range(0, len(x), chunk):
            t0 = time.perf_counter()
            enc.encode(x[i : i + chunk])
            per_call.append(time.perf_counter() - t0)
        enc.flush()

    cpu, wall = timed(run, repeats)
    seconds = len(x) / RATE
    size = len(encode_whole(fmt, x, RATE))
    return {
        "what": f"encode {fmt}",
        "x_realtime": round(seconds / cpu, 1),
        "x_realtime_wall": round(seconds / wall, 1),
        "chunk_us_p50": round(statistics.median(per_call) * 1e6, 1),
        "chunk_us_p99": round(float(np.percentile(per_call, 99)) * 1e6, 1),
        "kbit_per_s": round(size * 8 / seconds / 1000, 1),
    }


def bench_resampler(src: int, dst: int, seconds: float, repeats: int) -> dict:
    x = speech_like(seconds, src, seed=1)
    chunk = src * CHUNK_MS // 1000
    per_call: list[float] = []

    def run() -> None:
        r = Resampler(src, dst)
        for i in range(0, len(x), chunk):
            t0 = time.perf_counter()
            r.process(x[i : i + chunk])
            per_call.append(time.perf_counter() - t0)
        r.flush()

    cpu, wall = timed(run, repeats)
    return {
        "what": f"resample {src}->{dst}",
        "x_realtime": round(seconds / cpu, 1),
        "x_realtime_wall": round(seconds / wall, 1),
        "chunk_us_p50": round(statistics.median(per_call) * 1e6, 1),
        "chunk_us_p99": round(float(np.percentile(per_call, 99)) * 1e6, 1),
    }


def bench_resample_whole(src: int, dst: int, seconds: float, repeats: int) -> dict:
    """One-shot resampling of a whole utterance (what a realtime session does to a turn's audio for the ASR)."""
    x = speech_like(seconds, src, seed=2)
    cpu, wall = timed(lambda: resample(x, src, dst), repeats)
    return {
        "what": f"resample {src}->{dst} {seconds:g} s",
        "x_realtime": round(seconds / cpu, 1),
        "x_realtime_wall": round(seconds / wall, 1),
        "call_ms": round(1000 * wall, 2),
    }


def bench_decode(fmt: str, x: np.ndarray, repeats: int) -> dict:
    data = encode_whole(fmt, x, RATE)
    seconds = len(x) / RATE
    cpu, wall = timed(lambda: decode_audio(data, 16000, max_seconds=60), repeats)
    return {
        "what": f"decode_audio {fmt} -> 16 kHz",
        "x_realtime": round(seconds / cpu, 1),
        "x_realtime_wall": round(seconds / wall, 1),
        "upload_bytes": len(data),
    }


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "codecs", "benchmarks/codecs.py"],
            cwd=ROOT.parent,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return out.stdout.strip() + ("+uncommitted" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="audio per run (default 10 s)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per case; the best is kept (default 3)")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "codecs.json")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})

    x = speech_like(args.seconds, RATE, seed=1)
    rows = [bench_encoder(fmt, x, args.repeats) for fmt in FORMATS]
    rows += [bench_resampler(s, d, args.seconds, args.repeats) for s, d in RESAMPLE_PAIRS]
    rows.append(bench_resample_whole(24000, 16000, 3.0, max(args.repeats, 5)))
    rows += [bench_decode(fmt, x, args.repeats) for fmt in UPLOADS]

    header = f"{'case':<28} {'xRT (cpu)':>10} {'xRT (wall)':>10} {'chunk p50 us':>13} {'chunk p99 us':>13}"
    print(header)
    print("-" * len(header))
    for r in rows:
        p50, p99 = r.get("chunk_us_p50", ""), r.get("chunk_us_p99", "")
        print(f"{r['what']:<28} {r['x_realtime']:>10} {r['x_realtime_wall']:>10} {p50!s:>13} {p99!s:>13}")

    result = {
        "benchmark": "codecs",
        "commit": git_commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "cpus_used": 1},
        "settings": {"sample_rate": RATE, "chunk_ms": CHUNK_MS, "seconds": args.seconds, "repeats": args.repeats},
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    md = [
        f"# Codec throughput (one core, {args.seconds:g} s of 24 kHz speech-like audio, {CHUNK_MS} ms chunks)",
        "",
        f"Commit `{result['commit']}`, {result['date']}. x-real-time = audio seconds per CPU second of one core;",
        "wall-clock figures and the p99 chunk cost include preemption by other processes on a shared machine.",
        "",
        "| case | xRT (cpu) | xRT (wall) | chunk p50 (us) | chunk p99 (us) |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        p50, p99 = r.get("chunk_us_p50", "-"), r.get("chunk_us_p99", "-")
        md.append(f"| {r['what']} | {r['x_realtime']} | {r['x_realtime_wall']} | {p50} | {p99} |")
    args.out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
