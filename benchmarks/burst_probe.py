"""Where a burst's first audio waits: a timeline of ``c`` requests sent together, in process.

    python benchmarks/burst_probe.py --size 1.7b --bursts 32,128      # on a GPU (real-size config, dummy weights)
    python benchmarks/burst_probe.py --tiny --device cpu --bursts 4   # CPU smoke run

One engine; each burst sends ``c`` speech requests at once (``asyncio.gather``), ``--rounds`` times per size,
the first round on the engine's first burst of that size ("cold"). Per request: its creation, its admission
into the talker's batch and its first audio chunk on the engine's clock (``SpeechStream.timings``), and when
the caller got that chunk. On the device worker: every talker step (newcomers prefilled, rows decoded) and
codec window job with its start and end, and each prompt's preparation on its thread, so the burst's time
to its last first chunk splits into steps, codec jobs and the worker's idle time. Also the event loop's lag
(a task that asks to wake every millisecond), so time the loop could not run shows apart from time the
worker spent, and the garbage collector's pauses (every thread waits in them). With ``--sample-ms``, a
thread samples the stacks of the event loop's thread and the worker's and counts the innermost frames of
this project's code, before the first step and after (where each thread's time goes, GIL waits included).
Prints a line per round and the worker's jobs up to the last first chunk; writes ``burst_probe_<size>.json``
(under ``$OUT`` if set, else ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import torch
from first_window_probe import Timeline, add_engine_args, probe_engine
from provenance import git_commit
from tts_bench import TEXT, VOICES, out_dir

from omni_stream.metrics import percentile


class WorkerTimeline(Timeline):
    """The worker's steps and codec jobs (:class:`first_window_probe.Timeline`), and each prompt's preparation."""

    def __init__(self, family) -> None:
        super().__init__(family)
        self.prepares: list[tuple[float, float]] = []  # start and end of each prompt's preparation (its thread)
        from omni_stream.models.qwen3_tts import family as family_module

        prepare = family_module.prepare_request

        def timed_prepare(*args, **kwargs):
            t0 = time.perf_counter()
            out = prepare(*args, **kwargs)
            self.prepares.append((t0, time.perf_counter()))
            return out

        family_module.prepare_request = timed_prepare


class GcPauses:
    """The interpreter's garbage collections while in scope: (generation, seconds) each; every thread waits."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float, float]] = []  # (generation, start, seconds)
        self._start = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.pauses.append((info["generation"], self._start, time.perf_counter() - self._start))

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


class LoopLag:
    """How late the event loop wakes a task that asks for 1 ms sleeps (seconds late, at perf_counter times)."""

    def __init__(self) -> None:
        self.lags: list[tuple[float, float]] = []

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            self.lags.append((now, now - t - 0.001))


class StackSampler:
    """Counts, per named thread, the innermost frames of this project's code every ``interval`` seconds."""

    def __init__(self, threads: dict[str, int], interval: float) -> None:
        self.threads, self.interval = threads, interval
        self.samples: list[tuple[float, str, str]] = []  # (perf_counter, thread, where)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)

    def __enter__(self) -> StackSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            frames, now = sys._current_frames(), time.perf_counter()
            for name, ident in self.threads.items():
                self.samples.append((now, name, self._where(frames.get(ident))))

    @staticmethod
    def _where(frame) -> str:
        """The innermost frame (the call now running) and the two innermost of this project's, or ``idle``."""
        inner = None
        ours: list[str] = []
        while frame is not None and len(ours) < 2:
            code = frame.f_code
            label = f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}"
            inner = inner or label
            if "omni_stream" in code.co_filename:
                ours.append(label)
            frame = frame.f_back
        return " < ".join([inner or "idle", *[o for o in ours if o != inner]])

    def top(self, start: float, end: float, n: int = 10) -> dict[str, list[tuple[str, int]]]:
        """The ``n`` commonest places of each thread among the samples taken in ``[start, end)``."""
        counts: dict[str, Counter[str]] = {name: Counter() for name in self.threads}
        for at, name, where in self.samples:
            if start <= at < end:
                counts[name][where] += 1
        return {name: c.most_common(n) for name, c in counts.items()}


