"""The sampler's cost per step: temperature, top-k and top-p over a whole vocabulary, then the exponential race
(:func:`omni_stream.runtime.sampling.sample`, what the text model's and the talker's torch steps run), for 1 and 32
rows at a text model's vocabulary (Qwen3's 151,936 tokens) and the talker's (3,072 codes).

Every row samples with Qwen3's generation defaults (temperature 0.6, top-k 20, top-p 0.95) from random logits. Per
setting: the median of ``--repeats`` calls (CPU: wall time with one torch thread per core the process has; CUDA:
CUDA events after a warm-up). Prints a table and writes ``sampling_bench_<device>.json`` to ``$OUT`` or
``benchmarks/results``.

CPU: ``python benchmarks/sampling_bench.py`` (``--smoke``: a few calls at a narrower vocabulary, for
tests/test_sampling_bench_cpu.py). GPU, after the wheel install of ``benchmarks/gpu_suite.sh``::

    PYTHONPATH=/tmp/site python3 benchmarks/sampling_bench.py --device cuda
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from provenance import git_commit

from omni_stream.requests import SamplingParams
from omni_stream.runtime.sampling import SamplingTensors, sample

HERE = Path(__file__).resolve().parent
QWEN3 = SamplingParams(do_sample=True, temperature=0.6, top_k=20, top_p=0.95)
VOCABS = (151936, 3072)
ROWS = (1, 32)


def time_sample(rows: int, vocab: int, device: str, repeats: int) -> float:
    """Median milliseconds of one ``sample`` call over ``rows`` rows of ``vocab`` logits."""
    g = torch.Generator(device=device).manual_seed(rows * vocab)
    logits = torch.randn(rows, vocab, generator=g, device=device) * 3
    noise = torch.empty(rows, vocab, device=device).exponential_(generator=g)
    params = SamplingTensors.from_params([QWEN3] * rows, device)
    cuda = device.startswith("cuda")
    for _ in range(2):  # warm-up: allocations, kernels' first launch
        sample(logits, params, noise)
    times = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            sample(logits, params, noise)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            sample(logits, params, noise)
            times.append(1000 * (time.perf_counter() - t))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=None, help="calls per setting (default: 20 on CUDA, 5 on CPU)")
    ap.add_argument("--smoke", action="store_true", help="3 calls a setting, vocabularies 4,096 and 3,072 (CI)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    repeats = args.repeats or (3 if args.smoke else 20 if args.device.startswith("cuda") else 5)
    vocabs = (4096, 3072) if args.smoke else VOCABS
    levels = []
    print(f"{'vocab':>8} {'rows':>5} {'sample ms':>10}", flush=True)
    for vocab in vocabs:
        for rows in ROWS:
            ms = time_sample(rows, vocab, args.device, repeats)
            levels.append({"vocab": vocab, "rows": rows, "sample_ms": round(ms, 3)})
            print(f"{vocab:>8} {rows:>5} {ms:>10.3f}", flush=True)
    report = {
        "benchmark": "sampling_bench",
        "git_commit": git_commit(),
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch_threads": torch.get_num_threads(),
        "sampling": {"temperature": QWEN3.temperature, "top_k": QWEN3.top_k, "top_p": QWEN3.top_p},
        "repeats": repeats,
        "smoke": args.smoke,
        "levels": levels,
    }
    name = f"sampling_bench_{'cuda' if args.device.startswith('cuda') else 'cpu'}{'_smoke' if args.smoke else ''}.json"
    out = args.out or Path(os.environ.get("OUT") or HERE / "results") / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
