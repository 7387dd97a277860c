"""What a streaming codec window costs on the GPU, and what each change to the decoder's kernels gives.

Run on a CUDA machine: ``python benchmarks/codec_decoder.py [--size 1.7b]``. The speech tokenizer's decoder at
its real size (bf16, random weights, ``benchmarks/configs``), in the slot-indexed pool the engine decodes with
(:class:`~omni_stream.models.qwen3_tts.codec_graphs.CodecWindows`), one CUDA graph per (batch, window). For each
arm (:data:`ARMS`: the audio-rate stages module by module; through the Triton kernels of
:mod:`omni_stream.runtime.triton_vocoder`; and with them the dilated convolutions over their input's phases,
:func:`~omni_stream.models.qwen3_tts.codec.conv_phases`, or the activations channel-major,
:mod:`omni_stream.runtime.layout`) it prints every graph's GPU time (CUDA events, median), the
cost per frame of one stream and the audio it makes per second of GPU time, and the profiler's top kernels of
one eager window of 128 x 25 frames. Writes ``codec_decoder_<size>.json`` to ``$OUT`` (or
``benchmarks/results``). ``--fastest JSON`` prints the served settings of a saved result's fastest fused arm as
shell assignments (``CODEC_ARM=... OMNI_STREAM_CODEC_PHASES=... OMNI_STREAM_CODEC_CHANNELS_LAST=...``), so one
device call can serve the winner next. ``--tiny --device cpu`` is a smoke run of every arm's set-up on the tiny
random codec (the kernels' torch twins, eager windows timed by the host clock; the suite runs it).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import torch
from code_predictor import cuda_ms, kernel_profile
from overlap_profile import CONFIGS
from provenance import git_commit
from tts_bench import out_dir

from omni_stream.models.qwen3_tts.checkpoint import write_dummy_checkpoint
from omni_stream.models.qwen3_tts.codec import (
    TORCH_VOCODER,
    CausalConv1d,
    CausalConvTranspose1d,
    load_speech_tokenizer,
    vocoder_kernels,
)
from omni_stream.models.qwen3_tts.codec_checkpoint import write_tiny_speech_tokenizer
from omni_stream.models.qwen3_tts.codec_graphs import CodecWindows
from omni_stream.runtime.layout import channels_last
from omni_stream.runtime.settings import SWITCH_BY_NAME

KEYS = ((1, 1), (1, 4), (1, 25), (32, 4), (32, 25), (128, 4), (128, 25))
SMOKE_KEYS = ((1, 1), (2, 4))
FRAME_S = 0.08


class Arm(NamedTuple):
    name: str
    fused: bool  # the Triton kernels of the audio-rate stages (else the module path)
    phases: tuple[int, ...] = ()  # dilations computed over their input's phases (codec.conv_phases)
    channels_last: bool = False  # channel-major activations (runtime/layout.py)
    copied: bool = False  # the phases copied out and back around each such convolution (not the Snakes' passes)


ARMS = (
    Arm("module", False),
    Arm("triton", True),
    Arm("triton_phases_9", True, (9,)),
    Arm("triton_phases_3_9", True, (3, 9)),
    Arm("triton_channels_last", True, (), True),
    Arm("triton_channels_last_phases_9", True, (9,), True),
    Arm("triton_channels_last_phases_3_9_copied", True, (3, 9), True, True),  # run 24's default
    Arm("triton_channels_last_phases_3_9", True, (3, 9), True),
)


def settings_of(spec: Arm) -> dict[str, str]:
    """The served settings (environment) that make the engine decode as the fused arm ``spec`` does."""
    assert spec.fused, "the module path is OMNI_STREAM_FUSED=off, not a codec setting"
    phases, layout = SWITCH_BY_NAME["codec_phases"], SWITCH_BY_NAME["codec_channels_last"]
    return {
        phases.env: phases.kind.show(frozenset(spec.phases)),
        layout.env: layout.kind.show(spec.channels_last),
    }


def fastest(result: dict, *, slack: float = 0.05) -> Arm:
    """The fused arm with the shortest largest window (128 x 25 at full size) among those that ran and are within
    ``slack`` of the plain fused arm in every other window: a setting that wins the large windows must not cost the
    first audio (1 x 1) nor the windows between (measured: channel-major dilation-3 convolutions made 32 x 4 nine
    times slower)."""
    arms = result["arms"]
    base = arms["triton"]["graphs"]
    window = max(base, key=lambda key: math.prod(int(n) for n in key.split("x")))
    ran = [s for s in ARMS if s.fused and not s.copied and "graphs" in arms.get(s.name, {})]  # served settings
    fair = [s for s in ran if all(arms[s.name]["graphs"][k]["ms"] <= g["ms"] * (1 + slack) for k, g in base.items())]
    return min(fair, key=lambda s: arms[s.name]["graphs"][window]["ms"])


def _cell(result: dict, key: str) -> str:
    return f"{result['graphs'][key]['ms']:8.3f}" if "graphs" in result else "  failed"


def host_ms(fn, reps: int) -> float:
    """Median milliseconds of ``fn`` by the host clock (CPU smoke runs), after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


