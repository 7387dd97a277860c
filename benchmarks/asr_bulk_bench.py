"""Conversation turns beside uploaded recordings on one Whisper: what a file transcription costs a voice agent.

A server that runs a voice agent and ``POST /v1/audio/transcriptions`` on the same model shares its batch slots
between a conversation's turns (a few seconds of speech someone waits on) and recordings (window after window of
30 s). Three arms, one engine:

- ``alone``: ``--turns`` clients, each transcribing ``--rounds`` short utterances one after another (a closed
  loop), nothing else running;
- ``files_bulk``: the same turns while ``--files`` recordings of ``--file-seconds`` are transcribed window by window
  (:func:`~omni_stream.transcription.long_form.transcribe_long`, 4 windows at a time each) as the route sends them:
  bulk work, behind the turns in the queue and within half the batch slots;
- ``files_plain``: the same, the recordings sent as ordinary requests (``bulk=False``), competing for every slot.

Per arm: the turns' latency (call -> final text) p50/p95/max and the recordings' audio seconds transcribed per
second of wall time (the windows read to their end while the turns ran; each recording restarts until the turns
are done). Random weights rarely stop early, so every
transcript runs to its token bound (``--turn-tokens``, ``--file-tokens`` a window).

- CPU (tiny random checkpoint, built here): ``python benchmarks/asr_bulk_bench.py``.
- GPU (random weights at a real config's sizes): ``python benchmarks/asr_bulk_bench.py --from-config
  benchmarks/configs/whisper-large-v3-turbo --device cuda``.
- Smoke run (tests/test_asr_bulk_bench_cpu.py): ``--smoke``.

Writes ``asr_bulk_bench_<model>_<device|smoke>.json`` to ``$OUT`` or ``benchmarks/results``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from asr_bench import checkpoint, out_dir, utterance
from provenance import run_record

from omni_stream.metrics import percentile

ARMS = ("alone", "files_bulk", "files_plain")


async def turn(engine, seed: int, args: argparse.Namespace) -> float:
    """One turn's latency in ms: its whole utterance in, its final text out."""
    from omni_stream.transcription.spec import TranscriptionRequest

    request = TranscriptionRequest(utterance(args.turn_seconds, seed), language="en", max_tokens=args.turn_tokens)
    t0 = time.perf_counter()
    async with engine.generate(request) as stream:
        async for _ in stream:
            pass
    return 1000 * (time.perf_counter() - t0)


async def files_until(engine, stop: asyncio.Event, bulk: bool, args: argparse.Namespace, done: list[float]) -> None:
    """Transcribe one recording after another until ``stop``; the seconds of each window read to its end go to
    ``done`` (a window's text is read once the windows before it are)."""
    from omni_stream.transcription.long_form import transcribe_long
    from omni_stream.transcription.spec import TranscriptionRequest

    seed = 0
    while not stop.is_set():
        seed += 1
        audio = utterance(args.file_seconds, 10_000 + seed)
        request = TranscriptionRequest(audio, language="en", max_tokens=args.file_tokens, bulk=bulk)
        async with transcribe_long(engine, request) as transcript:
            counted = 0
            async for _ in transcript:
                for start, end in transcript.windows[counted : transcript.reading]:
                    done.append((end - start) / 16000)
                counted = max(counted, transcript.reading)
                if stop.is_set():
                    return  # the turns are done: the window being read does not count
            done.extend((end - start) / 16000 for start, end in transcript.windows[counted:])


async def arm(engine, name: str, args: argparse.Namespace) -> dict:
    stop = asyncio.Event()
    files_done: list[float] = []
    background = []
    if name != "alone":
        bulk = name == "files_bulk"
        background = [asyncio.create_task(files_until(engine, stop, bulk, args, files_done)) for _ in range(args.files)]
        await asyncio.sleep(args.head_start)  # the recordings hold their slots before the first turn comes

    async def client(k: int) -> list[float]:
        return [await turn(engine, 100 * k + r, args) for r in range(args.rounds)]

    t0 = time.perf_counter()
    latencies = [ms for run in await asyncio.gather(*(client(k) for k in range(args.turns))) for ms in run]
    wall = time.perf_counter() - t0 + (args.head_start if background else 0.0)
    stop.set()
    await asyncio.gather(*background)
    return {
        "arm": name,
        "turns": len(latencies),
        "turn_latency_p50_ms": round(percentile(latencies, 50), 1),
        "turn_latency_p95_ms": round(percentile(latencies, 95), 1),
        "turn_latency_max_ms": round(max(latencies), 1),
        "file_windows_finished": len(files_done),
        "file_audio_s_per_s": round(sum(files_done) / wall, 2) if background else None,
        "wall_s": round(wall, 2),
    }


