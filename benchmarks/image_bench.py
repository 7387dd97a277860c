"""Image edit with streamed AR text: time to the first AR delta, the first preview and the final image, at c = 1..16.

Run (CPU, tiny models, ~1 min):   ``OMP_NUM_THREADS=1 python benchmarks/image_bench.py``
Run (GPU, real sizes, < 90 s):    ``python benchmarks/image_bench.py --device cuda``
Also: ``--model qwen-image-edit`` (GPU only: 20B + 8B parameters, ~60 GB in bf16), ``--smoke`` (tests), ``--llm DIR``.

What runs: the engine in process (no HTTP), the ``image`` pipeline: a text model rewrites the instruction (its
deltas stream), then the diffusion stage edits a 512 px (GPU) or 64 px (CPU) image with ``--partial-images``
previews. CPU: InstructPix2Pix-tiny (random weights, the embedded default's sizes). GPU: random weights at the
published sizes of ``benchmarks/configs/<model>`` (``load_format="dummy"``). The text model is the tests' synthetic
one (``tests/synthetic``: it echoes the prompt, one word per step; ``--lm-step-ms`` emulates device time per token)
unless ``--llm`` names a real text checkpoint. At each concurrency ``c``, ``c`` requests start together,
``--rounds`` times; requests of one size share each model call (one denoising step or the VAE decode; ``calls``).
Times are from the request's start, in ms: p50 and max over requests. Each level also says where its time went:
the device time of the batched calls (``device_ms``: CUDA events around each denoiser call and VAE decode) and the
device worker thread's split (``worker_s``: the requests' starts, the calls, the requests' own work between calls,
idle), so the wall time that no model call explains is named.

Writes ``benchmarks/results/image_bench_<device>_<model>.json`` (and under ``$OUT`` when set).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import gc
import json
import os
import platform
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch
from provenance import git_commit

from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.family import ModelKind
from omni_stream.images.spec import ImageRequest
from omni_stream.metrics import percentile

ROOT = Path(__file__).resolve().parent
PROMPT = "make the sky look like a snowy winter evening with warm street lights"


def ms(seconds: float) -> float:
    return round(seconds * 1000.0, 1)


async def one(engine: AsyncEngine, request: ImageRequest) -> dict[str, float]:
    start = time.perf_counter()
    marks: dict[str, float] = {}
    async with engine.generate(request) as stream:
        async for out in stream:
            now = time.perf_counter() - start
            if out.stage == "text" and out.chunk.text:
                marks.setdefault("first_text", now)
                marks["last_text"] = now  # the rewrite's end: the image stage starts after its last delta
            elif out.stage == "image" and out.chunk.partial:
                marks.setdefault("first_preview", now)
            elif out.stage == "image":
                marks["final"] = now
    return marks


def summary(samples: list[dict[str, float]], key: str) -> dict[str, float | None]:
    values = [s[key] for s in samples if key in s]
    if not values:
        return {"p50_ms": None, "max_ms": None}
    return {"p50_ms": ms(percentile(values, 50)), "max_ms": ms(max(values))}


class CallClock:
    """The device time of the image model's batched calls (prompt and input encodings, the denoiser, the VAE
    decode): each original call is
    bracketed by CUDA events (no synchronization; read at the level's end), or timed on the wall clock on a CPU,
    where calls run synchronously. Set on the family's :class:`~omni_stream.runtime.stepwise.StepwiseModel`, whose
    interceptors call these originals with the requests' rows stacked."""

    def __init__(self, model: Any, cuda: bool) -> None:
        self.cuda = cuda
        self.pending: list[tuple[str, Any, Any]] = []
        for index, spec in enumerate(model.intercepts):
            model._originals[index] = self._wrap(spec.name, model._originals[index])

    def _wrap(self, name: str, original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = original(*args, **kwargs)
                end.record()
                self.pending.append((name, start, end))
                return out
            t = time.perf_counter()
            out = original(*args, **kwargs)
            self.pending.append((name, t, time.perf_counter()))
            return out

        return call

    def take(self) -> dict[str, dict[str, float]]:
        """Device ms per call kind since the last take: count, total, mean."""
        if self.cuda:
            torch.cuda.synchronize()
        totals: dict[str, list[float]] = {}
        for name, start, end in self.pending:
            ms_ = start.elapsed_time(end) if self.cuda else (end - start) * 1e3
            totals.setdefault(name, []).append(ms_)
        self.pending = []
        return {k: {"calls": len(v), "total_ms": round(sum(v), 1), "mean_ms": round(sum(v) / len(v), 2)}
                for k, v in totals.items()}  # fmt: skip


TIMELINE_KINDS = ("join", "text", "encode", "denoise", "decode", "done")


def timeline(engine: AsyncEngine, start: float, end: float) -> list[str]:
    """What the worker ran for the image model (and its text model's steps) from ``start`` to ``end``: each piece
    as ``kind xN +first..+last`` (ms after ``start``, consecutive pieces of one kind merged), so the order of the
    requests' starts and the batched calls before the last first preview can be read."""
    out: list[tuple[str, int, float, float]] = []
    for record in list(engine.worker.log):
        if not start <= record.at <= end:
            continue
        if record.kind in TIMELINE_KINDS:
            label = record.kind
        elif record.kind == "step" and record.name != "image":
            label = f"step:{record.name}"
        else:
            continue
        at = (record.at - start) * 1e3
        if out and out[-1][0] == label:
            out[-1] = (label, out[-1][1] + 1, out[-1][2], at)
        else:
            out.append((label, 1, at, at))
    return [f"{k} x{n} +{a:.0f}" if n == 1 else f"{k} x{n} +{a:.0f}..+{b:.0f}" for k, n, a, b in out]


class SyncPoints:
    """Where the device worker's thread waited for the GPU in a block: CUDA's sync debug mode warns at each call that
    synchronizes (a blocking copy, ``.item()``, ``.cpu()``), and each is counted by the three innermost calling
    lines outside torch (in any thread: the worker's greenlets included). The warnings cost a few µs each, so the
    block's own timings carry them."""

    def __init__(self, cuda: bool = True) -> None:
        self.cuda = cuda  # False: count only what is warned by hand (tests)

    def __enter__(self) -> SyncPoints:
        self.counts: Counter[str] = Counter()
        self._show, self._filters = warnings.showwarning, list(warnings.filters)

        def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
            if "synchroniz" not in str(message):
                self._show(message, category, filename, lineno, file, line)
                return
            frames = [f for f in traceback.extract_stack()[:-1] if "/torch/" not in f.filename
                      and not f.filename.endswith(("warnings.py", "image_bench.py"))]  # fmt: skip
            self.counts[" < ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames[::-1][:3])] += 1

        warnings.showwarning = show
        warnings.simplefilter("always", UserWarning)
        if self.cuda:
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = self._show
        warnings.filters[:] = self._filters

    def top(self, n: int = 12) -> list[dict[str, Any]]:
        return [{"where": where, "count": count} for where, count in self.counts.most_common(n)]


def worker_split(engine: AsyncEngine, start: float, end: float) -> dict[str, Any]:
    """Where the device worker's thread spent a level (its log: ``work_profile``): the requests' starts (``join``,
    then their batched ``text`` and ``encode`` calls), the batched calls (``denoise``, ``decode``: launching them,
    and on a CPU running them), the requests' own work between calls (``requests``: their schedulers, guidance,
    previews; on a GPU also the wait for the call's kernels at their first synchronization), idle."""
    from omni_stream.runtime.work_profile import work_profile

    profile = work_profile(list(engine.worker.log), start, end).summary()
    return {"busy_fraction": profile["busy_fraction"], "seconds": profile["seconds"], "counts": profile["counts"]}


async def level(
    engine: AsyncEngine, c: int, rounds: int, args: argparse.Namespace, image: np.ndarray, clock: CallClock
) -> dict:
    samples: list[dict[str, float]] = []
    family = engine.models.get(ModelKind.IMAGE)
    calls = family.runner.model.calls
    clock.take()
    t0 = time.perf_counter()
    first_round: list[str] = []
    sync_points: dict[str, Any] | None = None
    for r in range(rounds):
        round_start = time.perf_counter()
        requests = [
            ImageRequest(
                PROMPT,
                images=(image,),
                size=(args.size, args.size),
                steps=args.steps,
                partial_images=args.partial_images,
                seed=r * c + k,
            )
            for k in range(c)
        ]
        probe = args.sync_debug and r == 0 and c == max(args.levels)
        with SyncPoints() if probe else contextlib.nullcontext() as syncs:
            round_samples = await asyncio.gather(*(one(engine, req) for req in requests))
        if isinstance(syncs, SyncPoints):
            sync_points = {"total": sum(syncs.counts.values()), "top": syncs.top()}
        samples += round_samples
        if r == 0:  # until the round's last first preview (pieces started by then)
            previews = [m["first_preview"] for m in round_samples if "first_preview" in m]
            first_round = timeline(engine, round_start, round_start + max(previews, default=0.0))
    wall = time.perf_counter() - t0
    device = clock.take()
    return {
        "concurrency": c,
        "requests": len(samples),
        "first_ar_delta": summary(samples, "first_text"),
        "rewrite_done": summary(samples, "last_text"),
        "first_preview": summary(samples, "first_preview"),
        "final_image": summary(samples, "final"),
        "images_per_s": round(len(samples) / wall, 3),
        "model_calls": family.runner.model.calls - calls,
        "wall_s": round(wall, 3),
        "device_ms": device,
        "worker_s": worker_split(engine, t0, t0 + wall),
        "first_round": first_round,
        **({"sync_points": sync_points} if sync_points is not None else {}),
    }


def image_source(args: argparse.Namespace, tmp: Path) -> ModelSource:
    if args.device == "cpu" and args.model == "tiny":
        from omni_stream.models.diffusers_image.checkpoint import write_tiny_checkpoint

        return ModelSource(write_tiny_checkpoint(tmp / "pix2pix-tiny", "image-edit"))
    return ModelSource(ROOT / "configs" / args.model)


async def main(args: argparse.Namespace) -> dict:
    sys.path.insert(0, str(ROOT.parent / "tests"))  # the synthetic echo LM lives with the tests
    import synthetic
    from synthetic.lm_family import write_lm_checkpoint

    synthetic.register()

    with tempfile.TemporaryDirectory() as tmp:
        llm = args.llm or write_lm_checkpoint(Path(tmp) / "lm", step_cost_ms=args.lm_step_ms, reply_prefix="Picture:")
        sources = {"image": image_source(args, Path(tmp)), "llm": ModelSource(Path(llm))}
        t = time.perf_counter()
        load_format = "auto" if args.model == "tiny" else "dummy"
        engine = await AsyncEngine.load(
            sources, device=args.device, load_format=load_format, progress=False, record=True
        )
        load_s = time.perf_counter() - t
        clock = CallClock(engine.models.get(ModelKind.IMAGE).runner.model, args.device.startswith("cuda"))
        gc.freeze()  # as the server does after loading (realtime/app.py): no full collections of the models' objects
        async with engine:
            rng = np.random.default_rng(0)
            image = rng.integers(0, 256, (args.size, args.size, 3), dtype=np.uint8)
            await level(engine, 1, 1, args, image, clock)  # warm-up (allocator, kernels)
            levels = [await level(engine, c, args.rounds, args, image, clock) for c in args.levels]
            info = engine.models.get(ModelKind.IMAGE).info
    return {
        "benchmark": "image_bench",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor(),
        "torch_threads": torch.get_num_threads(),
        "model": info.model_name if args.model == "tiny" else args.model,
        "weights": "tiny random" if args.model == "tiny" else "dummy (random, published sizes)",
        "preview": info.preview,
        "text_model": str(args.llm) if args.llm else f"synthetic echo, {args.lm_step_ms} ms/token",
        "size_px": args.size,
        "steps": args.steps,
        "partial_images": args.partial_images,
        "load_s": round(load_s, 2),
        "levels": levels,
    }


def table(result: dict) -> str:
    rows = [
        f"image_bench {result['device']} {result['model']} {result['size_px']}px {result['steps']} steps, "
        f"{result['partial_images']} previews, text: {result['text_model']}",
        f"{'c':>3} {'first AR delta':>18} {'first preview':>18} {'final image':>18} {'img/s':>7} {'calls':>5}",
    ]

    def cell(lv: dict, key: str) -> str:
        s = lv[key]
        return "-" if s["p50_ms"] is None else f"{s['p50_ms']:.0f} / {s['max_ms']:.0f}"

    for lv in result["levels"]:
        rows.append(
            f"{lv['concurrency']:>3} {cell(lv, 'first_ar_delta'):>18} {cell(lv, 'first_preview'):>18}"
            f" {cell(lv, 'final_image'):>18} {lv['images_per_s']:>7.2f} {lv['model_calls']:>5}"
        )
    rows.append("(ms from request start, p50 / max)")
    for lv in result["levels"]:
        if "sync_points" in lv:
            syncs = lv["sync_points"]
            rows.append(f"c={lv['concurrency']}, first round: {syncs['total']} synchronizing calls; by caller:")
            rows += [f"  {s['count']:>5} {s['where']}" for s in syncs["top"]]
    for lv in result["levels"]:
        device = ", ".join(f"{k} {v['calls']} x {v['mean_ms']:.1f} ms" for k, v in lv["device_ms"].items())
        worker = lv["worker_s"]
        shares = ", ".join(f"{k} {1000 * v:.0f}" for k, v in list(worker["seconds"].items())[:6])
        rows.append(f"c={lv['concurrency']}: wall {1000 * lv['wall_s']:.0f} ms; device: {device}; worker thread "
                    f"(ms, busy {100 * worker['busy_fraction']:.0f}%): {shares}")  # fmt: skip
        done = lv["rewrite_done"]
        if done["p50_ms"] is not None:
            rows.append(f"  rewrites done p50 / max {done['p50_ms']:.0f} / {done['max_ms']:.0f} ms; the first round "
                        f"until its last first preview: {', '.join(lv['first_round'])}")  # fmt: skip
    return "\n".join(rows)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default=None, help="tiny (CPU default) or a folder of benchmarks/configs")
    parser.add_argument("--levels", default="1,4,16", help="concurrency levels (default 1,4,16)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per level (default 2)")
    parser.add_argument("--steps", type=int, default=None, help="denoising steps (CPU 4, GPU 20)")
    parser.add_argument("--size", type=int, default=None, help="image side in px (CPU 64, GPU 512)")
    parser.add_argument("--partial-images", type=int, default=2)
    parser.add_argument("--llm", type=Path, default=None, help="a text checkpoint (default: the synthetic echo)")
    parser.add_argument("--lm-step-ms", type=float, default=0.0, help="synthetic text model: ms per token")
    parser.add_argument("--smoke", action="store_true", help="c = 1, 2; one round; 3 steps (tests)")
    sync_help = "CUDA: count the calls that wait for the GPU in the largest level's first round"
    parser.add_argument("--sync-debug", action="store_true", help=sync_help)
    args = parser.parse_args(argv)
    gpu = args.device.startswith("cuda")
    args.model = args.model or ("instruct-pix2pix" if gpu else "tiny")
    args.steps = args.steps or (20 if gpu else 4)
    args.size = args.size or (512 if gpu else 64)
    args.levels = [int(c) for c in args.levels.split(",")]
    if args.sync_debug and not gpu:
        parser.error("--sync-debug needs --device cuda")
    if args.smoke:
        args.levels, args.rounds, args.steps = [1, 2], 1, 3
    return args


if __name__ == "__main__":
    args = parse(sys.argv[1:])
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    result = asyncio.run(main(args))
    print(table(result))
    name = f"image_bench_{'cuda' if args.device.startswith('cuda') else 'cpu'}_{result['model']}"
    name += "_smoke" if args.smoke else ""
    targets = [Path(os.environ["OUT"])] if os.environ.get("OUT") else []
    if not args.smoke:
        targets.append(ROOT / "results")
    for folder in targets:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {folder / name}.json")
