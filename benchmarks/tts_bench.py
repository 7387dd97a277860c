"""Streaming TTS on one GPU: TTFA, x real time and underruns at several concurrencies (PERFORMANCE.md).

Run on a CUDA machine, one model per process:
``python benchmarks/tts_bench.py --size 1.7b`` then ``--size 0.6b``, then ``--summarize`` (table + PNG).

Each run builds a real-size CustomVoice checkpoint with random bf16 weights (``load_format="dummy"``) from
``benchmarks/configs``, loads the engine (CUDA graphs captured at load, timed separately), and drives it
in process through ``engine.speech()``: ``--frames`` frames per request with EOS suppressed
(``ignore_eos``), at each concurrency. Per request: TTFA (call to first audio chunk in the consumer), x real
time (audio seconds / seconds from call to last chunk), underrun (``omni_stream.metrics.underrun_of``,
continuity OK = under 100 ms). Per level: aggregate x real time (all audio / wall from first call to last
chunk) and the worker's wall time per talker step and per codec window job (these include host work).
Writes ``tts_bench_<size>.json`` to ``$OUT`` (or ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from omni_stream.metrics import percentile, underrun_of

ROOT = Path(__file__).resolve().parent
CONFIGS = {
    "0.6b": ROOT / "configs" / "qwen3-tts-12hz-0.6b-customvoice",
    "1.7b": ROOT / "configs" / "qwen3-tts-12hz-1.7b-customvoice",
}
VOICES = ("vivian", "serena", "uncle_fu", "ryan", "aiden", "ono_anna", "sohee", "eric", "dylan")
TEXT = "The quick brown fox jumps over the lazy dog while the evening sun sets slowly behind the quiet hills."
FRAME_S = 0.08
CONTINUITY_S = 0.1


def git_commit() -> str:
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
        return head.stdout.strip() + ("+uncommitted" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def out_dir() -> Path:
    path = Path(os.environ.get("OUT") or ROOT / "results")
    path.mkdir(parents=True, exist_ok=True)
    return path


class StepTimer:
    """Wraps the runner's step and the codec window job to record worker wall time per call."""

    def __init__(self, family) -> None:
        from omni_stream.models.qwen3_tts import stages

        self.steps: list[tuple[int, float]] = []
        self.codec: list[tuple[int, int, float]] = []
        runner = family.runner
        step = runner.step

        def timed_step(batch):
            t0 = time.perf_counter()
            out = step(batch)
            self.steps.append((len(batch.prefill) + len(batch.decode), time.perf_counter() - t0))
            return out

        runner.step = timed_step
        decode = stages.decode_codec_windows

        def timed_decode(decoder, windows):
            t0 = time.perf_counter()
            out = decode(decoder, windows)
            self.codec.append((len(windows), int(windows[0].codes.shape[0]), time.perf_counter() - t0))
            return out

        stages.decode_codec_windows = timed_decode
        slot_decode = stages.decode_slot_windows

        def timed_slot_decode(pool, jobs):
            t0 = time.perf_counter()
            out = slot_decode(pool, jobs)
            self.codec.append((len(jobs), int(jobs[0].codes.shape[0]), time.perf_counter() - t0))
            return out

        stages.decode_slot_windows = timed_slot_decode

    def reset(self) -> None:
        self.steps.clear()
        self.codec.clear()


async def one_request(engine, i: int, frames: int) -> dict:
    t0 = time.perf_counter()
    arrivals, durations = [], []
    request = dict(voice=VOICES[i % len(VOICES)], language="English", max_new_tokens=frames, ignore_eos=True, seed=i)
    async with engine.speech(TEXT, **request) as stream:
        async for audio in stream:
            arrivals.append(time.perf_counter())
            durations.append(audio.samples.shape[0] / audio.sample_rate)
    audio_s = sum(durations)
    return {
        "start": t0,
        "ttfa": arrivals[0] - t0,
        "end": arrivals[-1],
        "audio_s": audio_s,
        "xrt": audio_s / (arrivals[-1] - t0),
        "underrun": underrun_of(arrivals, durations),
        "chunks": len(arrivals),
    }


