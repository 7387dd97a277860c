"""Two-model pipeline overhead on CPU: synthetic LM -> synthetic TTS, 256 concurrent streams, zero-cost steps.

Run: ``OMP_NUM_THREADS=1 python benchmarks/pipeline_overhead.py`` (writes benchmarks/results/pipeline_overhead.json
and .md; also under ``$OUT`` when set). Every stream is a ``chat+speech`` request: the synthetic LM echoes a reply
of ``--sentences`` sentences (one word a step on its own scheduler), the reply is split into sentences and each is
synthesized by the synthetic TTS (its talker scheduler and codec stage) while the previous one streams. Both models
step on the one device worker at zero cost, so what is measured is the engine: two schedulers, five stages and
the per-sentence sub-requests. The same audio through the one-model ``speech`` pipeline (one request per stream,
the whole reply as its text) is the baseline: the ratio is what the LLM stage, the splitting and the per-sentence
requests cost. Absolute times depend on the machine (these runs share two cores); compare ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

import anyio
import torch
from provenance import git_commit

from omni_stream.chunks import Audio, TextDelta
from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.family import ModelKind
from omni_stream.metrics import percentile
from omni_stream.requests import ChatMessage, ChatRequest, Role, SpokenReply, TextRequest

# The synthetic families live with the tests (they are no part of the package): zero-cost steps show the engine's
# own overhead, which a real model's step would hide.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import synthetic
from synthetic import write_checkpoint
from synthetic.lm_family import write_lm_checkpoint

synthetic.register()

ROOT = Path(__file__).resolve().parent
SENTENCE = "We keep on talking here."  # 5 words, 24 characters: 12 frames of synthetic speech


def ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


async def run_streams(engine: AsyncEngine, streams: int, sentences: int, two_models: bool) -> dict:
    text = " ".join([SENTENCE] * sentences)
    first_audio: list[float] = []
    audio_seconds = 0.0
    chunks = 0
    words = 0

    async def one() -> None:
        nonlocal audio_seconds, chunks, words
        t0 = time.perf_counter()
        first = None
        if two_models:
            request = ChatRequest(
                TextRequest(messages=(ChatMessage(Role.USER, text),)), speech=SpokenReply(voice="alice")
            )
            source = engine.generate(request)
        else:
            source = engine.speech(text, voice="alice")
        async with source as stream:
            async for item in stream:
                chunk = getattr(item, "chunk", item)
                if isinstance(chunk, Audio):
                    first = first or time.perf_counter()
                    audio_seconds += chunk.duration
                    chunks += 1
                elif isinstance(chunk, TextDelta) and getattr(item, "stage", "") == "text":
                    words += 1
        first_audio.append((first or time.perf_counter()) - t0)

    t0 = time.perf_counter()
    cpu0 = time.process_time()
    async with anyio.create_task_group() as tg:
        for _ in range(streams):
            tg.start_soon(one)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    result = {
        "streams": streams,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "audio_chunks": chunks,
        "audio_chunks_per_cpu_s": round(chunks / cpu, 1),
        "aggregate_x_realtime": round(audio_seconds / wall, 1),
        "audio_seconds_per_cpu_s": round(audio_seconds / cpu, 1),
        "first_audio_p50_ms": ms(percentile(first_audio, 50)),
        "first_audio_p99_ms": ms(percentile(first_audio, 99)),
    }
    if two_models:
        result["text_tokens_per_s"] = round(words / wall, 1)
    return result


async def main(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tts = write_checkpoint(Path(tmp) / "tts")
        lm = write_lm_checkpoint(Path(tmp) / "lm", step_cost_ms=args.lm_step_ms)
        sources = {"tts": ModelSource(tts), "lm": ModelSource(lm, kind=ModelKind.TEXT)}
        async with await AsyncEngine.load(sources, progress=False, max_batch_size=args.streams) as engine:
            await run_streams(engine, 16, 2, True)  # warm up
            pipeline, baseline = [], []
            for _ in range(args.repeats):
                pipeline.append(await run_streams(engine, args.streams, args.sentences, True))
                baseline.append(await run_streams(engine, args.streams, args.sentences, False))
            key = "audio_seconds_per_cpu_s"
            pipeline.sort(key=lambda r: r[key])
            baseline.sort(key=lambda r: r[key])
            two, one = pipeline[len(pipeline) // 2], baseline[len(baseline) // 2]
            text_sched, speech_sched = engine.models.text().scheduler, engine.models.speech().scheduler
            return {
                "chat_speech": two,
                "speech_only": one,
                "cost_ratio_cpu": round(one[key] / two[key], 2),
                "lm_scheduler_overhead_per_step_us": round(
                    text_sched.stats.overhead_seconds / max(text_sched.stats.steps, 1) * 1e6, 1
                ),
                "tts_scheduler_overhead_per_step_us": round(
                    speech_sched.stats.overhead_seconds / max(speech_sched.stats.steps, 1) * 1e6, 1
                ),
                "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
            }


def table(report: dict) -> str:
    r = report["results"]
    two, one = r["chat_speech"], r["speech_only"]
    rows = [
        ("concurrent streams", two["streams"]),
        ("sentences per reply", report["args"]["sentences"]),
        ("emulated LM step (ms)", report["args"]["lm_step_ms"]),
        ("audio s per process CPU s: chat+speech / speech only", f"{two['audio_seconds_per_cpu_s']} / "
         f"{one['audio_seconds_per_cpu_s']}"),
        ("CPU cost of the two-model pipeline vs one model (x)", r["cost_ratio_cpu"]),
        ("aggregate x real time: chat+speech / speech only", f"{two['aggregate_x_realtime']} / "
         f"{one['aggregate_x_realtime']}"),
        ("text tokens/s (LM stage)", two["text_tokens_per_s"]),
        ("first audio p50 / p99 (ms): chat+speech", f"{two['first_audio_p50_ms']} / {two['first_audio_p99_ms']}"),
        ("first audio p50 / p99 (ms): speech only", f"{one['first_audio_p50_ms']} / {one['first_audio_p99_ms']}"),
        ("LM scheduler overhead per step (us)", r["lm_scheduler_overhead_per_step_us"]),
        ("TTS scheduler overhead per step (us)", r["tts_scheduler_overhead_per_step_us"]),
        ("peak RSS (MiB)", r["peak_rss_mib"]),
    ]  # fmt: skip
    return "\n".join(
        [
            "# Two-model pipeline overhead (CPU, synthetic LM -> synthetic TTS, zero-cost steps)",
            "",
            f"Commit `{report['commit']}`, {report['date']}, {report['machine']}.",
            f"Produced by `benchmarks/pipeline_overhead.py`; median of {report['args']['repeats']} runs each.",
            "",
            "| figure | value |",
            "|---|---:|",
            *(f"| {k} | {v} |" for k, v in rows),
            "",
        ]
    )


def cli() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--sentences", type=int, default=4, help="sentences per reply (12 frames each)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lm-step-ms", type=float, default=0.0, help="emulated LM step time (0: pure engine overhead)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = asyncio.run(main(args))
    report = {
        "benchmark": "pipeline_overhead",
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus (shared)",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "args": vars(args),
        "results": results,
    }
    text = table(report)
    print(json.dumps(results, indent=2))
    print(text)
    if not args.no_write:
        outs = [ROOT / "results"] + ([Path(os.environ["OUT"])] if os.environ.get("OUT") else [])
        for out in outs:
            out.mkdir(parents=True, exist_ok=True)
            stem = "pipeline_overhead" + (f"_lm{args.lm_step_ms:g}ms" if args.lm_step_ms else "")
            (out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
            (out / f"{stem}.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