def arm(decoder, spec: Arm, reps: int, keys: tuple[tuple[int, int], ...]) -> dict:
    device = next(decoder.parameters()).device
    # on the CPU (smoke runs: the arms' set-up end to end) the torch twins of the kernels, eagerly
    kernels = vocoder_kernels(device) if device.type == "cuda" else TORCH_VOCODER
    assert kernels is not None or not spec.fused, "the fused arms need Triton"
    if spec.fused and kernels is not None:
        split = None if spec.copied else kernels.snake_split
        decoder.use_kernels(
            replace(kernels, phases=frozenset(spec.phases), channels_last=spec.channels_last, snake_split=split)
        )
    else:
        decoder.use_kernels(None)
    convs = [m for m in decoder.modules() if isinstance(m, CausalConv1d | CausalConvTranspose1d)]
    out: dict = {
        "phase_convs": sum(isinstance(m, CausalConv1d) and m.phases for m in convs),
        "channels_last_weights": sum(channels_last(m.conv.weight) for m in convs),
        "graphs": {},
    }
    most = max(b for b, _ in keys)
    pool = CodecWindows(decoder, 256, windows=sorted({n for _, n in keys}), max_batch=most)
    codes = torch.zeros(most, pool.q, max(n for _, n in keys), dtype=torch.long, device=device)
    slots = torch.arange(most, device=device)
    if pool.graphs is not None:
        pool.batch_buckets = tuple(sorted({b for b, _ in keys}))
        t0 = time.perf_counter()
        for key in sorted(keys, reverse=True):
            pool.graphs.capture(key)
        out["capture_s"] = round(time.perf_counter() - t0, 2)
    for b, n in keys:
        if pool.graphs is not None:
            ms = cuda_ms(lambda b=b, n=n: pool.graphs.replay((b, n)), reps)
        else:
            with torch.inference_mode():
                ms = host_ms(lambda b=b, n=n: pool.pool.decode(codes[:b, :, :n], slots[:b]), reps)
        out["graphs"][f"{b}x{n}"] = {
            "ms": round(ms, 3),
            "us_per_stream_frame": round(1000 * ms / (b * n), 2),
            "xrt": round(b * n * FRAME_S / (ms / 1000), 1),
        }
        print(f"  {b:4d} x {n:2d} frames: {ms:8.3f} ms  {1000 * ms / (b * n):7.2f} us a stream's frame  "
              f"{b * n * FRAME_S / (ms / 1000):8.0f}x real time", flush=True)  # fmt: skip
    if device.type != "cuda":
        return out
    with torch.inference_mode():
        prof = kernel_profile(lambda: pool.pool.decode(codes[:128, :, :25], slots[:128]), reps=2)
    out["eager_128x25_profile"] = prof
    total = prof["total"]
    print(f"  eager 128 x 25: {total['kernels']:.0f} kernels, {total['busy_ms']:.1f} ms busy", flush=True)
    for row in prof["top"][:8]:
        print(f"    {row['ms']:8.2f} ms  {row['count']:6.0f}x  {row['kernel']}", flush=True)
    return out


