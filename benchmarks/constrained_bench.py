"""Constrained decoding on the native text model: the decode step's cost with grammar-constrained rows against free
rows, at batch 1 and 64 (and half-and-half at 64), on the runner and the real scheduler, in process.

Every row generates ``--steps`` tokens after its prefill. Free rows ignore EOS; constrained rows follow a JSON
Schema grammar (``{"text": string}``, so a random model stays inside the string for the whole run) through
llguidance. Per setting: the worker's wall time per steady step (median, p90), how long the step waited for the
masks computed since the last step (``mask_wait_ms``: the part of the mask work that did not overlap), the mask
job's own time per step (``mask_job_ms``), mean live rows. Prints a table and writes
``constrained_bench_<name>.json`` to ``$OUT`` or ``benchmarks/results``.

CPU (what ``--smoke`` runs in tests/test_constrained_bench_cpu.py): the tiny chat checkpoint, 8 steps;
without ``--smoke`` on CPU: the tiny checkpoint, 32 steps. GPU (``--gpu``): random weights at the sizes of
``--config`` (default Qwen3-0.6B, bf16, CUDA graphs), its full-vocabulary synthetic tokenizer, 64 steps. In the
repository root on the GPU machine, after the wheel install of ``benchmarks/gpu_suite.sh`` (about a minute)::

    PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 benchmarks/constrained_bench.py --gpu

The synthetic tokenizer's fillers make its token trie unlike a trained one; ``benchmarks/grammar_libraries.py``
measures masks on Qwen3's real vocabulary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from provenance import git_commit

from omni_stream.models.causal_lm import constraint
from omni_stream.models.causal_lm.runner import LMRequest
from omni_stream.requests import GREEDY, ChatMessage, Role, SamplingParams, TextRequest
from omni_stream.scheduler import run_offline
from omni_stream.text.grammar import response_grammar
from omni_stream.text.tools import FormatKind, ResponseFormat

ROOT = Path(__file__).resolve().parent
DEFAULT_CONFIG = ROOT / "configs" / "qwen3-0.6b"
SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


def out_dir() -> Path:
    path = Path(os.environ.get("OUT") or ROOT / "results")
    path.mkdir(parents=True, exist_ok=True)
    return path


class Probe:
    """Times the runner's steps, its waits for the masks and the mask jobs."""

    def __init__(self, runner) -> None:
        self.steps: list[tuple[float, int]] = []
        self.waits: list[float] = []
        self.jobs: list[float] = []
        step, join, fill = runner.step, runner._join_masks, constraint.fill_masks
        sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)

        def timed_step(batch):
            t0 = time.perf_counter()
            out = step(batch)
            sync()
            self.steps.append((time.perf_counter() - t0, len(batch.prefill) + len(batch.decode)))
            return out

        def timed_join():
            t0 = time.perf_counter()
            join()
            self.waits.append(time.perf_counter() - t0)

        def timed_fill(pairs, bitmask):
            t0 = time.perf_counter()
            fill(pairs, bitmask)
            self.jobs.append(time.perf_counter() - t0)

        runner.step, runner._join_masks = timed_step, timed_join
        constraint.fill_masks = timed_fill
        import omni_stream.models.causal_lm.runner as runner_module

        runner_module.fill_masks = timed_fill
        self._restore = (runner, step, join, fill, runner_module)

    def close(self) -> None:
        runner, step, join, fill, runner_module = self._restore
        runner.step, runner._join_masks = step, join
        constraint.fill_masks = runner_module.fill_masks = fill


def requests(family, batch: int, constrained: int, steps: int, prompt: list[int]) -> list[LMRequest]:
    lark = response_grammar(ResponseFormat(FormatKind.JSON_SCHEMA, json.dumps(SCHEMA)))
    sampled = SamplingParams(temperature=1.0, top_k=0)
    out = []
    for i in range(batch):
        if i < constrained:
            matcher = family.grammars.matcher(lark, "response_format")
            out.append(LMRequest(tuple(prompt), steps + 1, sampled, seed=i, matcher=matcher))
        else:
            out.append(LMRequest(tuple(prompt), steps + 1, GREEDY if i % 2 else sampled, seed=i, ignore_eos=True))
    return out