def summarize_level(c: int, reqs: list[dict], timer: StepTimer, frames: int) -> dict:
    ttfa = [r["ttfa"] for r in reqs]
    und = [r["underrun"] for r in reqs]
    wall = max(r["end"] for r in reqs) - min(r["start"] for r in reqs)
    audio = sum(r["audio_s"] for r in reqs)
    steps = [s for _, s in timer.steps]
    full = [s for n, s in timer.steps if n == c]
    codec = [s for *_, s in timer.codec]
    return {
        "concurrency": c,
        "frames_per_request": frames,
        "audio_s_per_request": statistics.median(r["audio_s"] for r in reqs),
        "ttfa_p50_ms": 1000 * percentile(ttfa, 50),
        "ttfa_p95_ms": 1000 * percentile(ttfa, 95),
        "ttfa_max_ms": 1000 * max(ttfa),
        "xrt_per_stream_p50": percentile([r["xrt"] for r in reqs], 50),
        "xrt_per_stream_min": min(r["xrt"] for r in reqs),
        "aggregate_xrt": audio / wall,
        "wall_s": wall,
        "underrun_p50_ms": 1000 * percentile(und, 50),
        "underrun_p99_ms": 1000 * percentile(und, 99),
        "continuity_ok_rate": sum(u < CONTINUITY_S for u in und) / len(und),
        "talker_steps": len(steps),
        "step_wall_ms_p50": 1000 * percentile(steps, 50) if steps else None,
        "step_wall_ms_full_batch_p50": 1000 * percentile(full, 50) if full else None,
        "codec_jobs": len(codec),
        "codec_job_wall_ms_p50": 1000 * percentile(codec, 50) if codec else None,
        "codec_wall_s_total": sum(codec),
        "talker_wall_s_total": sum(steps),
        "codec_windows_per_job_mean": statistics.fmean(n for n, *_ in timer.codec) if codec else None,
    }


