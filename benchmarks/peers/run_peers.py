"""Peers on our checkpoint: the reference ``qwen_tts`` and faster-qwen3-tts, timed like ``tts_bench.py`` at c = 1.

Both systems load the same random-weight hub checkpoint (``--checkpoint``, or one written here from
``benchmarks/configs`` for ``--size``), speak the same text with voice ``ryan`` in English under the same sampling
settings, and generate exactly ``--frames`` frames (EOS suppressed) per request:

- ``reference``: ``Qwen3TTSModel.generate_custom_voice`` (HF generate, no streaming): TTFA = total. EOS is suppressed
  by setting its talker logit to -inf (a forward hook on ``codec_head``); it returns ``max_new_tokens - 1`` frames
  (the last sampled code-0 gets no residual codes), so it is asked for ``--frames + 1``.
- ``faster``: ``FasterQwen3TTS`` (CUDA graphs; CUDA only, skipped elsewhere) non-streaming and streaming at each
  ``--chunks`` size; ``min_new_tokens = max_new_tokens = --frames`` suppresses EOS.

Per mode: one untimed warm-up request, then ``--reps`` timed ones. TTFA: from the call to the first audio array;
total: to the last; x real time = audio seconds / total. Writes ``peers_<tag>.json`` to ``$OUT`` or
``benchmarks/results`` and prints a table with our ratio to each peer when ``tts_bench_<tag>.json`` (or
``_http.json``) is found there (README.md in this folder: the GPU recipe).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import compat  # noqa: E402
from provenance import REPO, git_commit  # noqa: E402

from omni_stream.metrics import underrun_of  # noqa: E402

CONFIGS = {
    "0.6b": REPO / "benchmarks" / "configs" / "qwen3-tts-12hz-0.6b-customvoice",
    "1.7b": REPO / "benchmarks" / "configs" / "qwen3-tts-12hz-1.7b-customvoice",
}
TEXT = "The quick brown fox jumps over the lazy dog while the evening sun sets slowly behind the quiet hills."
VOICE = "ryan"
LANGUAGE = "English"
FRAME_S = 0.08
SAMPLING = {"temperature": 0.9, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.05}
SUBTALKER = {"subtalker_temperature": 0.9, "subtalker_top_k": 50, "subtalker_top_p": 1.0}


def out_dir() -> Path:
    path = Path(os.environ.get("OUT") or REPO / "benchmarks" / "results")
    path.mkdir(parents=True, exist_ok=True)
    return path


def ensure_speech_tokenizer_weights(model_dir: Path, seed: int = 0) -> None:
    """Write random ``speech_tokenizer/model.safetensors`` (fp32, encoder included) when the directory has none."""
    directory = model_dir / "speech_tokenizer"
    if (directory / "model.safetensors").exists():
        return
    from safetensors.torch import save_file

    from omni_stream.models.qwen3_tts.codec import SpeechTokenizer
    from omni_stream.models.qwen3_tts.codec_checkpoint import randomize_speech_tokenizer_
    from omni_stream.models.qwen3_tts.codec_config import SpeechTokenizerConfig

    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    model = SpeechTokenizer(SpeechTokenizerConfig.from_dict(config), with_encoder=True)
    randomize_speech_tokenizer_(model, seed)
    tensors = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})


def prepare_checkpoint(args: argparse.Namespace, scratch: Path) -> Path:
    """``--checkpoint`` as given, or a fresh random-weight one at ``--size``; weight files are written if missing."""
    if args.checkpoint is not None:
        path = Path(args.checkpoint)
    else:
        from omni_stream.models.qwen3_tts.checkpoint import write_dummy_checkpoint

        path = write_dummy_checkpoint(CONFIGS[args.size], scratch / f"ckpt-{args.size}", dtype=args.torch_dtype)
    if not (path / "model.safetensors").exists():
        raise SystemExit(f"{path}/model.safetensors is missing: the peers read weights from files")
    ensure_speech_tokenizer_weights(path)
    return path


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def record(t0: float, arrivals: list[float], samples: list[int], rate: int) -> dict:
    """One request's figures from its start and the arrival time and length of each audio array."""
    durations = [n / rate for n in samples]
    audio_s = sum(durations)
    return {
        "ttfa_s": arrivals[0] - t0,
        "total_s": arrivals[-1] - t0,
        "audio_s": audio_s,
        "frames": round(audio_s / FRAME_S),
        "xrt": audio_s / (arrivals[-1] - t0),
        "chunks": len(arrivals),
        "underrun_s": underrun_of(arrivals, durations),
    }


def summarize(system: str, mode: str, runs: list[dict], frames: int) -> dict:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    return {
        "system": system,
        "mode": mode,
        "reps": len(runs),
        "ttfa_ms_median": 1000 * med("ttfa_s"),
        "ttfa_ms_min": 1000 * min(r["ttfa_s"] for r in runs),
        "total_s_median": med("total_s"),
        "total_s_min": min(r["total_s"] for r in runs),
        "xrt_median": med("xrt"),
        "ms_per_frame_median": 1000 * med("total_s") / frames,
        "underrun_ms_max": 1000 * max(r["underrun_s"] for r in runs),
        "frames_ok": all(r["frames"] == frames for r in runs),
        "runs": runs,
    }


