"""Native text generation: TTFT and tokens/s per stream and in aggregate at several concurrencies, in process.

Builds a real-size checkpoint with random weights from ``benchmarks/configs`` (``--config``, default Qwen3-0.6B;
``load_format="dummy"``, bf16 on CUDA, no weight file written) with a full-vocabulary synthetic tokenizer, loads
it on the native family (``AsyncEngine.load``: CUDA graphs of the decode step are captured at load) and, at each
concurrency, starts ``c`` chat requests at once, each generating exactly ``--tokens`` tokens (``ignore_eos``),
seeded, with the checkpoint's default sampling (Qwen3: temperature 0.6, top-k 20, top-p 0.95; ``--greedy``: argmax).

Per request: TTFT (from ``engine.chat()`` to the first text delta), time per output token after the first
(TPOT) and its inverse, the decode rate per stream; whether usage counted exactly ``--tokens``. Per level:
aggregate output tokens/s (all tokens over the wall time from the first call to the last delta), the worker's
wall time per step (all steps, and steps at the full batch), mean batch size, graph and eager steps.
Prints a table and writes ``text_bench_<name>.json`` to ``$OUT`` or ``benchmarks/results``.

GPU machine (the H200 image has torch, transformers, tokenizers, anyio, tqdm, prometheus-client; the package
travels as a wheel, see ``benchmarks/tts_bench.py``). In the repository root, one command::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/omni_stream-*.whl && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 || exit; \
    python3 benchmarks/text_bench.py && \
    python3 benchmarks/text_bench.py --config benchmarks/configs/llama-3.2-1b-instruct

CPU smoke run (tests/test_text_bench_cpu.py): ``python benchmarks/text_bench.py --smoke``: the tiny chat
checkpoint, levels 1 and 2, 8 tokens.
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

import torch
from provenance import git_commit

from omni_stream.metrics import percentile

ROOT = Path(__file__).resolve().parent
DEFAULT_CONFIG = ROOT / "configs" / "qwen3-0.6b"
SENTENCE = "The quick brown fox jumps over the lazy dog while the evening sun sets behind the hills. "


def out_dir() -> Path:
    path = Path(os.environ.get("OUT") or ROOT / "results")
    path.mkdir(parents=True, exist_ok=True)
    return path


class StepTimer:
    """Wraps the runner's step: worker wall time and batch size of every step."""

    def __init__(self, runner) -> None:
        self.steps: list[tuple[int, float]] = []
        step = runner.step

        def timed(batch):
            t0 = time.perf_counter()
            out = step(batch)
            self.steps.append((batch.size, time.perf_counter() - t0))
            return out

        runner.step = timed

    def summary(self, c: int) -> dict:
        walls = [s for _, s in self.steps]
        full = [s for n, s in self.steps if n == c]
        return {
            "steps": len(walls),
            "step_wall_ms_p50": 1000 * percentile(walls, 50) if walls else None,
            "step_wall_ms_full_batch_p50": 1000 * percentile(full, 50) if full else None,
            "batch_size_mean": statistics.fmean(n for n, _ in self.steps) if self.steps else None,
        }


async def one_request(engine, prompt: str, i: int, tokens: int, greedy: bool) -> dict:
    from omni_stream.requests import GREEDY, ChatMessage, Role, TextRequest

    request = TextRequest(messages=(ChatMessage(Role.USER, prompt),), max_tokens=tokens, ignore_eos=True, seed=i,
                          sampling=GREEDY if greedy else None)  # fmt: skip
    t0 = time.perf_counter()
    arrivals: list[float] = []
    stream = engine.chat(request)
    async with stream:
        async for _ in stream:
            arrivals.append(time.perf_counter())
    if not arrivals:
        raise RuntimeError("a request returned no text")
    usage = stream.usage["text"]
    decode_s = arrivals[-1] - arrivals[0]
    return {
        "start": t0,
        "end": arrivals[-1],
        "ttft": arrivals[0] - t0,
        "tpot": decode_s / (usage.output_tokens - 1) if usage.output_tokens > 1 else None,
        "output_tokens": usage.output_tokens,
        "input_tokens": usage.input_tokens,
        "deltas": len(arrivals),
    }


def summarize(c: int, reqs: list[dict], tokens: int) -> dict:
    ttft = [r["ttft"] for r in reqs]
    tpot = [r["tpot"] for r in reqs if r["tpot"]]
    wall = max(r["end"] for r in reqs) - min(r["start"] for r in reqs)
    total = sum(r["output_tokens"] for r in reqs)
    return {
        "concurrency": c,
        "tokens_per_request": tokens,
        "prompt_tokens": statistics.median(r["input_tokens"] for r in reqs),
        "exact_length_rate": sum(r["output_tokens"] == tokens for r in reqs) / len(reqs),
        "ttft_p50_ms": 1000 * percentile(ttft, 50),
        "ttft_p95_ms": 1000 * percentile(ttft, 95),
        "ttft_max_ms": 1000 * max(ttft),
        "tpot_p50_ms": 1000 * percentile(tpot, 50) if tpot else None,
        "tok_s_per_stream_p50": 1 / percentile(tpot, 50) if tpot else None,
        "tok_s_per_stream_min": 1 / max(tpot) if tpot else None,
        "aggregate_tok_s": total / wall,
        "wall_s": wall,
        "deltas_per_request_p50": statistics.median(r["deltas"] for r in reqs),
    }