async def run_size(size: str, levels: list[int], frames: int, max_batch: int) -> dict:
    from omni_stream.engine import AsyncEngine
    from omni_stream.models.qwen3_tts.checkpoint import write_dummy_checkpoint

    result: dict = {
        "size": size,
        "model": CONFIGS[size].name,
        "transport": "in-process engine.speech() (no HTTP: the server has no dummy-weight load or ignore_eos option)",
        "git_commit": git_commit(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "dtype": "bfloat16",
        "sampling": "checkpoint defaults (talker top-k 50 T 0.9 rep 1.05; code predictor top-k 50 T 0.9)",
        "levels": [],
    }
    try:
        import transformers

        result["transformers"] = transformers.__version__
    except ImportError:
        result["transformers"] = None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_dummy_checkpoint(CONFIGS[size], tmp, dtype=torch.bfloat16, weights=False)
        t0 = time.perf_counter()
        engine = await AsyncEngine.from_pretrained(
            ckpt, device=device, dtype="bfloat16", load_format="dummy", max_batch_size=max_batch, progress=True
        )
        result["load_s"] = time.perf_counter() - t0
        family = engine.family
        result["graph_capture_s"] = getattr(family, "capture_seconds", 0.0)
        result["graphs"] = len(family.runner.graphs or ())
        print(f"[{size}] loaded in {result['load_s']:.1f} s (graph capture {result['graph_capture_s']:.1f} s, "
              f"{result['graphs']} graphs)", flush=True)  # fmt: skip
        timer = StepTimer(family)
        async with engine:
            # Warm-up: one short request alone, then a small concurrent burst (not measured).
            await one_request(engine, 0, 12)
            await asyncio.gather(*(one_request(engine, i, 12) for i in range(4)))
            for c in levels:
                timer.reset()
                reqs = await asyncio.gather(*(one_request(engine, i, frames) for i in range(c)))
                level = summarize_level(c, reqs, timer, frames)
                level["graph_steps"] = family.runner.graph_steps
                level["eager_steps"] = family.runner.eager_steps
                cw = getattr(family, "codec_windows", None)
                level["codec_graph_jobs"] = cw.graph_jobs if cw is not None else 0
                level["codec_eager_jobs"] = cw.eager_jobs if cw is not None else None
                result["levels"].append(level)
                print(
                    f"[{size}] c={c:4d} TTFA p50 {level['ttfa_p50_ms']:8.1f} p95 {level['ttfa_p95_ms']:8.1f} ms | "
                    f"xRT/stream {level['xrt_per_stream_p50']:6.2f} agg {level['aggregate_xrt']:7.1f} | "
                    f"underrun p50 {level['underrun_p50_ms']:7.1f} p99 {level['underrun_p99_ms']:7.1f} ms "
                    f"ok {level['continuity_ok_rate']:.2f} | step {level['step_wall_ms_p50']:.2f} ms "
                    f"codec job {level['codec_job_wall_ms_p50']:.2f} ms",
                    flush=True,
                )
                (out_dir() / f"tts_bench_{size}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def summarize(sizes: list[str]) -> int:
    results = {}
    for size in sizes:
        path = out_dir() / f"tts_bench_{size}.json"
        if path.exists():
            results[size] = json.loads(path.read_text())
    if not results:
        print("no results")
        return 1
    print("size  c     TTFA p50  TTFA p95  xRT/stream  agg xRT  underrun p50/p99 ms  cont. OK  step ms  codec job ms")
    for size, res in results.items():
        for lv in res["levels"]:
            print(
                f"{size:5s} {lv['concurrency']:4d} {lv['ttfa_p50_ms']:9.1f} {lv['ttfa_p95_ms']:9.1f}"
                f" {lv['xrt_per_stream_p50']:11.2f} {lv['aggregate_xrt']:8.1f}"
                f" {lv['underrun_p50_ms']:9.1f}/{lv['underrun_p99_ms']:<9.1f} {lv['continuity_ok_rate']:9.2f}"
                f" {lv['step_wall_ms_p50']:8.2f} {lv['codec_job_wall_ms_p50'] or 0:12.2f}"
            )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return 0
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for size, res in results.items():
        cs = [lv["concurrency"] for lv in res["levels"]]
        axes[0].plot(cs, [lv["ttfa_p50_ms"] for lv in res["levels"]], "o-", label=f"{size} p50")
        axes[0].plot(cs, [lv["ttfa_p95_ms"] for lv in res["levels"]], "x--", label=f"{size} p95")
        axes[1].plot(cs, [lv["aggregate_xrt"] for lv in res["levels"]], "o-", label=f"{size} aggregate")
        axes[1].plot(cs, [lv["xrt_per_stream_p50"] for lv in res["levels"]], "x--", label=f"{size} per stream")
        axes[2].plot(cs, [lv["underrun_p99_ms"] for lv in res["levels"]], "o-", label=f"{size} p99")
    titles = ("TTFA (ms)", "x real time", "underrun p99 (ms)")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streams")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    first = next(iter(results.values()))
    fig.suptitle(f"Qwen3-TTS CustomVoice, random bf16 weights, {first['gpu']}, commit {first['git_commit'][:12]}")
    fig.tight_layout()
    fig.savefig(out_dir() / "tts_bench.png", dpi=110)
    print(f"wrote {out_dir() / 'tts_bench.png'}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(CONFIGS), default="1.7b")
    ap.add_argument("--concurrency", default="1,4,16,32,64,128")
    ap.add_argument("--frames", type=int, default=150, help="frames per request (150 = 12 s of audio)")
    ap.add_argument("--max-batch", type=int, default=128)
    ap.add_argument("--summarize", action="store_true", help="print the table of saved results and plot them")
    args = ap.parse_args()
    if args.summarize:
        return summarize(["1.7b", "0.6b"])
    levels = [int(x) for x in args.concurrency.split(",")]
    asyncio.run(run_size(args.size, levels, args.frames, args.max_batch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
