"""Transcription latency: end of utterance -> final text, at several concurrencies, in process.

Each level runs ``c`` clients at once; each client transcribes ``--rounds`` utterances one after another (a
closed loop, so newcomers keep joining a batch that is already decoding). An utterance is ``--seconds`` of
audio handed over whole (what a voice agent has when VAD ends the turn); its latency runs from the
``engine.generate(TranscriptionRequest(...))`` call to the final text delta, so it holds the resampling and
log-mel features (in a thread), the wait for a slot, the encoder pass and every decode step. Random weights
rarely stop early, so nearly every transcript runs to ``--tokens`` tokens (``at_max_tokens_rate`` says how many
did). Per level: latency p50/p95/max, time to the first text delta, utterances/s and tokens/s, and the
scheduler's own figures (steps, mean batch, model time per step). Also, alone: the feature extraction of one
utterance and one encoder pass at batch 1 and at the largest level (the encoder reads Whisper's 30 s window,
so on CPU it dominates the step that admits newcomers), each batch bucket's pass as the engine runs it (on CUDA the
captured graph: ``encoder_pass_ms_by_bucket``), and the machine's load average. ``--window-ms`` sets shorter
encoder windows (``transcription_window_ms``): the utterances are then encoded in theirs, and each shorter window's
passes are timed too (``encoder_pass_ms_by_window``).

- CPU (tiny random checkpoint, built here): ``python benchmarks/asr_bench.py`` (levels 1, 4, 16, 32).
- GPU (random weights at the sizes of a real config, ``load_format="dummy"``, bf16):
  ``python benchmarks/asr_bench.py --from-config benchmarks/configs/whisper-large-v3-turbo --device cuda``.
- Smoke run (tests/test_asr_bench_cpu.py): ``python benchmarks/asr_bench.py --smoke``.

Writes ``asr_bench_<model>_<device>[_window<ms>].json`` to ``$OUT`` or ``benchmarks/results``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from provenance import run_record

from omni_stream.metrics import percentile

ROOT = Path(__file__).resolve().parent


def out_dir() -> Path:
    path = Path(os.environ.get("OUT") or ROOT / "results")
    path.mkdir(parents=True, exist_ok=True)
    return path


def utterance(seconds: float, seed: int) -> np.ndarray:
    """Speech-level noise: the cost of a Whisper request does not depend on what is said (30 s window)."""
    return (np.random.default_rng(seed).standard_normal(int(seconds * 16000)) * 0.05).astype(np.float32)


async def one(engine, audio: np.ndarray, tokens: int) -> dict:
    from omni_stream.transcription.spec import TranscriptionRequest

    t0 = time.perf_counter()
    first, n, reason = None, 0, None
    async with engine.generate(TranscriptionRequest(audio, language="en", max_tokens=tokens)) as stream:
        async for out in stream:
            first = first or time.perf_counter()
            if out.chunk.final:
                reason = out.chunk.finish_reason
        n = stream.usage["transcription"].output_tokens
    done = time.perf_counter()
    return {"latency": done - t0, "first": (first or done) - t0, "tokens": n, "reason": reason}


async def level(engine, family, c: int, args: argparse.Namespace) -> dict:
    stats = family.scheduler.stats
    await engine.worker.submit(lambda: None)  # the step that delivered the last text has been counted
    before = (stats.steps, stats.items, stats.model_seconds, stats.max_batch)
    stats.max_batch = 0

    async def client(k: int) -> list[dict]:
        return [await one(engine, utterance(args.seconds, 1000 * k + r), args.tokens) for r in range(args.rounds)]

    t0 = time.perf_counter()
    runs = [r for rs in await asyncio.gather(*(client(k) for k in range(c))) for r in rs]
    wall = time.perf_counter() - t0
    await engine.worker.submit(lambda: None)
    steps, items = stats.steps - before[0], stats.items - before[1]
    lat = [r["latency"] * 1000 for r in runs]
    first = [r["first"] * 1000 for r in runs]
    return {
        "concurrency": c,
        "utterances": len(runs),
        "latency_p50_ms": round(percentile(lat, 50), 1),
        "latency_p95_ms": round(percentile(lat, 95), 1),
        "latency_max_ms": round(max(lat), 1),
        "first_text_p50_ms": round(percentile(first, 50), 1),
        "tokens_per_utterance": round(statistics.mean(r["tokens"] for r in runs), 2),
        "at_max_tokens_rate": round(sum(r["reason"] == "length" for r in runs) / len(runs), 3),
        "utterances_per_s": round(len(runs) / wall, 2),
        "tokens_per_s": round(sum(r["tokens"] for r in runs) / wall, 1),
        "wall_s": round(wall, 3),
        "steps": steps,
        "mean_batch": round(items / steps, 2) if steps else None,
        "max_batch": stats.max_batch,
        "model_ms_per_step": round((stats.model_seconds - before[2]) * 1000 / steps, 2) if steps else None,
    }


@torch.inference_mode()
def encoder_ms(family, batch: int, n: int = 3) -> float:
    """Wall time of one encoder pass over ``batch`` utterances (the 30 s window each), synchronized; run while
    the engine is idle."""
    runner = family.runner
    clips = [utterance(1.0, i) for i in range(batch)]
    features = family.features(clips, sampling_rate=16000, return_tensors="pt").input_features
    features = features.to(runner.device, runner.dtype)
    cuda = runner.device.type == "cuda"
    times = []
    for _ in range(n):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        runner.encoder(features)
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 2)


@torch.inference_mode()
def encoder_pass_ms(family, window: int | None = None, n: int = 5) -> dict[str, float]:
    """Each batch bucket's encoder pass as the engine runs it (on CUDA its captured graph's replay, else the same
    static-buffer function eagerly) at ``window`` frames (default: the whole window), median wall time of ``n``,
    synchronized; run while the engine is idle (every row writes the spare slot, as at capture). The cost curve a
    policy that gathers pauses into one pass weighs."""
    runner = family.runner
    cuda = runner.device.type == "cuda"
    window = runner.windows[-1] if window is None else window
    runner._enc_slots.fill_(runner.spare)
    out = {}
    for b in runner.encode_buckets:
        times = []
        for _ in range(n):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            if not (runner.encode_graphs is not None and runner.encode_graphs.replay((b, window))):
                runner._encode(b, window)
            if cuda:
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1000)
        out[str(b)] = round(statistics.median(times), 2)
    return out


def probe_request(family) -> tuple:
    """``_prepare``'s arguments past the audio, for an English request."""
    from omni_stream.transcription.spec import TranscriptionRequest

    return TranscriptionRequest(utterance(1.0, 0), language="en"), family.tokens.language_id("en")