# --- the reference ---


def run_reference(path: Path, args: argparse.Namespace) -> tuple[list[dict], dict]:
    qwen_tts = compat.import_reference()
    t0 = time.perf_counter()
    # device_map places the speech tokenizer too (it is not a submodule, so .to() would leave it on the host)
    placement = {"device_map": args.device} if args.device != "cpu" else {}
    wrapper = qwen_tts.Qwen3TTSModel.from_pretrained(
        str(path), dtype=args.torch_dtype, attn_implementation="sdpa", **placement
    )
    sync(args.device)
    info = {"load_s": time.perf_counter() - t0}
    eos = wrapper.model.config.talker_config.codec_eos_token_id

    def no_eos(_module: Any, _inputs: Any, logits: torch.Tensor) -> torch.Tensor:
        logits[..., eos] = -math.inf
        return logits

    wrapper.model.talker.codec_head.register_forward_hook(no_eos)

    def one(wrapper: Any) -> dict:
        t0 = time.perf_counter()
        wavs, rate = wrapper.generate_custom_voice(
            text=TEXT, speaker=VOICE, language=LANGUAGE, max_new_tokens=args.frames + 1, do_sample=True,
            subtalker_dosample=True, **SAMPLING, **SUBTALKER,
        )  # fmt: skip
        done = time.perf_counter()
        return record(t0, [done], [int(wavs[0].shape[-1])], rate)

    torch.manual_seed(0)
    one(wrapper)
    runs = [one(wrapper) for _ in range(args.reps)]
    if args.device.startswith("cuda"):
        info["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    del wrapper
    gc.collect()
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return [summarize("qwen-tts (reference)", "non-streaming", runs, args.frames)], info


# --- faster-qwen3-tts ---


def run_faster(path: Path, args: argparse.Namespace) -> tuple[list[dict], dict]:
    compat.import_reference()
    from faster_qwen3_tts import FasterQwen3TTS

    t0 = time.perf_counter()
    model = FasterQwen3TTS.from_pretrained(str(path), device=args.device, dtype=args.torch_dtype)
    info: dict[str, Any] = {"load_s": time.perf_counter() - t0}
    t0 = time.perf_counter()
    model.warmup()
    sync(args.device)
    info["graph_capture_s"] = time.perf_counter() - t0
    gen = {"text": TEXT, "speaker": VOICE, "language": LANGUAGE, "max_new_tokens": args.frames,
           "min_new_tokens": args.frames, "do_sample": True, **SAMPLING}  # fmt: skip

    def full(model: Any) -> dict:
        t0 = time.perf_counter()
        wavs, rate = model.generate_custom_voice(**gen)
        return record(t0, [time.perf_counter()], [int(wavs[0].shape[-1])], rate)

    def streamed(model: Any, chunk: int) -> dict:
        arrivals, samples, rates = [], [], []
        t0 = time.perf_counter()
        for audio, rate, _timing in model.generate_custom_voice_streaming(**gen, chunk_size=chunk):
            arrivals.append(time.perf_counter())
            samples.append(int(audio.shape[-1]))
            rates.append(rate)
        return record(t0, arrivals, samples, rates[0])

    modes: list[tuple[str, Any]] = [("non-streaming", full)]
    modes += [(f"stream, chunk {c}", lambda m, c=c: streamed(m, c)) for c in args.chunks]
    results = []
    torch.manual_seed(0)
    for mode, fn in modes:
        fn(model)
        runs = [fn(model) for _ in range(args.stream_reps)]
        results.append(summarize("faster-qwen3-tts", mode, runs, args.frames))
    info["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return results, info


# --- ours, the table ---


def ours_c1(tag: str) -> dict | None:
    """Our c = 1 figures for ``tag`` from ``tts_bench`` JSON in ``$OUT`` (same run) or ``benchmarks/results``."""
    dirs = [out_dir(), REPO / "benchmarks" / "results"]
    for directory in dict.fromkeys(dirs):
        for name in (f"tts_bench_{tag}.json", f"tts_bench_{tag}_http.json"):
            path = directory / name
            if not path.exists():
                continue
            data = json.loads(path.read_text(encoding="utf-8"))
            level = next((lv for lv in data.get("levels", []) if lv.get("concurrency") == 1), None)
            if level is not None:
                return {
                    "file": str(path), "transport": data.get("transport"), "git_commit": data.get("git_commit"),
                    "gpu": data.get("gpu"), "ttfa_ms": level["ttfa_p50_ms"], "xrt": level["xrt_per_stream_p50"],
                }  # fmt: skip
    return None


def add_ratios(rows: list[dict], ours: dict | None) -> None:
    """Per peer row: TTFA ratio = peer TTFA / ours, x real time ratio = ours / peer (above 1: we are ahead)."""
    for row in rows:
        row["ours_ttfa_ratio"] = row["ttfa_ms_median"] / ours["ttfa_ms"] if ours else None
        row["ours_xrt_ratio"] = ours["xrt"] / row["xrt_median"] if ours else None


def print_table(result: dict) -> None:
    ours = result["ours"]
    print(f"\npeers, {result['tag']}, {result['frames']} frames, {result['gpu']}, commit {result['git_commit']}")
    print(f"{'system':22} {'mode':16} {'TTFA ms (min)':>18} {'total s':>8} {'xRT':>6} {'frames':>6} "
          f"{'ours: TTFA x':>12} {'xRT x':>6}")  # fmt: skip
    for row in result["rows"]:
        ratio = f"{row['ours_ttfa_ratio']:12.2f} {row['ours_xrt_ratio']:6.2f}" if ours else f"{'-':>12} {'-':>6}"
        frames = "ok" if row["frames_ok"] else "NO"
        print(f"{row['system']:22} {row['mode']:16} {row['ttfa_ms_median']:9.1f} ({row['ttfa_ms_min']:6.1f})"
              f" {row['total_s_median']:8.3f} {row['xrt_median']:6.2f} {frames:>6} {ratio}")  # fmt: skip
    for name, reason in result["skipped"].items():
        print(f"{name}: skipped ({reason})")
    if ours:
        print(f"ours (c = 1, {ours['transport']}): TTFA {ours['ttfa_ms']:.1f} ms, xRT {ours['xrt']:.2f}")
        print(f"  from {ours['file']} (commit {ours['git_commit']})")
    else:
        print(f"ours: no tts_bench_{result['tag']}.json found, no ratios")


def versions() -> dict:
    found = {"python": platform.python_version(), "torch": torch.__version__}
    for dist in ("transformers", "qwen-tts-hf", "faster-qwen3-tts", "tokenizers", "accelerate"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = None
    return found


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, help="hub-layout checkpoint dir (default: write one for --size)")
    ap.add_argument("--size", choices=sorted(CONFIGS), default="1.7b")
    ap.add_argument("--tag", help="result name: peers_<tag>.json, ours from tts_bench_<tag>.json (default --size)")
    ap.add_argument("--systems", default="reference,faster", help="comma-separated: reference, faster")
    ap.add_argument("--frames", type=int, default=150, help="frames per request (150 = 12 s of audio)")
    ap.add_argument("--reps", type=int, default=3, help="timed reference requests")
    ap.add_argument("--stream-reps", type=int, default=4, help="timed faster-qwen3-tts requests per mode")
    ap.add_argument("--chunks", default="1,8", help="faster-qwen3-tts streaming chunk sizes (frames)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default=None, help="default: bf16 on CUDA, else fp32")
    args = ap.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if set(args.systems) - {"reference", "faster"}:
        ap.error(f"--systems: unknown {sorted(set(args.systems) - {'reference', 'faster'})}")
    args.chunks = [int(c) for c in args.chunks.split(",") if c.strip()]
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    args.torch_dtype = getattr(torch, args.dtype)
    args.tag = args.tag or args.size
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu ({platform.processor() or 'x86'})"
    result: dict[str, Any] = {
        "tag": args.tag, "git_commit": git_commit(), "gpu": gpu, "device": args.device, "dtype": args.dtype,
        "versions": versions(), "text": TEXT, "voice": VOICE, "language": LANGUAGE, "frames": args.frames,
        "audio_s_per_request": args.frames * FRAME_S, "sampling": {**SAMPLING, **SUBTALKER}, "eos_suppressed": True,
        "rows": [], "info": {}, "skipped": {}, "ours": None,
    }  # fmt: skip
    path = out_dir() / f"peers_{args.tag}.json"
    with tempfile.TemporaryDirectory(prefix="peers-") as scratch:
        t0 = time.perf_counter()
        ckpt = prepare_checkpoint(args, Path(scratch))
        prepare_s = time.perf_counter() - t0
        result["checkpoint"] = {"path": str(ckpt), "prepare_s": prepare_s, "written": args.checkpoint is None}
        for system in args.systems:
            if system == "faster" and not args.device.startswith("cuda"):
                result["skipped"]["faster-qwen3-tts"] = f"needs CUDA (CUDA graphs); device is {args.device}"
                print(f"faster-qwen3-tts: skipped, it needs CUDA (device is {args.device})", flush=True)
                continue
            rows, info = (run_reference if system == "reference" else run_faster)(ckpt, args)
            result["rows"] += rows
            result["info"][system] = info
            path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    result["stand_in_modules"] = compat.stand_ins()
    result["ours"] = ours_c1(args.tag)
    add_ratios(result["rows"], result["ours"])
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print_table(result)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
