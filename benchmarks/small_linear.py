"""The small-batch projection (``triton_kernels.linear``) against cuBLAS, then the decode step with and without it.

Run on a CUDA machine: ``python benchmarks/small_linear.py [--size 1.7b] [--sweep]``.

1. Per projection of the model (bf16, 1.7B shapes by default): microseconds per call of ``F.linear`` (cuBLAS)
   and of the Triton kernel at 1, 2, 8 and 16 rows, each timed as 200 calls captured in one CUDA graph over a
   ring of distinct weights larger than L2 (so every call reads its weight from HBM, as a decode step does);
   ``--sweep`` also times a grid of tile shapes at 1 row and reports the best.
2. The code-predictor loop (15 steps with sampling) and the whole decode step as CUDA graphs at batch 1-16,
   with ``small_rows`` 0 (every projection on cuBLAS), 16 (the Triton projections up to 16 rows) and 16 with
   16 with each ``--pdl`` setting of ``OMNI_STREAM_PDL`` (default ``0``, ``16/0``: each kernel launched only
   after the previous one has finished), plus a CUPTI kernel profile of each at batch 1.

Prints a table last; writes ``small_linear.json`` to ``$OUT`` (or ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from code_predictor import CONFIGS, bench_code_predictor, bench_step, cuda_ms
from provenance import git_commit

from omni_stream.models.qwen3_tts.checkpoint import load_lm, write_dummy_checkpoint
from omni_stream.models.qwen3_tts.config import load_config
from omni_stream.runtime import triton_kernels as tk
from omni_stream.runtime.decoder_kernels import triton_kernels
from omni_stream.runtime.settings import SWITCH_BY_NAME, Tuning

ROOT = Path(__file__).resolve().parent
# (name, small_rows, the code predictor's limit: None as small_rows, OMNI_STREAM_PDL): all cuBLAS and the default;
# main() adds the default at each --pdl setting
LIMITS = (("0", 0, None, "1"), ("16", 16, None, "1"))
CALLS = 200
RING_BYTES = 512 << 20


def projections(size: str) -> dict[str, tuple[int, int]]:
    """name -> (N, K) for the decoder projections of the talker and the code predictor, and the predictor's others."""
    cfg = load_config(CONFIGS[size])
    out = {}
    for who, d in (("talker", cfg.talker.decoder), ("cp", cfg.code_predictor)):
        out[f"{who}.qkv"] = ((d.num_attention_heads + 2 * d.num_key_value_heads) * d.head_dim, d.hidden_size)
        out[f"{who}.o"] = (d.hidden_size, d.num_attention_heads * d.head_dim)
        out[f"{who}.gate_up"] = (2 * d.intermediate_size, d.hidden_size)
        out[f"{who}.down"] = (d.hidden_size, d.intermediate_size)
    t = cfg.talker.decoder
    out["talker.codec_head"] = (t.vocab_size, t.hidden_size)
    cp = cfg.code_predictor
    out["cp.lm_head"] = (cp.vocab_size, cp.hidden_size)
    if cfg.talker.decoder.hidden_size != cp.hidden_size:
        out["cp.input_proj"] = (cp.hidden_size, cfg.talker.decoder.hidden_size)
    return out


def time_calls(fn_for, n: int, k: int) -> float:
    """Microseconds per call: ``CALLS`` calls over a ring of distinct weights, one CUDA graph."""
    copies = max(2, RING_BYTES // (n * k * 2))
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5 for _ in range(copies)]
    fns = [fn_for(w) for w in ws]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for f in fns[:3]:
            f()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS):
            fns[i % copies]()
    ms = cuda_ms(graph.replay, 20)
    del graph, ws, fns
    return 1000.0 * ms / CALLS


def bench_projection(n: int, k: int, rows: int, blocks: tk.SmallLinearBlocks | None) -> dict:
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    cublas = time_calls(lambda w: lambda: F.linear(x, w), n, k)
    triton = time_calls(lambda w: lambda: tk.linear(x, w, blocks=blocks), n, k)
    gb = n * k * 2 / 1e9
    return {"cublas_us": cublas, "triton_us": triton, "cublas_tbps": gb / cublas * 1e3,
            "triton_tbps": gb / triton * 1e3}  # fmt: skip