def feature_ms(family, seconds: float, n: int = 5) -> float:
    from omni_stream.transcription.spec import TranscriptionRequest

    audio = utterance(seconds, 7)
    request = TranscriptionRequest(audio, language="en")
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        family._prepare(audio, request, family.tokens.language_id("en"))
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 2)


def checkpoint(args: argparse.Namespace, tmp: Path) -> tuple[Path, str]:
    if args.from_config is not None:
        from omni_stream.models.whisper.checkpoint import write_dummy_checkpoint

        return write_dummy_checkpoint(
            args.from_config, tmp / args.from_config.name, weights=False
        ), args.from_config.name
    from omni_stream.models.whisper.checkpoint import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp / "whisper-tiny-random"), "whisper-tiny-random"


async def run(args: argparse.Namespace) -> dict:
    from omni_stream.engine import AsyncEngine
    from omni_stream.family import ModelKind
    from omni_stream.runtime.settings import Tuning

    tuning = Tuning.from_env(transcription_window_ms=args.window_ms)  # the flag, else the environment's switch
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, name = checkpoint(args, Path(tmp))
        load_format = "dummy" if args.from_config is not None else "auto"
        async with await AsyncEngine.from_pretrained(
            ckpt, device=args.device, dtype=args.dtype, load_format=load_format, max_batch_size=max(args.levels),
            progress=False, max_buffered_frames=max(32, args.tokens),
            tuning=tuning,
        ) as engine:  # fmt: skip
            family = engine.models.get(ModelKind.TRANSCRIPTION)
            params = sum(p.numel() for p in family.runner.encoder.parameters()) + sum(
                p.numel() for p in family.runner.decoder.parameters()
            )
            await one(engine, utterance(args.seconds, 0), args.tokens)  # warm-up
            result = {
                "benchmark": "asr_bench",
                "model": name,
                "load_format": load_format,
                "parameters": params,
                **run_record(args.device),
                "dtype": str(family.runner.dtype).removeprefix("torch."),
                "utterance_s": args.seconds,
                "max_tokens": args.tokens,
                "transcription_window_ms": tuning.transcription_window_ms,
                "rounds_per_client": args.rounds,
                "feature_extraction_ms": feature_ms(family, args.seconds),
                "encoder_ms_batch_1": encoder_ms(family, 1),
                f"encoder_ms_batch_{max(args.levels)}": encoder_ms(family, max(args.levels)),
                "encoder_pass_ms_by_bucket": encoder_pass_ms(family),
                # transcription_window_ms: the windows (frames), each one's passes, the utterances' own window
                "encoder_windows": list(family.runner.windows),
                "utterance_window": family._prepare(utterance(args.seconds, 0), *probe_request(family)).window,
                "encoder_pass_ms_by_window": {str(w): encoder_pass_ms(family, w) for w in family.runner.windows[:-1]},
                "load_average_1m_before": round(os.getloadavg()[0], 2),
                "levels": [],
            }
            passes = result["encoder_pass_ms_by_bucket"]
            print("encoder pass by batch bucket (ms): " + ", ".join(f"{b}: {ms}" for b, ms in passes.items()))
            for w, by_bucket in result["encoder_pass_ms_by_window"].items():
                print(f"  at a window of {w} frames: " + ", ".join(f"{b}: {ms}" for b, ms in by_bucket.items()))
            print(f"encoder windows {result['encoder_windows']}: a {args.seconds} s utterance is encoded in "
                  f"{result['utterance_window']} frames")  # fmt: skip
            for c in args.levels:
                lv = await level(engine, family, c, args)
                result["levels"].append(lv)
                print(
                    f"c={c:<3} latency p50 {lv['latency_p50_ms']:8.1f} ms  p95 {lv['latency_p95_ms']:8.1f} ms  "
                    f"first text {lv['first_text_p50_ms']:7.1f} ms  {lv['utterances_per_s']:6.2f} utt/s  "
                    f"batch {lv['mean_batch']} (max {lv['max_batch']})  {lv['model_ms_per_step']} ms/step",
                    flush=True,
                )
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-config", type=Path, default=None, help="real config dir (default: the tiny model)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on GPU")
    ap.add_argument("--levels", default="1,4,16,32", help="concurrencies (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=4, help="utterances per client per level (default %(default)s)")
    ap.add_argument("--seconds", type=float, default=3.0, help="utterance length in s (default %(default)s)")
    ap.add_argument("--tokens", type=int, default=24, help="max tokens per transcript (default %(default)s)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument(
        "--window-ms",
        type=float,
        default=None,
        help="the smallest encoder window (transcription_window_ms; default: the whole 30 s)",
    )
    ap.add_argument("--smoke", action="store_true", help="a tiny run for tests: levels 1,2, 1 round, 4 tokens")
    args = ap.parse_args(argv)
    if args.smoke:
        args.levels, args.rounds, args.tokens, args.seconds = "1,2", 1, 4, 1.0
    args.levels = [int(x) for x in str(args.levels).split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = asyncio.run(run(args))
    result["load_average_1m_after"] = round(os.getloadavg()[0], 2)  # other processes on the machine
    tag = ("smoke" if args.smoke else args.device.split(":")[0]) + (
        f"_window{args.window_ms:g}" if args.window_ms is not None else ""
    )
    path = out_dir() / f"asr_bench_{result['model']}_{tag}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