def _f(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def level_line(name: str, lv: dict) -> str:
    return (
        f"[{name}] c={lv['concurrency']:3d} TTFT p50 {lv['ttft_p50_ms']:8.1f} ms"
        f" | TPOT p50 {_f(lv['tpot_p50_ms'], '6.2f')} ms | tok/s/stream {_f(lv['tok_s_per_stream_p50'], '7.1f')}"
        f" | aggregate {lv['aggregate_tok_s']:8.1f} tok/s | step {_f(lv['step_wall_ms_full_batch_p50'], '6.2f')} ms"
        f" | exact {lv['exact_length_rate']:.2f}"
    )


def table(name: str, levels: list[dict]) -> str:
    head = ("| model | c | TTFT p50 ms | TTFT p95 ms | TPOT p50 ms | tok/s/stream p50 | tok/s/stream min | "
            "aggregate tok/s | step ms (full batch) | exact length |")  # fmt: skip
    rows = [head, "|" + "---|" * 10]
    for lv in levels:
        rows.append(
            f"| {name} | {lv['concurrency']} | {lv['ttft_p50_ms']:.1f} | {lv['ttft_p95_ms']:.1f} | "
            f"{_f(lv['tpot_p50_ms'], '.2f')} | {_f(lv['tok_s_per_stream_p50'], '.1f')} | "
            f"{_f(lv['tok_s_per_stream_min'], '.1f')} | {lv['aggregate_tok_s']:.1f} | "
            f"{_f(lv['step_wall_ms_full_batch_p50'], '.2f')} | {lv['exact_length_rate']:.2f} |"
        )
    return "\n".join(rows)


def build_checkpoint(args: argparse.Namespace, tmp: Path) -> Path:
    if args.smoke:
        from omni_stream.models.causal_lm.checkpoint import write_tiny_checkpoint

        return write_tiny_checkpoint(tmp / "tiny-chat", "qwen3")
    from omni_stream.models.causal_lm.checkpoint import write_dummy_checkpoint

    return write_dummy_checkpoint(args.config, tmp / args.config.name, weights=False)


async def run(args: argparse.Namespace) -> dict:
    from omni_stream.engine import AsyncEngine, ModelSource
    from omni_stream.family import ModelKind

    name = "tiny-chat" if args.smoke else args.config.name
    with tempfile.TemporaryDirectory(prefix="text-bench-") as tmp:
        ckpt = build_checkpoint(args, Path(tmp))
        t0 = time.perf_counter()
        engine = await AsyncEngine.load(
            {"llm": ModelSource(ckpt, kind=ModelKind.TEXT)},
            device=args.device,
            dtype=args.dtype,
            load_format="auto" if args.smoke else "dummy",
            max_batch_size=max(args.levels),
            max_buffered_frames=args.tokens + 1,  # the reader never pauses a request
            progress=False,
            backend_args={"max_model_len": args.max_model_len},
        )
        load_s = time.perf_counter() - t0
        async with engine:
            return await measure(engine, args, name, load_s)


async def measure(engine, args: argparse.Namespace, name: str, load_s: float) -> dict:
    from omni_stream.runtime.weights import count_parameters

    family = engine.models.text()
    runner = family.runner  # type: ignore[attr-defined]
    prompt = SENTENCE
    while family.count_text_tokens(prompt) < args.prompt_tokens:
        prompt += SENTENCE
    result = {
        "benchmark": "text_bench",
        "model": name,
        "config": str(args.config) if not args.smoke else "tiny",
        "model_type": family.info.model_type,
        "parameters": count_parameters(runner.lm),
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
        "dtype": str(runner.dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "git_commit": git_commit(),
        "sampling": "greedy" if args.greedy else "generation_config",
        "max_model_len": runner.max_len,
        "cuda_graphs": runner.graphs is not None,
        "fused_kernels": runner.kernels.name if runner.kernels is not None else None,
        "load_s": load_s,
        "graph_capture_s": runner.capture_seconds,
        "levels": [],
    }
    timer = StepTimer(runner)
    warm = min(8, args.tokens)
    await asyncio.gather(*(one_request(engine, prompt, i, warm, args.greedy) for i in range(min(4, max(args.levels)))))
    path = out_dir() / f"text_bench_{name}{'_greedy' if args.greedy else ''}.json"
    for c in args.levels:
        timer.steps.clear()
        graph0, eager0 = runner.graph_steps, runner.eager_steps
        reqs = await asyncio.gather(*(one_request(engine, prompt, i, args.tokens, args.greedy) for i in range(c)))
        level = summarize(c, reqs, args.tokens) | timer.summary(c)
        level |= {"graph_steps": runner.graph_steps - graph0, "eager_steps": runner.eager_steps - eager0}
        result["levels"].append(level)
        print(level_line(name, level), flush=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
    print(table(name, result["levels"]))
    print(f"wrote {path}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="config dir (default %(default)s)")
    parser.add_argument("--levels", default="1,4,16,32,64", help="concurrencies (default %(default)s)")
    parser.add_argument("--tokens", type=int, default=256, help="output tokens per request (default %(default)s)")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="prompt length, at least (default %(default)s)")
    parser.add_argument("--max-model-len", type=int, default=2048, help="positions per sequence (default %(default)s)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--dtype", default=None, help="float32 | bfloat16 (default: bf16 on GPU, fp32 on CPU)")
    parser.add_argument("--greedy", action="store_true", help="argmax instead of the checkpoint's sampling")
    parser.add_argument("--smoke", action="store_true", help="CPU smoke run on the tiny chat checkpoint")
    args = parser.parse_args(argv)
    if args.smoke:
        args.device = args.device or "cpu"
        args.levels, args.tokens, args.prompt_tokens, args.max_model_len = "1,2", 8, 16, 256
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.levels = [int(x) for x in str(args.levels).split(",")]
    if args.device == "cpu" and not args.smoke:
        print("note: a real-size model on the CPU is slow; --smoke runs the tiny one", file=sys.stderr)
    if args.device == "cpu":
        torch.set_num_threads(min(4, os.cpu_count() or 1))
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
