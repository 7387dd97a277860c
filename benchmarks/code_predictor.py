"""GPU time of the code predictor and of the whole decode step, eager vs CUDA graph, per batch bucket.

Run on a CUDA machine: ``python benchmarks/code_predictor.py [--sizes 0.6b,1.7b] [--batches 1,2,...,128]``.
Real-size models with random bf16 weights (``load_format="dummy"``) from ``benchmarks/configs``. Times are
CUDA-event medians per frame (one call = one frame for every row): the 15-step code-predictor loop with
sampling (top-k 50, T 0.9, in-graph noise), the full decode step of the runner (code-0 sampling + code
predictor + talker over a 512-position span), and the codec decoder per streaming window (eager). The code
predictor runs twice: decoder layers as modules (eager and graph), then fused (``runtime/decoder_kernels.py``). Graph
capture is excluded from the timings and reported. Prints a table last; writes JSON to ``$OUT`` (or
``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from provenance import git_commit

from omni_stream.models.qwen3_tts.checkpoint import load_lm, write_dummy_checkpoint
from omni_stream.models.qwen3_tts.runner import Qwen3TTSRunner
from omni_stream.requests import SamplingParams
from omni_stream.runtime import rng
from omni_stream.runtime.cuda_graphs import GraphSet
from omni_stream.runtime.decoder_kernels import DecodeKernels, default_kernels
from omni_stream.runtime.sampling import SamplingTensors
from omni_stream.runtime.settings import Tuning

ROOT = Path(__file__).resolve().parent
CONFIGS = {
    "0.6b": ROOT / "configs" / "qwen3-tts-12hz-0.6b-customvoice",
    "1.7b": ROOT / "configs" / "qwen3-tts-12hz-1.7b-customvoice",
}
SUB = SamplingParams(do_sample=True, temperature=0.9, top_k=50)


def cuda_ms(fn: Callable[[], object], reps: int, warmup: int = 3) -> float:
    """Median milliseconds of ``fn`` by CUDA events (each call timed alone)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def bench_code_predictor(lm, batches: list[int], eager_reps: int, graph_reps: int, kernels, tag: str) -> list[dict]:
    """The loop with decoder layers as modules (``kernels`` None) or fused; columns suffixed with ``tag``."""
    lm.talker.use_kernels(kernels)
    cp = lm.talker.code_predictor
    h = lm.config.talker.decoder.hidden_size
    dev = lm.talker.codec_head.weight.device
    top = max(batches)
    hidden = torch.randn(top, h, device=dev, dtype=torch.bfloat16)
    c0 = torch.randn(top, h, device=dev, dtype=torch.bfloat16)
    params = SamplingTensors.from_params([SUB] * top, dev)
    seeds = torch.arange(top, device=dev)
    steps = torch.zeros(top, dtype=torch.long, device=dev)
    rng.prepare(15 * 2048, dev)
    out: dict[int, torch.Tensor] = {}

    def run(b: int) -> None:
        noise = rng.exponential(rng.row_keys(seeds[:b], steps[:b]), 15 * 2048).view(b, 15, 2048)
        p = SamplingTensors(*(getattr(params, f)[:b] for f in params.__dataclass_fields__))
        out[b] = cp.generate(hidden[:b], c0[:b], p, noise)

    graphs = GraphSet(run, dev)
    with torch.no_grad():
        capture_s = graphs.capture_all([(b,) for b in batches])
        rows = []
        for b in batches:
            eager = cuda_ms(lambda b=b: run(b), eager_reps)
            graph = cuda_ms(lambda b=b: graphs.replay((b,)), graph_reps)
            rows.append({"batch": b, f"cp_eager_ms{tag}": eager, f"cp_graph_ms{tag}": graph})
            print(f"  cp{tag} B={b:4d}  eager {eager:8.2f} ms  graph {graph:7.2f} ms", flush=True)
        try:
            prof = kernel_profile(lambda: graphs.replay((batches[0],)))
            rows[0][f"cp_profile{tag}"] = prof
            print(f"  cp{tag} B={batches[0]} profile: {json.dumps(prof)}", flush=True)
        except Exception as exc:
            print(f"  profile failed: {exc!r}", flush=True)
    rows[0][f"capture_s_all{tag}"] = capture_s
    return rows