async def one_request(engine, i: int, frames: int, got_first: asyncio.Future | None = None) -> dict:
    fields = {"voice": VOICES[i % len(VOICES)], "language": "English", "max_new_tokens": frames, "ignore_eos": True,
              "seed": i}  # fmt: skip
    t0 = time.perf_counter()
    first = None
    async with engine.speech(TEXT, **fields) as stream:
        async for _ in stream:
            if first is None:
                first = time.perf_counter()
                if got_first is not None:
                    got_first.set_result(None)
        t = stream.timings
    return {"sent": t0, "created": t.created, "admitted": t.admitted, "first_chunk": t.first_chunk, "got": first,
            "end": time.perf_counter(), "audio_s": t.audio_seconds}  # fmt: skip


def ms(x: float) -> float:
    return round(1000 * x, 2)


async def burst(engine, timeline: WorkerTimeline, c: int, frames: int, seed: int, sample_s: float) -> dict:
    timeline.events.clear()
    timeline.prepares.clear()
    lag, stop = LoopLag(), asyncio.Event()
    ticker = asyncio.create_task(lag.run(stop))
    await asyncio.sleep(0.01)
    worker = next(t for t in threading.enumerate() if t.name == engine.worker.name)
    sampler = StackSampler({"loop": threading.get_ident(), "worker": worker.ident}, sample_s) if sample_s else None
    t0 = time.perf_counter()
    firsts = [asyncio.get_running_loop().create_future() for _ in range(c)]
    with sampler or contextlib.nullcontext():  # the whole round: the steady steps after the burst's start too
        with GcPauses() as gcs:  # up to the last first chunk
            pending = asyncio.gather(*(one_request(engine, seed + i, frames, firsts[i]) for i in range(c)))
            await asyncio.gather(*firsts)
        reqs = await pending
    stop.set()
    await ticker
    last_first = max(r["got"] for r in reqs)
    first_step = min((e[1] for e in timeline.events if e[0] == "step"), default=last_first)
    prepares = [p for p in timeline.prepares if p[0] >= t0]
    upto = [e for e in timeline.events if e[1] < last_first]
    busy = sorted((s, min(e, last_first)) for _, s, e, *_ in upto)
    idle, cursor = 0.0, t0
    for s, e in busy:
        idle += max(0.0, s - cursor)
        cursor = max(cursor, e)
    idle += max(0.0, last_first - cursor)
    ttfa = [r["got"] - r["sent"] for r in reqs]
    early = [lg for at, lg in lag.lags if at <= last_first]
    wall = max(r["end"] for r in reqs) - t0
    whole = [e for e in timeline.events if e[1] >= t0]  # the round to its last request's end
    steps, codec = [e for e in whole if e[0] == "step"], [e for e in whole if e[0] == "codec"]
    return {
        "c": c,
        "ttfa_ms_p50": ms(percentile(ttfa, 50)),
        "ttfa_ms_p95": ms(percentile(ttfa, 95)),
        "ttfa_ms_max": ms(max(ttfa)),
        "created_ms_max": ms(max(r["created"] for r in reqs) - t0),  # the last request's creation after the send
        "queue_ms_p50": ms(statistics.median(r["admitted"] - r["created"] for r in reqs)),
        "queue_ms_max": ms(max(r["admitted"] - r["created"] for r in reqs)),
        "admitted_to_first_ms_p50": ms(statistics.median(r["first_chunk"] - r["admitted"] for r in reqs)),
        "first_chunk_to_caller_ms_max": ms(max(r["got"] - r["first_chunk"] for r in reqs)),
        "to_last_first_ms": ms(last_first - t0),
        "steps_ms": ms(sum(min(e, last_first) - s for k, s, e, *_ in upto if k == "step")),
        "codec_ms": ms(sum(min(e, last_first) - s for k, s, e, *_ in upto if k == "codec")),
        "idle_ms": ms(idle),
        "loop_lag_ms_max": ms(max(early, default=0.0)),
        "gc_ms": ms(sum(d for *_, d in gcs.pauses)),
        "gc_pauses_ms": [(g, ms(at - t0), ms(d)) for g, at, d in gcs.pauses if d > 0.001],  # (generation, at, ms)
        "loop_lag_ms_sum": ms(sum(early)),
        "aggregate_xrt": round(sum(r["audio_s"] for r in reqs) / wall, 1),
        "round_ms": ms(wall),
        "round_steps": len(steps),
        "round_step_ms": ms(sum(e - s for _, s, e, *_ in steps)),
        "round_codec_jobs": len(codec),
        "round_codec_ms": ms(sum(e - s for _, s, e, *_ in codec)),
        "jobs": [(k, ms(s - t0), ms(e - s), a, b) for k, s, e, a, b in upto],
        "admitted_ms": sorted(ms(r["admitted"] - t0) for r in reqs),
        "first_chunk_ms": sorted(ms(r["first_chunk"] - t0) for r in reqs),
        "prepare_ms": [ms(min(s for s, _ in prepares) - t0), ms(max(e for _, e in prepares) - t0)]
        if prepares
        else None,
        "stack_samples": None
        if sampler is None
        else {
            "before the first step": sampler.top(t0, first_step),
            "after": sampler.top(first_step, last_first),
            "steady, after the last first chunk": sampler.top(last_first, t0 + wall),
        },
    }


