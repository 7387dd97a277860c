"""What a cheaper image denoiser call is worth: InstructPix2Pix's UNet (and its VAE) timed under each lever.

The image family's throughput at c = 16 is one UNet call a step over 48 rows (16 requests, three guidance branches
each); this measures that call, and the 3-row call of one request, as loaded by the family
(``components.load_pipeline``: random weights at the published sizes, bf16) and then under each lever:

- ``cudnn_benchmark``: cuDNN times its convolution algorithms for each new shape and keeps the fastest
  (``torch.backends.cudnn.benchmark``; the family leaves it off);
- ``sdpa:<backend>``: the attention kernel (flash, efficient, cudnn) instead of PyTorch's pick;
- ``channels_last``: the convolutions' activations in NHWC (cuDNN's faster layout on Hopper);
- ``fused_qkv``: one projection for q, k and v in the self-attention layers (diffusers' ``fuse_qkv_projections``);
- ``compile``: ``torch.compile`` of the UNet after the two above (default mode, a graph per batch size), with the
  time its first call took;
- ``compile_dynamic``: the same with the batch size symbolic (``dynamic=True``): one graph for every row count the
  step batching meets, so the price is one compile, not one per batch size (``--rows`` lists the counts it is
  timed at; the first call of each says whether it compiled again).

``--levers`` picks some of them (``loaded`` is always measured: the reference each lever's output is compared with);
``profile`` adds where the as-loaded call's device time goes at the most rows, by kind of kernel (convolution,
matmul, attention, normalization, elementwise) and its longest kernels (``torch.profiler``): what a compiler could
fuse away is the normalization and elementwise share.

Each call's median over ``--iters`` (CUDA events), its TFLOP/s (``torch.utils.flop_counter`` on one row), and the
largest difference of its output from the family's (a lever must keep the picture). The VAE's encode and decode of
16 images at 512 px, as loaded and in NHWC, close the table.

Run on a GPU: ``python benchmarks/unet_levers.py`` (about three minutes: 184 s on an H100, most of it
compiling); ``--smoke`` runs the tiny checkpoint on a CPU (tests). Writes ``unet_levers_<model>.json`` under
``$OUT`` (else ``benchmarks/results``; ``--smoke``: the temporary directory).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from provenance import git_commit

from omni_stream.family import LoadOptions
from omni_stream.models.diffusers_image.components import load_pipeline

ROOT = Path(__file__).resolve().parent


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(call: Callable[[], Any], iters: int, device: str, warm: int = 3) -> float:
    """Median ms of ``call`` on the device (CUDA events; the wall clock on a CPU), after ``warm`` calls."""
    for _ in range(warm):
        call()
    sync(device)
    times = []
    for _ in range(iters):
        if device != "cuda":
            start_s = time.perf_counter()
            call()
            times.append((time.perf_counter() - start_s) * 1e3)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def unet_inputs(unet: Any, rows: int, dtype: torch.dtype, device: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device).manual_seed(seed)
    size, width = unet.config.sample_size, unet.config.cross_attention_dim
    sample = torch.randn(rows, unet.config.in_channels, size, size, generator=gen, device=device, dtype=dtype)
    text = torch.randn(rows, 77, width, generator=gen, device=device, dtype=dtype)
    return sample, torch.full((rows,), 500, device=device), text


def gflop_per_row(unet: Any, dtype: torch.dtype, device: str) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    sample, t, text = unet_inputs(unet, 1, dtype, device)
    with FlopCounterMode(display=False) as counter, torch.inference_mode():
        unet(sample, t, encoder_hidden_states=text, return_dict=False)
    return counter.get_total_flops() / 1e9


@contextlib.contextmanager
def sdpa(backend: str | None) -> Iterator[None]:
    if backend is None:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
              "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]  # fmt: skip
    with sdpa_kernel([chosen]):
        yield


KERNEL_KINDS = (  # (kind, words in a kernel's or op's name), first match wins; lower case
    ("attention", ("flash", "fmha", "attention", "attn")),
    ("convolution", ("conv", "fprop", "dgrad", "implicit_gemm", "winograd")),
    ("normalization", ("norm", "moments")),
    ("matmul", ("gemm", "nvjet", "cutlass", "matmul", "addmm", "mm", "linear")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "reduce", "copy", "cat", "silu", "gelu", "add", "mul")),
)


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, words in KERNEL_KINDS if any(w in low for w in words)), "other")


def kernel_profile(model: Any, inputs: tuple[torch.Tensor, ...], device: str, top: int = 12) -> dict[str, Any]:
    """One call's device time by kind of kernel and its longest kernels (CPU: the ops' own time)."""
    from torch.profiler import ProfilerActivity, profile

    sample, t, text = inputs
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.inference_mode():
        model(sample, t, encoder_hidden_states=text, return_dict=False)  # warm: the profile holds no first-call work
        sync(device)
        with profile(activities=activities) as prof:
            model(sample, t, encoder_hidden_states=text, return_dict=False)
            sync(device)
    own: dict[str, float] = {}
    for evt in prof.key_averages():
        us = evt.self_device_time_total if device == "cuda" else evt.self_cpu_time_total
        if us > 0 and (device != "cuda" or evt.device_type == torch.autograd.DeviceType.CUDA):
            own[evt.key] = own.get(evt.key, 0.0) + us
    total = sum(own.values()) or 1.0
    kinds: dict[str, float] = {}
    for name, us in own.items():
        kinds[kernel_kind(name)] = kinds.get(kernel_kind(name), 0.0) + us
    longest = sorted(own.items(), key=lambda kv: -kv[1])[:top]
    return {
        "total_ms": round(total / 1e3, 2),
        "by_kind_ms": {k: round(v / 1e3, 2) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
        "by_kind_share": {k: round(v / total, 3) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
        "longest": [{"name": name[:120], "kind": kernel_kind(name), "ms": round(us / 1e3, 2)} for name, us in longest],
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="instruct-pix2pix", help="a folder of benchmarks/configs, or tiny (--smoke)")
    ap.add_argument("--rows", default="3,48", help="UNet rows a call (3: one request; 48: sixteen)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--vae-images", type=int, default=16)
    ap.add_argument("--no-compile", action="store_true")
    levers_help = "of profile, cudnn_benchmark, sdpa, channels_last, fused_qkv, compile, compile_dynamic"
    ap.add_argument("--levers", default="sdpa,channels_last,fused_qkv,compile", help=levers_help)
    ap.add_argument("--smoke", action="store_true", help="CPU, the tiny checkpoint, no compile (tests)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.model, args.rows, args.iters, args.vae_images, args.no_compile = "tiny", "1,3", 2, 2, True
    device = "cuda" if not args.smoke else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("unet_levers: needs a CUDA device (--smoke runs the tiny checkpoint on a CPU)")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with tempfile.TemporaryDirectory() as tmp:
        if args.model == "tiny":
            from omni_stream.models.diffusers_image.checkpoint import write_tiny_checkpoint

            folder = write_tiny_checkpoint(Path(tmp) / "pix2pix-tiny", "image-edit")
        else:
            folder = ROOT / "configs" / args.model
        load = "auto" if args.model == "tiny" else "dummy"
        pipe = load_pipeline(folder, LoadOptions(device=device, load_format=load, progress=False), dtype)
    unet, vae = pipe.unet, pipe.vae
    rows = [int(r) for r in args.rows.split(",")]
    per_row = gflop_per_row(unet, dtype, device)
    inputs = {r: unet_inputs(unet, r, dtype, device) for r in rows}
    reference: dict[int, torch.Tensor] = {}
    results: list[dict[str, Any]] = []

    def measure(label: str, model: Any, backend: str | None = None, layout: Any = None) -> None:
        row: dict[str, Any] = {"lever": label}
        for r in rows:
            sample, t, text = inputs[r]
            if layout is not None:
                sample = sample.contiguous(memory_format=layout)

            def call(model: Any = model, sample: torch.Tensor = sample, t: torch.Tensor = t, text: Any = text) -> Any:
                with torch.inference_mode(), sdpa(backend):
                    return model(sample, t, encoder_hidden_states=text, return_dict=False)[0]

            try:
                first = time.perf_counter()
                out = call()
                sync(device)
                first_ms = (time.perf_counter() - first) * 1e3
                ms = timed(call, args.iters, device)
            except Exception as exc:  # a backend that does not take these shapes: say so, go on
                row[f"rows{r}"] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                continue
            if r not in reference:
                reference[r] = out.float()
            diff = (out.float() - reference[r]).abs().max().item()
            row[f"rows{r}"] = {"ms": round(ms, 2), "ms_per_row": round(ms / r, 3),
                               "tflops": round(per_row * r / ms, 3), "first_call_ms": round(first_ms, 1),
                               "max_abs_diff": round(diff, 4)}  # fmt: skip
        results.append(row)
        print(json.dumps(row), flush=True)

    levers = set(args.levers.split(","))
    known = {"profile", "cudnn_benchmark", "sdpa", "channels_last", "fused_qkv", "compile", "compile_dynamic"}
    if levers - known:
        raise SystemExit(f"unet_levers: unknown levers {sorted(levers - known)}")
    measure("as loaded", unet)
    profile = kernel_profile(unet, inputs[max(rows)], device) if "profile" in levers else None
    if profile is not None:
        print(json.dumps({"profile_rows": max(rows), **profile}), flush=True)
    if "cudnn_benchmark" in levers:
        was = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = True
        try:
            measure("cudnn_benchmark", unet)
        finally:
            torch.backends.cudnn.benchmark = was
    for backend in ("flash", "efficient", "cudnn") if device == "cuda" and "sdpa" in levers else ():
        measure(f"sdpa:{backend}", unet, backend=backend)
    # NHWC and the fused projection change the module in place, so the compiled arms always have them
    unet.to(memory_format=torch.channels_last)
    if "channels_last" in levers:
        measure("channels_last", unet, layout=torch.channels_last)
    unet.fuse_qkv_projections()
    if "fused_qkv" in levers:
        measure("channels_last+fused_qkv", unet, layout=torch.channels_last)
    for lever, dynamic in (("compile", False), ("compile_dynamic", True)):
        if args.no_compile or lever not in levers:
            continue
        torch._dynamo.reset()  # each arm compiles from nothing: its first calls carry its whole price
        compiled = torch.compile(unet, dynamic=dynamic)
        measure(f"channels_last+fused_qkv+{lever}", compiled, layout=torch.channels_last)

    vae_rows: dict[str, Any] = {}
    gen = torch.Generator(device).manual_seed(1)
    side, n = unet.config.sample_size, args.vae_images
    scale = 2 ** (len(vae.config.block_out_channels) - 1)
    pixels = torch.randn(n, 3, side * scale, side * scale, generator=gen, device=device, dtype=dtype)
    latents = torch.randn(n, vae.config.latent_channels, side, side, generator=gen, device=device, dtype=dtype)
    for label, layout in (("as loaded", None), ("channels_last", torch.channels_last)):
        if layout is not None:
            vae.to(memory_format=layout)
            pixels, latents = pixels.contiguous(memory_format=layout), latents.contiguous(memory_format=layout)

        def encode(p: torch.Tensor = pixels) -> Any:
            with torch.inference_mode():
                return vae.encode(p).latent_dist.mode()

        def decode(z: torch.Tensor = latents) -> Any:
            with torch.inference_mode():
                return vae.decode(z, return_dict=False)[0]

        vae_rows[label] = {"encode_ms": round(timed(encode, args.iters, device), 1),
                           "decode_ms": round(timed(decode, args.iters, device), 1)}  # fmt: skip
        print(json.dumps({"vae": label, **vae_rows[label]}), flush=True)

    result = {
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "model": args.model,
        "gflop_per_row": round(per_row, 3),
        "unet": results,
        "profile": None if profile is None else {"rows": max(rows), **profile},
        "vae": {"images": n, "side_px": side * scale, "by_layout": vae_rows},
    }
    out = Path(os.environ.get("OUT") or (tempfile.gettempdir() if args.smoke else ROOT / "results"))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"unet_levers_{args.model}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
