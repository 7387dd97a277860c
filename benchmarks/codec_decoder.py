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
``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import torch
from code_predictor import cuda_ms, kernel_profile
from overlap_profile import CONFIGS
from provenance import git_commit
from tts_bench import out_dir

from omni_stream.models.qwen3_tts.checkpoint import write_dummy_checkpoint
from omni_stream.models.qwen3_tts.codec import load_speech_tokenizer, vocoder_kernels
from omni_stream.models.qwen3_tts.codec_graphs import CodecWindows

KEYS = ((1, 1), (1, 4), (1, 25), (32, 4), (32, 25), (128, 4), (128, 25))
FRAME_S = 0.08


class Arm(NamedTuple):
    name: str
    fused: bool  # the Triton kernels of the audio-rate stages (else the module path)
    phases: tuple[int, ...] = ()  # dilations computed over their input's phases (codec.conv_phases)
    channels_last: bool = False  # channel-major activations (runtime/layout.py)


ARMS = (
    Arm("module", False),
    Arm("triton", True),
    Arm("triton_phases_9", True, (9,)),
    Arm("triton_phases_3_9", True, (3, 9)),
    Arm("triton_channels_last", True, (), True),
    Arm("triton_channels_last_phases_9", True, (9,), True),
)


def arm(decoder, spec: Arm, reps: int) -> dict:
    kernels = vocoder_kernels("cuda")
    assert kernels is not None or not spec.fused, "the fused arms need Triton"
    if spec.fused and kernels is not None:
        decoder.use_kernels(replace(kernels, phases=frozenset(spec.phases), channels_last=spec.channels_last))
    else:
        decoder.use_kernels(None)
    pool = CodecWindows(decoder, 256, windows=sorted({n for _, n in KEYS}), max_batch=128)
    pool.batch_buckets = tuple(sorted({b for b, _ in KEYS}))
    assert pool.graphs is not None
    t0 = time.perf_counter()
    for key in sorted(KEYS, reverse=True):
        pool.graphs.capture(key)
    out: dict = {"capture_s": round(time.perf_counter() - t0, 2), "graphs": {}}
    for b, n in KEYS:
        ms = cuda_ms(lambda b=b, n=n: pool.graphs.replay((b, n)), reps)
        out["graphs"][f"{b}x{n}"] = {
            "ms": round(ms, 3),
            "us_per_stream_frame": round(1000 * ms / (b * n), 2),
            "xrt": round(b * n * FRAME_S / (ms / 1000), 1),
        }
        print(f"  {b:4d} x {n:2d} frames: {ms:8.3f} ms  {1000 * ms / (b * n):7.2f} us a stream's frame  "
              f"{b * n * FRAME_S / (ms / 1000):8.0f}x real time", flush=True)  # fmt: skip
    codes = torch.zeros(128, pool.q, 25, dtype=torch.long, device="cuda")
    slots = torch.arange(128, device="cuda")
    with torch.inference_mode():
        prof = kernel_profile(lambda: pool.pool.decode(codes, slots), reps=2)
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
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_dummy_checkpoint(CONFIGS[args.size], Path(tmp) / "ckpt", dtype=torch.bfloat16, weights=False)
        decoder = load_speech_tokenizer(ckpt, "cuda", torch.bfloat16, "dummy", with_encoder=False).decoder
    if args.shapes:
        print_shapes(decoder)
        return 0
    result: dict = {"git_commit": git_commit(), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "cudnn": torch.backends.cudnn.version(), "size": args.size, "arms": {}}  # fmt: skip
    for spec in ARMS:
        print(spec.name, flush=True)
        result["arms"][spec.name] = arm(decoder, spec, args.reps)
        torch.cuda.empty_cache()
        path = out_dir() / f"codec_decoder_{args.size}.json"
        path.write_text(json.dumps(result, indent=1))
    print("window graphs, GPU ms: " + "  ".join(spec.name for spec in ARMS))
    for b, n in KEYS:
        cells = "  ".join(f"{result['arms'][spec.name]['graphs'][f'{b}x{n}']['ms']:8.3f}" for spec in ARMS)
        print(f"  {b:4d} x {n:2d}  {cells}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