def print_round(row: dict) -> None:
    r = row
    print(
        f"c={r['c']:4d} hold {r['hold_ms']:.0f} ms round {r['round']}: TTFA p50 {r['ttfa_ms_p50']:.1f} "
        f"p95 {r['ttfa_ms_p95']:.1f} "
        f"max {r['ttfa_ms_max']:.1f} ms | last created {r['created_ms_max']:.1f}, queue p50 {r['queue_ms_p50']:.1f} "
        f"max {r['queue_ms_max']:.1f}, admitted->first p50 {r['admitted_to_first_ms_p50']:.1f}, first->caller max "
        f"{r['first_chunk_to_caller_ms_max']:.1f} | to last first {r['to_last_first_ms']:.1f} = steps "
        f"{r['steps_ms']:.1f} + codec {r['codec_ms']:.1f} + idle {r['idle_ms']:.1f} ms | loop lag max "
        f"{r['loop_lag_ms_max']:.1f} sum {r['loop_lag_ms_sum']:.1f} ms | {r['aggregate_xrt']:.1f}x",
        flush=True,
    )
    print(f"    whole round {r['round_ms']:.0f} ms: {r['round_steps']} steps {r['round_step_ms']:.0f} ms, "
          f"{r['round_codec_jobs']} codec jobs {r['round_codec_ms']:.0f} ms", flush=True)  # fmt: skip
    print(f"    prompts prepared from {r['prepare_ms']} ms; garbage collection {r['gc_ms']} ms, "
          f"pauses over 1 ms (generation, at ms, ms): {r['gc_pauses_ms']}", flush=True)  # fmt: skip
    for span, threads in (r["stack_samples"] or {}).items():
        for thread, top in threads.items():
            print(f"    {thread} stack samples {span}: {top}", flush=True)
    print(f"    worker jobs (kind, at ms, ms, newcomers|jobs, rows|frames): {r['jobs'][:40]}", flush=True)


async def main(args: argparse.Namespace) -> None:
    engine = await probe_engine(args)
    timeline = WorkerTimeline(engine.models.speech())
    rounds: list[dict] = []
    async with engine:
        await one_request(engine, 0, args.short_frames)  # what a server's warm-up request does
        scheduler = engine.models.speech().scheduler
        for hold_ms in args.holds or [1000 * scheduler.hold]:
            scheduler.hold = hold_ms / 1000
            for c in args.bursts:
                for r in range(args.rounds):
                    row = await burst(engine, timeline, c, args.frames, 1000 * r, args.sample_ms / 1000)
                    row["round"], row["hold_ms"] = r, hold_ms
                    rounds.append(row)
                    print_round(row)
    result = {
        "size": "tiny" if args.tiny else args.size,
        "git_commit": git_commit(),
        "device": args.device,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "frames": args.frames,
        "rounds": rounds,
    }
    path = out_dir() / f"burst_probe_{result['size']}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(ap)
    ap.add_argument("--bursts", type=lambda s: [int(x) for x in s.split(",")], default=[32])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--holds", type=lambda s: [float(x) for x in s.split(",")], default=None,
                    help="the talker's burst holds in ms, the bursts once each (default: the engine's)")  # fmt: skip
    ap.add_argument("--sample-ms", type=float, default=0.0, help="sample both threads' stacks this often (0: off)")
    ap.add_argument("--short-frames", type=int, default=12, help="the warm-up request before the bursts")
    asyncio.run(main(ap.parse_args()))
