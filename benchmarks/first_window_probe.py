"""Where a lone request's wall time goes, by first audio window: a timeline of the device worker at c=1.

    python benchmarks/first_window_probe.py --size 1.7b            # on a GPU (real-size config, dummy weights)
    python benchmarks/first_window_probe.py --tiny --device cpu    # CPU smoke run

In process, one engine; requests of ``--frames`` frames run one at a time, first windows in turn (the engine's
load-adaptive choice and each ``--windows`` value, interleaved ``--rounds`` times so drift hits every arm alike).
The worker's talker steps and codec window jobs are timed with their start and end, and every audio chunk's
arrival at the caller, so a request's wall splits into talker steps, codec jobs and the worker's idle gaps
(time the worker had nothing to run: the request was paused, or waiting on the event loop). Before the arms,
the first full-length request after a ``--short-frames`` one is timed alone with every job ("cold"). Prints a line per
arm and writes ``first_window_probe_<size>.json`` (under ``$OUT`` if set, else ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from provenance import git_commit
from tts_bench import CONFIGS, TEXT, VOICES, n_frames, out_dir

from omni_stream.metrics import percentile


class Timeline:
    """Start/end of every talker step and codec job on the worker (perf_counter seconds)."""

    def __init__(self, family) -> None:
        from omni_stream.models.qwen3_tts import codec_stage as stages

        # (kind, start, end, a, b): a step's newcomers and decoded rows; a codec job's windows and frames
        self.events: list[tuple[str, float, float, int, int]] = []
        self.t0 = 0.0  # the current request's send time
        step = family.runner.step

        def timed_step(batch):
            t0 = time.perf_counter()
            out = step(batch)
            self.events.append(("step", t0, time.perf_counter(), len(batch.prefill), len(batch.decode)))
            return out

        family.runner.step = timed_step
        for name in ("decode_slot_windows", "decode_codec_windows"):
            original = getattr(stages, name)

            def timed(first, jobs, _original=original):
                t0 = time.perf_counter()
                out = _original(first, jobs)
                self.events.append(("codec", t0, time.perf_counter(), len(jobs), n_frames(jobs[0].codes)))
                return out

            setattr(stages, name, timed)
        issue = stages.issue_slot_windows

        def timed_issue(pool, jobs, completions):
            # the codec on its own stream: the worker's part of a job is its launch (the audio comes back later)
            t0 = time.perf_counter()
            out = issue(pool, jobs, completions)
            self.events.append(("codec", t0, time.perf_counter(), len(jobs), n_frames(jobs[0].codes)))
            return out

        stages.issue_slot_windows = timed_issue

    def between(self, t0: float, t1: float) -> list[tuple[str, float, float, int, int]]:
        return [e for e in self.events if e[1] >= t0 and e[2] <= t1]


async def one_request(engine, timeline: Timeline, i: int, frames: int, first: int | None) -> dict:
    fields = {"voice": VOICES[i % len(VOICES)], "language": "English", "max_new_tokens": frames, "ignore_eos": True,
              "seed": i}  # fmt: skip
    if first is not None:
        fields["initial_codec_chunk_frames"] = first
    arrivals: list[tuple[float, int]] = []
    t0 = timeline.t0 = time.perf_counter()
    async with engine.speech(TEXT, **fields) as stream:
        async for audio in stream:
            arrivals.append((time.perf_counter(), int(audio.samples.shape[0])))
    t1 = time.perf_counter()
    events = timeline.between(t0, t1)
    steps = [e for e in events if e[0] == "step"]
    codec = [e for e in events if e[0] == "codec"]
    busy = sorted((s, e) for _, s, e, *_ in events)
    gaps, cursor = [], t0
    for s, e in busy:
        if s > cursor:
            gaps.append(s - cursor)
        cursor = max(cursor, e)
    gaps.append(t1 - cursor)
    audio_s = sum(n for _, n in arrivals) / engine.speech_info.sample_rate
    return {
        "first_window": first,
        "wall_s": t1 - t0,
        "ttfa_ms": 1000 * (arrivals[0][0] - t0),
        "xrt": audio_s / (arrivals[-1][0] - t0),
        "chunks": len(arrivals),
        "steps": len(steps),
        "step_s": sum(e - s for _, s, e, *_ in steps),
        "codec_jobs": [(n, round(1000 * (e - s), 3)) for _, s, e, _, n in codec],
        "codec_s": sum(e - s for _, s, e, *_ in codec),
        "idle_s": sum(gaps),
        "idle_gaps_ms_top": sorted((round(1000 * g, 2) for g in gaps), reverse=True)[:12],
        "idle_gap_ms_p50": 1000 * percentile(gaps, 50),
        "arrivals_ms": [(round(1000 * (t - t0), 2), n) for t, n in arrivals],
    }


def summary(rows: list[dict]) -> dict:
    keys = ("wall_s", "ttfa_ms", "xrt", "step_s", "codec_s", "idle_s", "idle_gap_ms_p50")
    return {k: statistics.median(r[k] for r in rows) for k in keys} | {"n": len(rows)}


def add_engine_args(ap: argparse.ArgumentParser) -> None:
    """The arguments :func:`probe_engine` reads, and the frames a request makes."""
    ap.add_argument("--size", choices=sorted(CONFIGS), default="1.7b")
    ap.add_argument("--tiny", action="store_true", help="a tiny random checkpoint (CPU smoke run)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default=None)
    ap.add_argument("--frames", type=int, default=150)
    ap.add_argument("--max-batch", type=int, default=128)


async def probe_engine(args: argparse.Namespace):
    """An engine on a tiny random checkpoint (``--tiny``) or a real-size one with dummy weights (``--size``)."""
    from omni_stream.engine import AsyncEngine
    from omni_stream.models.qwen3_tts.checkpoint import write_dummy_checkpoint, write_tiny_checkpoint

    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    torch_dtype = getattr(torch, dtype)
    tmp = tempfile.mkdtemp()
    if args.tiny:
        ckpt = write_tiny_checkpoint(Path(tmp) / "ckpt", "custom_voice", args.size, dtype=torch_dtype)
    else:
        ckpt = write_dummy_checkpoint(CONFIGS[args.size], Path(tmp) / "ckpt", dtype=torch_dtype, weights=False)
    return await AsyncEngine.from_pretrained(
        ckpt, device=args.device, dtype=dtype, load_format="dummy", max_batch_size=args.max_batch, progress=True
    )


async def main(args: argparse.Namespace) -> None:
    engine = await probe_engine(args)
    timeline = Timeline(engine.models.speech())
    arms: list[int | None] = [None, *args.windows]
    rows: dict[str, list[dict]] = {str(a): [] for a in arms}
    async with engine:
        # The first full-length request after a short one (what a server sees after tts_bench's warm-up), timed
        # apart: the worker's first long request pays costs the later ones do not.
        await one_request(engine, timeline, 0, args.short_frames, arms[0])
        timeline.events.clear()
        cold = await one_request(engine, timeline, 0, args.frames, arms[0])
        cold["events"] = [(k, round(1000 * (s - timeline.t0), 3), round(1000 * (e - s), 3), a, b)
                          for k, s, e, a, b in timeline.events]  # fmt: skip
        timeline.events.clear()
        for a in arms:  # warm-up, not measured: every window size and graph once
            await one_request(engine, timeline, 0, args.frames, a)
        timeline.events.clear()
        for r in range(args.rounds):
            for a in arms:
                rows[str(a)].append(await one_request(engine, timeline, r, args.frames, a))
                timeline.events.clear()
    result = {
        "size": "tiny" if args.tiny else args.size,
        "git_commit": git_commit(),
        "device": args.device,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "frames": args.frames,
        "arms": {a: {"summary": summary(v), "requests": v} for a, v in rows.items()},
        "cold": cold,
    }
    slow = sorted(cold["events"], key=lambda e: -e[2])[:10]
    print(f"cold first long request: wall {cold['wall_s']:.3f} s  xRT {cold['xrt']:.2f}  steps {cold['step_s']:.3f} s"
          f"  codec {cold['codec_s']:.3f} s  idle {cold['idle_s']:.3f} s; slowest jobs (kind, at ms, ms, "
          f"newcomers|windows, rows|frames): {slow}", flush=True)  # fmt: skip
    for a, v in result["arms"].items():
        s = v["summary"]
        print(f"first window {a:>4}: wall {s['wall_s']:.3f} s  TTFA {s['ttfa_ms']:.1f} ms  xRT {s['xrt']:.2f}  "
              f"steps {s['step_s']:.3f} s  codec {s['codec_s']:.3f} s  idle {s['idle_s']:.3f} s "
              f"(gap p50 {s['idle_gap_ms_p50']:.2f} ms)  n={s['n']}", flush=True)  # fmt: skip
        print(f"    largest idle gaps ms: {v['requests'][0]['idle_gaps_ms_top']}", flush=True)
    path = out_dir() / f"first_window_probe_{result['size']}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(ap)
    ap.add_argument("--windows", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--short-frames", type=int, default=12, help="the short request before the cold one")
    asyncio.run(main(ap.parse_args()))