def sweep(n: int, k: int) -> dict:
    best: dict | None = None
    for bn, bk, warps, stages in itertools.product((16, 32, 64), (128, 256, 512), (4, 8), (2, 4)):
        if bk > triton_next(k) or bn * bk > 32768:
            continue
        blocks = tk.SmallLinearBlocks(bn, bk, warps, stages)
        try:
            r = bench_projection(n, k, 1, blocks)
        except Exception as exc:  # a tile that does not compile or fit is skipped
            print(f"    {blocks}: {type(exc).__name__}", flush=True)
            continue
        if best is None or r["triton_us"] < best["triton_us"]:
            best = {"blocks": [bn, bk, warps, stages], **r}
    assert best is not None
    return best


def triton_next(k: int) -> int:
    return 1 << (k - 1).bit_length()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1.7b")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--graph-reps", type=int, default=30)
    ap.add_argument("--no-projections", action="store_true", help="only the loops (part 2)")
    ap.add_argument("--pdl", nargs="*", default=["0"], help="OMNI_STREAM_PDL settings to compare with the default")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 2
    result: dict = {"git_commit": git_commit(), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "size": args.size, "projections": {}, "loops": {}}  # fmt: skip
    print(f"== projections ({args.size}, bf16, us per call, weights from HBM)", flush=True)
    for name, (n, k) in ({} if args.no_projections else projections(args.size)).items():
        entry: dict = {"n": n, "k": k, "default_blocks": list(vars_of(tk.small_linear_blocks(n, k)))}
        for rows in (1, 2, 8, 16):
            entry[f"rows_{rows}"] = r = bench_projection(n, k, rows, None)
            print(f"  {name:14s} [{n:5d} x {k:5d}] rows {rows:2d}: cuBLAS {r['cublas_us']:6.2f} us"
                  f" ({r['cublas_tbps']:.2f} TB/s)  Triton {r['triton_us']:6.2f} us ({r['triton_tbps']:.2f} TB/s)",
                  flush=True)  # fmt: skip
        if args.sweep:
            entry["best_1_row"] = best = sweep(n, k)
            print(f"  {name:14s} best tile at 1 row {best['blocks']}: {best['triton_us']:.2f} us", flush=True)
        result["projections"][name] = entry
    batches = [int(b) for b in args.batches.split(",")]
    pdl_switch = SWITCH_BY_NAME["pdl"]
    for pdl in args.pdl:
        pdl_switch.parse(pdl, "--pdl")  # a bad setting fails here, before the model loads
    limits = [*LIMITS, *((f"16/{pdl}", 16, None, pdl) for pdl in args.pdl)]
    base = Tuning.from_env()
    result["pdl"] = {name: pdl for name, _, _, pdl in limits}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_dummy_checkpoint(CONFIGS[args.size], tmp, dtype=torch.bfloat16, weights=False)
        lm = load_lm(ckpt, load_format="dummy", dtype=torch.bfloat16, device="cuda")
        for name, small, predictor, pdl in limits:
            print(f"== small_rows {small}, code predictor {small if predictor is None else predictor},"
                  f" {pdl_switch.env}={pdl}", flush=True)  # fmt: skip
            tuning = replace(base, small_rows=small, predictor_small_rows=predictor, pdl=pdl_switch.parse(pdl))
            kernels = triton_kernels(tuning)
            cp = bench_code_predictor(lm, batches, 3, args.graph_reps, kernels, f"_small{name}")
            step, _, _ = bench_step(lm, batches, args.graph_reps, 512, kernels)
            result["loops"][name] = {"code_predictor": cp, "step": step}
    out_dir = Path(os.environ.get("OUT") or ROOT / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "small_linear.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{result['gpu']}, torch {result['torch']}, commit {result['git_commit']}")
    names = [name for name, *_ in limits]
    print("B     CP graph: " + "".join(f"{n:>8s}" for n in names) + "   step graph: "
          + "".join(f"{n:>8s}" for n in names) + "   xRT/stream at the step (16)")  # fmt: skip
    for i, b in enumerate(batches):
        cps = [result["loops"][s]["code_predictor"][i][f"cp_graph_ms_small{s}"] for s in names]
        steps = [result["loops"][s]["step"][i]["step_graph_ms"] for s in names]
        print(f"{b:3d}   {'':10s}" + "".join(f"{c:8.2f}" for c in cps) + f"   {'':11s}"
              + "".join(f"{c:8.2f}" for c in steps) + f"   {80.0 / steps[1]:8.1f}x")  # fmt: skip
    return 0


def vars_of(blocks: tk.SmallLinearBlocks) -> tuple[int, int, int, int]:
    return (blocks.block_n, blocks.block_k, blocks.num_warps, blocks.num_stages)


if __name__ == "__main__":
    raise SystemExit(main())