def measure(family, batch: int, constrained: int, steps: int, prompt: list[int]) -> dict:
    runner = family.runner
    run_offline(runner, requests(family, batch, min(constrained, 1), 2, prompt))  # warm-up (graphs, tokenizer)
    payloads = requests(family, batch, constrained, steps, prompt)
    probe = Probe(runner)
    try:
        results = run_offline(runner, payloads)
    finally:
        probe.close()
    assert all(r.error is None for r in results), [r.error for r in results if r.error]
    steady = [t for t, _ in probe.steps[1:]]  # the first step prefills
    rows = [n for _, n in probe.steps[1:]]
    return {
        "batch": batch,
        "constrained_rows": constrained,
        "steps": len(steady),
        "step_ms_p50": round(statistics.median(steady) * 1e3, 3),
        "step_ms_p90": round(sorted(steady)[int(0.9 * (len(steady) - 1))] * 1e3, 3),
        "mask_wait_ms": round(sum(probe.waits) / max(1, len(steady)) * 1e3, 3),
        "mask_job_ms": round(sum(probe.jobs) / max(1, len(steady)) * 1e3, 3),
        "mean_rows": round(statistics.fmean(rows), 2),
    }


def load(args: argparse.Namespace, tmp: Path):
    from omni_stream.family import LoadContext, LoadOptions
    from omni_stream.metrics import EngineMetrics
    from omni_stream.models.causal_lm.family import CausalLMFamily
    from omni_stream.worker import DeviceWorker

    if args.gpu:
        from omni_stream.models.causal_lm.checkpoint import write_dummy_checkpoint

        path = write_dummy_checkpoint(args.config, tmp / args.config.name, weights=False)
        options = LoadOptions(device="cuda", load_format="dummy", max_batch_size=64, progress=False)
    else:
        from omni_stream.models.causal_lm.checkpoint import write_tiny_checkpoint

        path = write_tiny_checkpoint(tmp / "qwen3-tiny", "qwen3", seed=0)
        options = LoadOptions(device="cpu", max_batch_size=64, progress=False)
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    context = LoadContext(path, config, options, DeviceWorker(name="bench"), EngineMetrics())  # never started
    return CausalLMFamily(context), path.name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", action="store_true", help="real sizes of --config on CUDA")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny checkpoint, 8 steps")
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))
    steps = args.steps or (8 if args.smoke else 64 if args.gpu else 32)
    with tempfile.TemporaryDirectory() as tmp:
        family, name = load(args, Path(tmp))
        ask = TextRequest(messages=(ChatMessage(Role.USER, "Write a long story about the sea."),))
        prompt = family.tokenizer.encode(ask)
        settings = [(1, 0), (1, 1), (64, 0), (64, 32), (64, 64)]
        levels = [measure(family, b, c, steps, prompt) for b, c in settings]
    result = {
        "benchmark": "constrained_bench",
        "git_commit": git_commit(),
        "device": "cuda" if args.gpu else "cpu",
        "model": name,
        "steps_per_row": steps,
        "schema": SCHEMA,
        "levels": levels,
    }
    print(f"{'batch':>5} {'constrained':>11} {'step p50 ms':>11} {'p90 ms':>8} {'mask wait':>9} {'mask job':>8} rows")
    for lv in levels:
        print(f"{lv['batch']:>5} {lv['constrained_rows']:>11} {lv['step_ms_p50']:>11} {lv['step_ms_p90']:>8} "
              f"{lv['mask_wait_ms']:>9} {lv['mask_job_ms']:>8} {lv['mean_rows']}")  # fmt: skip
    suffix = "_smoke" if args.smoke else ""
    path = out_dir() / f"constrained_bench_{result['device']}{suffix}.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