CATEGORIES = (
    ("small linear (Triton)", ("small_linear",)),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "splitk")),
    ("attention", ("flash", "fmha", "attention", "cudnn", "sdpa")),
    ("sort/top-k", ("sort", "radix", "topk")),
    ("reduce/norm", ("reduce", "norm")),
    ("index/copy/cat", ("index", "copy", "gather", "scatter", "cat", "fill")),
    ("elementwise", ("elementwise", "vectorized", "unrolled")),
)


def kernel_profile(fn: Callable[[], object], reps: int = 5) -> dict:
    """Kernels per call and GPU time per category (CUPTI through torch.profiler), averaged over ``reps`` calls."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    cats: dict[str, list[float]] = {}
    top: list[tuple[float, float, str]] = []
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
        if not t:
            continue
        name = ev.key.lower()
        cat = next((c for c, keys in CATEGORIES if any(k in name for k in keys)), "other")
        entry = cats.setdefault(cat, [0.0, 0.0])
        entry[0] += ev.count / reps
        entry[1] += t / reps / 1000.0
        top.append((t / reps / 1000.0, ev.count / reps, ev.key[:80]))
    total = {"kernels": sum(v[0] for v in cats.values()), "busy_ms": sum(v[1] for v in cats.values())}
    return {"total": total, "by_category": {c: {"kernels": v[0], "ms": v[1]} for c, v in sorted(cats.items())},
            "top": [{"kernel": k, "count": n, "ms": ms} for ms, n, k in sorted(top, reverse=True)[:15]]}  # fmt: skip


def bench_step(
    lm, batches: list[int], graph_reps: int, span: int, kernels: DecodeKernels | None = None
) -> tuple[list[dict], float, float]:
    """Whole decode step (rows idle: same kernels, state untouched) at the ``span`` bucket; fused layers
    (``kernels``, None: the environment's tuning's), then the module layers at batch 1 for comparison."""
    kernels = kernels or default_kernels(torch.device("cuda"), Tuning.from_env())
    plain = Qwen3TTSRunner(lm, max_batch_size=1, max_len=span, fused=False)
    plain.capture_graphs()
    assert plain.graphs is not None
    modules_b1 = cuda_ms(lambda: plain.graphs.replay((1, span)), graph_reps)
    print(f"  step B=   1  graph, module layers {modules_b1:7.2f} ms", flush=True)
    runner = Qwen3TTSRunner(lm, max_batch_size=max(batches), max_len=span, fused=kernels or False)
    runner.batch_buckets = tuple(batches)
    capture_s = runner.capture_graphs()
    assert runner.graphs is not None
    rows = []
    for b in batches:
        ms = cuda_ms(lambda b=b: runner.graphs.replay((b, span)), graph_reps)
        rows.append({"batch": b, "step_graph_ms": ms})
        if b == 1:
            rows[-1]["step_graph_ms_modules"] = modules_b1
        print(f"  step B={b:4d}  graph {ms:7.2f} ms", flush=True)
    try:
        prof = kernel_profile(lambda: runner.graphs.replay((batches[0], span)))
        rows[0]["step_profile"] = prof
        print(f"  step B={batches[0]} profile: {json.dumps(prof)}", flush=True)
    except Exception as exc:  # the profiler is a diagnostic: never lose the timings over it
        print(f"  profile failed: {exc!r}", flush=True)
    eager_runner = Qwen3TTSRunner(lm, max_batch_size=1, max_len=span, graphs=False, fused=kernels or False)
    with torch.no_grad():
        eager1 = cuda_ms(lambda: eager_runner._run_rows(1, span, noisy=True), 5)
    print(f"  step B=   1  eager {eager1:7.2f} ms", flush=True)
    return rows, capture_s, eager1


def bench_codec(ckpt: Path, windows: list[int], batches: list[int]) -> list[dict]:
    from omni_stream.models.qwen3_tts.codec import load_speech_tokenizer
    from omni_stream.models.qwen3_tts.codec_stream import CodecStreamState, decode_window

    tok = load_speech_tokenizer(ckpt, "cuda", torch.bfloat16, "dummy", with_encoder=False).eval()
    dec = tok.decoder
    rows = []
    for b in batches:
        for n in windows:
            codes = torch.randint(0, 2048, (b, 16, n), device="cuda")
            state = CodecStreamState.zeros(dec, b, device="cuda", dtype=torch.bfloat16)
            ms = cuda_ms(lambda codes=codes, state=state: decode_window(dec, codes, state.clone()), 5, warmup=2)
            rows.append({"batch": b, "frames": n, "codec_eager_ms": ms})
            print(f"  codec B={b:3d} window {n:2d} frames: {ms:7.2f} ms eager", flush=True)
    del tok
    torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="0.6b,1.7b")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64,128")
    ap.add_argument("--eager-reps", type=int, default=7)
    ap.add_argument("--graph-reps", type=int, default=30)
    ap.add_argument("--span", type=int, default=512, help="talker attention span of the step graphs")
    ap.add_argument("--no-codec", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = True
    batches = [int(x) for x in args.batches.split(",")]
    result: dict = {
        "git_commit": git_commit(),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "dtype": "bfloat16",
        "sampling": "top-k 50, T 0.9, counter-based exponential race (in graph)",
        "models": {},
    }
    try:
        import transformers

        result["transformers"] = transformers.__version__
    except ImportError:
        result["transformers"] = None
    for size in args.sizes.split(","):
        print(f"== {size}", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = write_dummy_checkpoint(CONFIGS[size], tmp, dtype=torch.bfloat16, weights=False)
            lm = load_lm(ckpt, load_format="dummy", dtype=torch.bfloat16, device="cuda")
            cp_rows = bench_code_predictor(lm, batches, args.eager_reps, args.graph_reps, None, "")
            kernels = default_kernels(torch.device("cuda"), Tuning.from_env())
            fused = bench_code_predictor(lm, batches, args.eager_reps, args.graph_reps, kernels, "_fused")
            step_rows, step_capture_s, eager1 = bench_step(lm, batches, args.graph_reps, args.span)
            for r, f, s in zip(cp_rows, fused, step_rows, strict=True):
                r.update(f)
                r.update(s)
                # The headline: the straightforward loop (modules, eager) against what the engine runs.
                r["speedup"] = r["cp_eager_ms"] / r["cp_graph_ms_fused"]
                r["speedup_graph_only"] = r["cp_eager_ms"] / r["cp_graph_ms"]
                r["talker_and_sampling_ms"] = s["step_graph_ms"] - r["cp_graph_ms_fused"]
                r["aggregate_xrt_gpu"] = 80.0 * r["batch"] / s["step_graph_ms"]
            entry = {
                "rows": cp_rows,
                "step_capture_s": step_capture_s,
                "step_eager_b1_ms": eager1,
                "step_span": args.span,
            }
            del lm
            torch.cuda.empty_cache()
            if not args.no_codec and size == args.sizes.split(",")[0]:
                entry["codec"] = bench_codec(ckpt, [1, 2, 4, 8, 16, 25], [1, 8, 32])
            result["models"][size] = entry
    out_dir = Path(os.environ.get("OUT") or ROOT / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "code_predictor.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{result['gpu']}, torch {result['torch']}, commit {result['git_commit']}")
    print("size  B     CP eager  CP graph  CP fused graph  speedup  step graph  talker+sampling  agg xRT (GPU)")
    for size, entry in result["models"].items():
        for r in entry["rows"]:
            print(
                f"{size:5s} {r['batch']:4d} {r['cp_eager_ms']:9.2f} {r['cp_graph_ms']:9.2f}"
                f" {r['cp_graph_ms_fused']:15.2f} {r['speedup']:8.1f}"
                f" {r['step_graph_ms']:11.2f} {r['talker_and_sampling_ms']:16.2f} {r['aggregate_xrt_gpu']:13.0f}"
            )
        print(
            f"{size}: step eager B=1 {entry['step_eager_b1_ms']:.2f} ms; graph capture {entry['step_capture_s']:.2f} s"
        )
        b1 = entry["rows"][0]
        print(
            f"{size}: code predictor at batch 1: eager {b1['cp_eager_ms']:.2f} ms, graph {b1['cp_graph_ms']:.2f} ms"
            f" (x{b1['speedup_graph_only']:.1f}), graph with fused layers {b1['cp_graph_ms_fused']:.2f} ms"
            f" (x{b1['speedup']:.1f}); whole step {b1['step_graph_ms']:.2f} ms"
            f" (module layers {b1['step_graph_ms_modules']:.2f} ms)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
