"""Qwen2.5-VL frame sessions: frames ingested per second (per session and in all) at several session counts, and
the time from a question to its first token with the session's frames held in the cache against the same question
with its whole prompt rebuilt (vLLM-Omni's way: every frame encoded and prefilled again), in one call.

Builds a Qwen2.5-VL-3B-Instruct-class checkpoint (the hub's config, ``load_format="dummy"``: random weights, bf16 on
CUDA, no weight file written) with a full-vocabulary tokenizer and loads it on the native family. Per level of
``n`` sessions: ``n`` frame sessions open (``max_frames`` = ``--frames``), each gets ``--frames`` frames of
``--size`` pixels (``n`` sessions feeding at once, each frame after the previous one's prefill); then each session
asks one question (``n`` at once, greedy, ``--tokens`` tokens): TTFT, prompt tokens prefilled; then the sessions
close and the same questions (the same frames) are asked again, so each prompt is rebuilt: TTFT, tokens
prefilled. Both answers should be the same tokens (``same_tokens``; ``same_sessions`` counts the sessions whose
answers agree: in fp32 all do, as the tests check; in bf16 the two prefills round differently and random weights
leave near-ties, so an answer can part). Prints a table and writes
``vl_session_bench_<name>.json`` to ``$OUT`` or ``benchmarks/results``.

GPU machine, in the repository root, one command (about 3 minutes on one H200)::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/omni_stream-*.whl && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 || exit; \
    python3 benchmarks/vl_session_bench.py

CPU smoke run (tests/test_vl_session_bench_cpu.py): ``python benchmarks/vl_session_bench.py --smoke``: the tiny
Qwen2.5-VL, levels 1 and 2, three 56 x 84 frames per session, 4 tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from provenance import git_commit

from omni_stream.metrics import percentile

ROOT = Path(__file__).resolve().parent
QUESTION = "What changed between the last frames?"


def out_dir() -> Path:
    path = Path(os.environ.get("OUT") or ROOT / "results")
    path.mkdir(parents=True, exist_ok=True)
    return path


def frames_of(session: int, count: int, size: tuple[int, int]) -> list[np.ndarray]:
    rng = np.random.default_rng(1000 + session)
    return [rng.integers(0, 256, (*size, 3), dtype=np.uint8) for _ in range(count)]


async def ask(engine, messages, tokens: int) -> dict:
    from omni_stream.requests import GREEDY, TextRequest

    request = TextRequest(messages=messages, max_tokens=tokens, sampling=GREEDY, ignore_eos=True)
    t0 = time.perf_counter()
    first = None
    text = []
    async with engine.chat(request) as stream:
        async for out in stream:
            if first is None:
                first = time.perf_counter() - t0
            text.append(out.chunk.text)
    assert first is not None
    return {"ttft": first, "text": "".join(text), "input_tokens": stream.usage["text"].input_tokens}


async def level(engine, n: int, args: argparse.Namespace) -> dict:
    from omni_stream.requests import ChatMessage, Role

    family = engine.models.text()
    runner = family.runner
    frames = [frames_of(i, args.frames, args.size) for i in range(n)]
    async with contextlib.AsyncExitStack() as stack:  # every session opened is closed, however this ends
        sessions = [await stack.enter_async_context(family.frame_session(max_frames=args.frames)) for _ in range(n)]
        per_session: list[float] = []

        async def feed(s, mine: list[np.ndarray]) -> None:
            t0 = time.perf_counter()
            for image in mine:
                await s.add_frame(image)
            per_session.append(len(mine) / (time.perf_counter() - t0))

        encoded0, prefilled0 = runner.images_encoded, runner.tokens_prefilled
        t0 = time.perf_counter()
        await asyncio.gather(*(feed(s, mine) for s, mine in zip(sessions, frames, strict=True)))
        ingest_s = time.perf_counter() - t0
        frame_tokens = (runner.tokens_prefilled - prefilled0) / (n * args.frames)
        prefilled0 = runner.tokens_prefilled
        held_rows = sum(v.length for v in runner.views.values()) / n
        held = await asyncio.gather(*(ask(engine, s.messages(QUESTION), args.tokens) for s in sessions))
        held_prefilled = (runner.tokens_prefilled - prefilled0) / n
    prefilled0 = runner.tokens_prefilled
    whole = [(ChatMessage(Role.USER, QUESTION, images=tuple(mine)),) for mine in frames]
    rebuilt = await asyncio.gather(*(ask(engine, m, args.tokens) for m in whole))
    rebuilt_prefilled = (runner.tokens_prefilled - prefilled0) / n
    held_ttft, rebuilt_ttft = [r["ttft"] for r in held], [r["ttft"] for r in rebuilt]
    return {
        "sessions": n,
        "frames_per_session": args.frames,
        "frame_tokens": frame_tokens,
        "frames_per_s_total": n * args.frames / ingest_s,
        "frames_per_s_per_session_p50": percentile(per_session, 50),
        "frames_per_s_per_session_min": min(per_session),
        "prompt_tokens": held[0]["input_tokens"],
        "held_rows": held_rows,
        "held_prefilled_tokens": held_prefilled,
        "held_ttft_p50_ms": 1000 * percentile(held_ttft, 50),
        "held_ttft_max_ms": 1000 * max(held_ttft),
        "rebuilt_prefilled_tokens": rebuilt_prefilled,
        "rebuilt_ttft_p50_ms": 1000 * percentile(rebuilt_ttft, 50),
        "rebuilt_ttft_max_ms": 1000 * max(rebuilt_ttft),
        "images_encoded": runner.images_encoded - encoded0,
        "same_tokens": [r["text"] for r in held] == [r["text"] for r in rebuilt],
        # in bf16 a prompt prefilled in pieces and one prefilled whole round differently, and random weights leave
        # near-ties that greedy decoding can then break apart: how many sessions' answers agree
        "same_sessions": sum(h["text"] == r["text"] for h, r in zip(held, rebuilt, strict=True)),
    }


def line(name: str, lv: dict) -> str:
    return (
        f"[{name}] sessions={lv['sessions']:2d} frames/s {lv['frames_per_s_total']:7.1f} in all, "
        f"{lv['frames_per_s_per_session_p50']:6.1f} per session | question TTFT p50 held "
        f"{lv['held_ttft_p50_ms']:7.1f} ms ({lv['held_prefilled_tokens']:.0f} tokens) vs rebuilt "
        f"{lv['rebuilt_ttft_p50_ms']:7.1f} ms ({lv['rebuilt_prefilled_tokens']:.0f} tokens) | "
        f"same {lv['same_sessions']}/{lv['sessions']}"
    )


def table(name: str, levels: list[dict]) -> str:
    head = ("| model | sessions | frames/s in all | frames/s per session p50 | TTFT held p50 ms | TTFT rebuilt p50 ms "
            "| tokens prefilled held / rebuilt | sessions with the same answer |")  # fmt: skip
    rows = [head, "|" + "---|" * 8]
    for lv in levels:
        rows.append(
            f"| {name} | {lv['sessions']} | {lv['frames_per_s_total']:.1f} | {lv['frames_per_s_per_session_p50']:.1f}"
            f" | {lv['held_ttft_p50_ms']:.1f} | {lv['rebuilt_ttft_p50_ms']:.1f} | "
            f"{lv['held_prefilled_tokens']:.0f} / {lv['rebuilt_prefilled_tokens']:.0f} | "
            f"{lv['same_sessions']} of {lv['sessions']} |"
        )
    return "\n".join(rows)


def build_checkpoint(args: argparse.Namespace, tmp: Path) -> Path:
    from omni_stream.models.qwen_vl import checkpoint

    if args.smoke:
        return checkpoint.write_tiny_checkpoint(tmp / "tiny-vl")
    src = checkpoint.write_reference_config(tmp / "config")
    return checkpoint.write_dummy_checkpoint(src, tmp / "qwen2.5-vl-3b", weights=False)


async def run(args: argparse.Namespace) -> dict:
    from omni_stream.engine import AsyncEngine, ModelSource
    from omni_stream.family import ModelKind
    from omni_stream.runtime.weights import count_parameters

    name = "tiny-vl" if args.smoke else "qwen2.5-vl-3b"
    with tempfile.TemporaryDirectory(prefix="vl-bench-") as tmp:
        ckpt = build_checkpoint(args, Path(tmp))
        t0 = time.perf_counter()
        engine = await AsyncEngine.load(
            {"llm": ModelSource(ckpt, kind=ModelKind.TEXT)},
            device=args.device,
            dtype=args.dtype,
            load_format="auto" if args.smoke else "dummy",
            max_batch_size=max(args.levels),
            max_buffered_frames=args.tokens + 1,
            progress=False,
            backend_args={"max_model_len": args.max_model_len, "max_sessions": max(args.levels)},
        )
        load_s = time.perf_counter() - t0
        async with engine:
            runner = engine.models.text().runner
            result = {
                "benchmark": "vl_session_bench",
                "model": name,
                "parameters": count_parameters(runner.lm),
                "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
                "dtype": str(runner.dtype).removeprefix("torch."),
                "torch": torch.__version__,
                "git_commit": git_commit(),
                "frame_size": list(args.size),
                "tokens": args.tokens,
                "max_model_len": runner.max_len,
                "session_rows": runner.session_rows,
                "cuda_graphs": runner.graphs is not None,
                "load_s": load_s,
                "levels": [],
            }
            await level(engine, 1, argparse.Namespace(**{**vars(args), "frames": 1}))  # warm-up
            path = out_dir() / f"vl_session_bench_{name}.json"
            for n in args.levels:
                lv = await level(engine, n, args)
                result["levels"].append(lv)
                print(line(name, lv), flush=True)
                path.write_text(json.dumps(result, indent=2) + "\n")
            print(table(name, result["levels"]))
            print(f"wrote {path}")
            return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,4,16", help="sessions at once (default %(default)s)")
    parser.add_argument("--frames", type=int, default=8, help="frames per session (default %(default)s)")
    parser.add_argument("--size", default="448x448", help="frame size HxW in pixels (default %(default)s)")
    parser.add_argument("--tokens", type=int, default=16, help="answer tokens (default %(default)s)")
    parser.add_argument("--max-model-len", type=int, default=8192, help="positions per sequence (default %(default)s)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--dtype", default=None, help="float32 | bfloat16 (default: bf16 on GPU, fp32 on CPU)")
    parser.add_argument("--smoke", action="store_true", help="CPU smoke run on the tiny Qwen2.5-VL")
    args = parser.parse_args(argv)
    if args.smoke:
        args.device = args.device or "cpu"
        args.levels, args.frames, args.size, args.tokens, args.max_model_len = "1,2", 3, "56x84", 4, 512
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.levels = [int(x) for x in str(args.levels).split(",")]
    h, w = (int(x) for x in str(args.size).lower().split("x"))
    args.size = (h, w)
    if args.device == "cpu":
        torch.set_num_threads(1 if args.smoke else min(4, os.cpu_count() or 1))
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
