"""LLM -> TTS over ``POST /v1/chat/completions``: time to first text and to first audio, at several concurrencies.

The real server (``omni-stream serve --model TTS --llm LM --load-format dummy --enable-benchmark-fields``, in a
subprocess) serves a real-size Qwen3-TTS CustomVoice and a real-size Qwen3 chat model, both with random weights
(``benchmarks/configs``; bf16 on CUDA). Each request streams a spoken reply (``modalities=["text","audio"]``,
``audio.format="pcm16"``) of exactly ``--tokens`` text tokens (``ignore_eos``). Random weights write no
punctuation, so the reply is spoken in units of ``audio.max_sentence_chars`` characters (the extension that also
bounds a real model's first sentence): what is measured is the pipeline, an LLM feeding a TTS sentence by sentence,
with the first unit's length fixed.

Per request, from the send: TTFT (first ``delta.content``), time to first audio (first ``delta.audio.data``),
audio seconds, and the last byte. Per level: p50/p95 of those, aggregate audio x real time. Writes
``chat_bench_<tag>.json`` to ``$OUT`` or ``benchmarks/results``.

GPU machine: the wheels of ``benchmarks/tts_bench.py`` (the package itself as a wheel), then::

    python3 benchmarks/chat_bench.py

CPU smoke run (tests/test_chat_bench_cpu.py): ``python benchmarks/chat_bench.py --smoke``: the tiny embedded TTS
and chat models, levels 1 and 2, 8 tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import git_commit
from tts_bench import free_port, wait_healthy

from omni_stream.metrics import percentile

ROOT = Path(__file__).resolve().parent
TTS_CONFIGS = {"0.6b": ROOT / "configs" / "qwen3-tts-12hz-0.6b-customvoice",
               "1.7b": ROOT / "configs" / "qwen3-tts-12hz-1.7b-customvoice"}  # fmt: skip
LM_CONFIG = ROOT / "configs" / "qwen3-0.6b"
RATE = 24000


def out_dir() -> Path:
    path = Path(os.environ.get("OUT") or ROOT / "results")
    path.mkdir(parents=True, exist_ok=True)
    return path


def checkpoints(args: argparse.Namespace, root: Path) -> tuple[Path, Path]:
    """The TTS and LM directories (tiny with ``--smoke``, else real-size configs without weight files)."""
    import torch

    from omni_stream.models.causal_lm.checkpoint import write_dummy_checkpoint as write_lm
    from omni_stream.models.causal_lm.checkpoint import write_tiny_checkpoint as write_tiny_lm
    from omni_stream.models.qwen3_tts.checkpoint import write_dummy_checkpoint as write_tts
    from omni_stream.models.qwen3_tts.checkpoint import write_tiny_checkpoint as write_tiny_tts

    if args.smoke:
        return write_tiny_tts(root / "tts", "custom_voice", "0.6b"), write_tiny_lm(root / "lm")
    dtype = torch.bfloat16
    tts = write_tts(TTS_CONFIGS[args.tts_size], root / "tts", dtype=dtype, weights=False)
    return tts, write_lm(LM_CONFIG, root / "lm", dtype=dtype, weights=False)


def server_command(args: argparse.Namespace, tts: Path, lm: Path, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "omni_stream.cli", "serve", "--model", str(tts), "--llm", str(lm),
           "--enable-benchmark-fields", "--device", args.device, "--max-concurrency", str(args.max_batch),
           "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]  # fmt: skip
    if not args.smoke:
        cmd += ["--load-format", "dummy", "--dtype", "bfloat16"]
    return cmd


async def one(client, url: str, args: argparse.Namespace, voice: str, seed: int) -> dict:
    body = {
        "messages": [{"role": "user", "content": "Tell me about the weather today, please."}],
        "modalities": ["text", "audio"],
        "audio": {"voice": voice, "format": "pcm16", "max_sentence_chars": args.unit_chars},
        "stream": True,
        "max_tokens": args.tokens,
        "ignore_eos": True,
        "seed": seed,
    }
    t0 = time.perf_counter()
    first_text = first_audio = None
    audio_bytes = 0
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            delta = chunk["choices"][0]["delta"] if chunk.get("choices") else {}
            now = time.perf_counter()
            if delta.get("content") and first_text is None:
                first_text = now - t0
            data = (delta.get("audio") or {}).get("data")
            if data:
                first_audio = first_audio if first_audio is not None else now - t0
                audio_bytes += len(base64.b64decode(data))
    return {
        "ttft_s": first_text,
        "first_audio_s": first_audio,
        "total_s": time.perf_counter() - t0,
        "audio_s": audio_bytes / 2 / RATE,
    }


def summary(c: int, reqs: list[dict], wall: float) -> dict:
    def p(key: str, q: float) -> float | None:
        values = [r[key] for r in reqs if r[key] is not None]
        return round(percentile(values, q) * 1000, 1) if values else None

    audio = sum(r["audio_s"] for r in reqs)
    return {
        "concurrency": c,
        "ttft_p50_ms": p("ttft_s", 50),
        "ttft_p95_ms": p("ttft_s", 95),
        "first_audio_p50_ms": p("first_audio_s", 50),
        "first_audio_p95_ms": p("first_audio_s", 95),
        "audio_s_per_request": round(audio / len(reqs), 2),
        "aggregate_x_realtime": round(audio / wall, 1),
        "wall_s": round(wall, 3),
    }


async def drive(args: argparse.Namespace, url: str, proc: subprocess.Popen) -> dict:
    import httpx

    levels = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(600, connect=30)) as client:
        ready = await wait_healthy(client, url, proc, args.server_timeout)
        models = (await client.get(f"{url}/v1/models")).json()["data"]
        print(f"[chat_bench] server ready in {ready:.1f} s: {[m['id'] for m in models]}", flush=True)
        voice = "vivian"
        await one(client, url, args, voice, 0)  # warm-up
        for c in args.levels:
            t0 = time.perf_counter()
            reqs = await asyncio.gather(*(one(client, url, args, voice, i) for i in range(c)))
            level = summary(c, list(reqs), time.perf_counter() - t0)
            levels.append(level)
            print(json.dumps(level), flush=True)
    return {"server_ready_s": round(ready, 1), "levels": levels}


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tts, lm = checkpoints(args, Path(tmp))
        port = free_port()
        env = {**os.environ, "OMNI_STREAM_API_KEY": "", "PYTHONUNBUFFERED": "1", "OMNI_STREAM_CACHE": tmp}
        # outside the repository: the source tree's omni_stream/ must not shadow the installed package
        proc = subprocess.Popen(server_command(args, tts, lm, port), env=env, cwd=tmp)
        try:
            return asyncio.run(drive(args, f"http://127.0.0.1:{port}", proc))
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny models on the CPU (a test runs this)")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--tts-size", choices=sorted(TTS_CONFIGS), default="0.6b")
    parser.add_argument("--levels", default=None, help="concurrencies, comma-separated (default 1,4,16)")
    parser.add_argument("--tokens", type=int, default=None, help="text tokens per reply (default 24; smoke 8)")
    parser.add_argument("--unit-chars", type=int, default=40, help="audio.max_sentence_chars (default 40)")
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--server-timeout", type=float, default=300.0)
    parser.add_argument("--tag", default=None)
    args = parser.parse_args(argv)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.levels = [int(x) for x in (args.levels or ("1,2" if args.smoke else "1,4,16")).split(",")]
    args.tokens = args.tokens or (8 if args.smoke else 24)
    result = run(args)
    tag = args.tag or ("smoke" if args.smoke else f"tts{args.tts_size}_qwen3-0.6b")
    report = {
        "benchmark": "chat_bench",
        "commit": git_commit(),
        "device": args.device,
        "args": {k: v for k, v in vars(args).items()},
        **result,
    }
    path = out_dir() / f"chat_bench_{tag}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print("| c | TTFT p50/p95 ms | first audio p50/p95 ms | audio s/req | aggregate xRT |")
    print("|---|---|---|---|---|")
    for lv in result["levels"]:
        print(f"| {lv['concurrency']} | {lv['ttft_p50_ms']} / {lv['ttft_p95_ms']} | {lv['first_audio_p50_ms']} / "
              f"{lv['first_audio_p95_ms']} | {lv['audio_s_per_request']} | {lv['aggregate_x_realtime']} |")  # fmt: skip
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