def print_shapes(decoder) -> None:
    """The profiler's operators of one eager fused window of 128 x 25 frames, by input shape (which convolution
    a slow kernel belongs to)."""
    from torch.profiler import ProfilerActivity, profile

    codes = torch.zeros(128, decoder.cfg.num_quantizers, 25, dtype=torch.long, device="cuda")
    with torch.inference_mode():
        decoder(codes)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            decoder(codes)
            torch.cuda.synchronize()
    table = prof.key_averages(group_by_input_shape=True).table(sort_by="cuda_time_total", row_limit=14)
    print(table, flush=True)
    (out_dir() / "codec_decoder_shapes.txt").write_text(table)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(CONFIGS), default="1.7b")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--shapes", action="store_true", help="only the operators of one fused window, by input shape")
    ap.add_argument("--tiny", action="store_true", help="the tiny random codec and two small windows (smoke runs)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run with --tiny")
    ap.add_argument("--arms", default=",".join(s.name for s in ARMS), help="comma-separated arms (default: all)")
    ap.add_argument("--fastest", type=Path, metavar="JSON",
                    help="print, as shell assignments, the settings of the fastest arm in a saved result")  # fmt: skip
    args = ap.parse_args()
    if args.fastest:
        spec = fastest(json.loads(args.fastest.read_text()))
        print(" ".join(f"{k}={v}" for k, v in {"CODEC_ARM": spec.name, **settings_of(spec)}.items()))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA device (or --tiny --device cpu for a smoke run)")
        return 2
    size = "tiny" if args.tiny else args.size
    keys = SMOKE_KEYS if args.tiny else KEYS
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    with tempfile.TemporaryDirectory() as tmp:
        if args.tiny:
            ckpt = Path(tmp) / "ckpt"
            write_tiny_speech_tokenizer(ckpt, seed=0)
            decoder = load_speech_tokenizer(ckpt, args.device, dtype, with_encoder=False).decoder
        else:
            ckpt = write_dummy_checkpoint(CONFIGS[args.size], Path(tmp) / "ckpt", dtype=dtype, weights=False)
            decoder = load_speech_tokenizer(ckpt, args.device, dtype, "dummy", with_encoder=False).decoder
    if args.shapes:
        print_shapes(decoder)
        return 0
    cuda = args.device == "cuda"
    result: dict = {"git_commit": git_commit(), "gpu": torch.cuda.get_device_name() if cuda else "cpu",
                    "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "size": size,
                    "arms": {}}  # fmt: skip
    path = out_dir() / f"codec_decoder_{size}.json"
    names = args.arms.split(",")
    unknown = set(names) - {s.name for s in ARMS}
    if unknown:
        ap.error(f"unknown arms: {', '.join(sorted(unknown))}")
    specs = [s for s in ARMS if s.name in names]
    for spec in specs:
        print(spec.name, flush=True)
        try:
            result["arms"][spec.name] = arm(decoder, spec, args.reps, keys)
        except Exception as exc:  # one arm's failure (a kernel that does not compile) must not hide the others
            traceback.print_exc()
            result["arms"][spec.name] = {"error": f"{type(exc).__name__}: {exc}"}
        if cuda:
            torch.cuda.empty_cache()
        path.write_text(json.dumps(result, indent=1))
    print("window " + ("graphs, GPU" if cuda else "eager, host") + " ms: " + "  ".join(s.name for s in specs))
    for b, n in keys:
        cells = "  ".join(_cell(result["arms"][spec.name], f"{b}x{n}") for spec in specs)
        print(f"  {b:4d} x {n:2d}  {cells}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
