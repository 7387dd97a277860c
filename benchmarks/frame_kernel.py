"""The code predictor's one-row frame: the persistent kernel against the loop of ~850 kernels, on one GPU.

``python benchmarks/frame_kernel.py [--size 1.7b] [--programs 128] [--warps 4,8] [--spin 0,200] [--slices 4096]``.
Real-size dummy weights from ``benchmarks/configs``. First, in fp32, the kernel's codes against the fused loop's
(greedy and sampled, ``--trials`` frames each; the counts that differ are printed, the GPU suite asserts none).
Then, in bf16, the frame's CUDA-graph replay time (CUDA events, median of ``--reps``) for the loop and for each
kernel variant (grid size, warps a program, the barrier's poll back-off, the reduction slice). Writes
``frame_kernel.json`` to ``$OUT`` (or ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
from code_predictor import CONFIGS, cuda_ms
from provenance import git_commit

from omni_stream.models.qwen3_tts.checkpoint import load_lm, write_dummy_checkpoint
from omni_stream.models.qwen3_tts.predictor_kernel import PredictorKernel
from omni_stream.requests import SamplingParams
from omni_stream.runtime.cuda_graphs import GraphSet
from omni_stream.runtime.decoder_kernels import triton_kernels
from omni_stream.runtime.sampling import SamplingTensors
from omni_stream.runtime.settings import Tuning

ROOT = Path(__file__).resolve().parent
KINDS = {
    "greedy": SamplingParams(do_sample=False),
    "top-k 50": SamplingParams(do_sample=True, top_k=50, temperature=0.9),
}


def _load(size: str, dtype: torch.dtype, tmp: str):
    ckpt = write_dummy_checkpoint(CONFIGS[size], Path(tmp) / str(dtype), dtype=dtype, weights=False)
    lm = load_lm(ckpt, load_format="dummy", dtype=dtype, device="cuda")
    cp = lm.talker.code_predictor
    cp.use_kernels(triton_kernels(replace(Tuning.from_env(), predictor_kernel=False)))
    return lm, cp


def agreement(size: str, trials: int, tmp: str) -> dict:
    lm, cp = _load(size, torch.float32, tmp)
    frame = PredictorKernel(cp)
    h = lm.config.talker.decoder.hidden_size
    gen = torch.Generator(device="cuda").manual_seed(0)
    out = {}
    with torch.no_grad():
        for name, p in KINDS.items():
            params = SamplingTensors.from_params([p], "cuda")
            frames = codes = 0
            for _ in range(trials):
                hidden = torch.randn(1, h, device="cuda", generator=gen)
                c0 = torch.randn(1, h, device="cuda", generator=gen)
                noise = torch.empty(1, 15, 2048, device="cuda").exponential_(generator=gen) if p.do_sample else None
                got, want = frame(hidden, c0, params, noise), cp.generate(hidden, c0, params, noise)
                frames += int(not torch.equal(got, want))
                codes += int((got != want).sum())
            out[name] = {"frames": trials, "frames_differing": frames, "codes_differing": codes}
            print(f"  fp32 {name}: {frames} of {trials} frames differ ({codes} codes)", flush=True)
    del lm, cp, frame
    torch.cuda.empty_cache()
    return out


def timing(
    size: str, warps: list[int], spins: list[int], programs: list[int], slices: list[int], reps: int, tmp: str
) -> list[dict]:
    lm, cp = _load(size, torch.bfloat16, tmp)
    h = lm.config.talker.decoder.hidden_size
    hidden = torch.randn(1, h, device="cuda", dtype=torch.bfloat16)
    c0 = torch.randn(1, h, device="cuda", dtype=torch.bfloat16)
    params = SamplingTensors.from_params([KINDS["top-k 50"]], "cuda")
    noise = torch.empty(1, 15, 2048, device="cuda").exponential_()
    arms: list[tuple[str, PredictorKernel | None]] = [("loop", None)]
    for n in programs:
        for w in warps:
            arms += [
                (f"kernel programs={n} warps={w} spin={s}ns k={k}", PredictorKernel(cp, n, w, s, k))
                for s in spins
                for k in slices
            ]
    rows = []
    with torch.no_grad():
        for name, frame in arms:
            cp.frame = frame
            graphs = GraphSet(lambda: cp.generate(hidden, c0, params, noise), torch.device("cuda"))
            graphs.capture(())
            ms = cuda_ms(lambda graphs=graphs: graphs.replay(()), reps)
            rows.append({"arm": name, "graph_ms": ms})
            print(f"  bf16 {name}: {ms:.3f} ms", flush=True)
    cp.frame = None
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1.7b")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--spin", default="0,200")
    ap.add_argument("--programs", default="128", help="grid sizes (programs) of the kernel")
    ap.add_argument("--slices", default="4096", help="reduction slices (elements of a weight row a load takes)")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 2
    result: dict = {"git_commit": git_commit(), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        if args.trials:
            result["fp32_agreement"] = agreement(args.size, args.trials, tmp)

        def ints(text: str) -> list[int]:
            return [int(x) for x in text.split(",")]

        arms = (ints(args.warps), ints(args.spin), ints(args.programs), ints(args.slices))
        result["bf16_graph"] = timing(args.size, *arms, args.reps, tmp)
    out_dir = Path(os.environ.get("OUT") or ROOT / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "frame_kernel.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