async def run(args: argparse.Namespace) -> dict:
    from omni_stream.engine import AsyncEngine
    from omni_stream.family import ModelKind
    from omni_stream.models.whisper.family import bulk_slots

    with tempfile.TemporaryDirectory() as tmp:
        ckpt, name = checkpoint(args, Path(tmp))
        load_format = "dummy" if args.from_config is not None else "auto"
        async with await AsyncEngine.from_pretrained(
            ckpt, device=args.device, dtype=args.dtype, load_format=load_format, max_batch_size=args.max_batch,
            progress=False, max_buffered_frames=max(32, args.file_tokens),
        ) as engine:  # fmt: skip
            family = engine.models.get(ModelKind.TRANSCRIPTION)
            await turn(engine, 0, args)  # warm-up
            result = {
                "benchmark": "asr_bulk_bench",
                "model": name,
                "load_format": load_format,
                **run_record(args.device),
                "dtype": str(family.runner.dtype).removeprefix("torch."),
                "max_batch": args.max_batch,
                "bulk_slots": bulk_slots(args.max_batch),
                "turns": args.turns,
                "rounds": args.rounds,
                "turn_seconds": args.turn_seconds,
                "turn_tokens": args.turn_tokens,
                "files": args.files,
                "file_seconds": args.file_seconds,
                "file_tokens": args.file_tokens,
                "head_start_s": args.head_start,
                "arms": [],
            }
            for name_ in ARMS:
                a = await arm(engine, name_, args)
                result["arms"].append(a)
                files = (
                    f"  recordings {a['file_audio_s_per_s']} audio-s/s" if a["file_audio_s_per_s"] is not None else ""
                )
                print(
                    f"{name_:<12} turn latency p50 {a['turn_latency_p50_ms']:8.1f} ms  "
                    f"p95 {a['turn_latency_p95_ms']:8.1f} ms  max {a['turn_latency_max_ms']:8.1f} ms{files}",
                    flush=True,
                )
            for _ in range(2):  # releases are applied between the worker's steps: two rounds see them through
                await engine.worker.submit(lambda: None)
            result["state_after"] = family.scheduler.live()  # all zero: every turn and window released
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-config", type=Path, default=None, help="real config dir (default: the tiny model)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on GPU")
    ap.add_argument("--max-batch", type=int, default=8, help="the engine's batch slots (default %(default)s)")
    ap.add_argument("--turns", type=int, default=2, help="turn clients (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=12, help="turns per client (default %(default)s)")
    ap.add_argument("--turn-seconds", type=float, default=3.0)
    ap.add_argument("--turn-tokens", type=int, default=24, help="tokens a turn's transcript runs to")
    ap.add_argument("--files", type=int, default=2, help="recordings transcribed at once (default %(default)s)")
    ap.add_argument("--file-seconds", type=float, default=100.0, help="each recording's length (4 windows)")
    ap.add_argument("--file-tokens", type=int, default=200, help="tokens each window's transcript runs to")
    ap.add_argument("--head-start", type=float, default=0.5, help="seconds the recordings run before the turns")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--smoke", action="store_true", help="a tiny run for tests")
    args = ap.parse_args(argv)
    if args.smoke:
        args.turns, args.rounds, args.turn_tokens, args.turn_seconds = 1, 2, 4, 1.0
        args.files, args.file_seconds, args.file_tokens, args.head_start = 1, 40.0, 8, 0.2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = asyncio.run(run(args))
    tag = "smoke" if args.smoke else args.device.split(":")[0]
    path = out_dir() / f"asr_bulk_bench_{result['model']}_{tag}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
