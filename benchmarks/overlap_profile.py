"""Where a decode step's wall time goes besides the GPU, and whether codec windows overlap talker steps.

Run on a CUDA machine: ``python benchmarks/overlap_profile.py [--size 1.7b]``. Real-size random-weight models
(bf16, ``load_format="dummy"``) from ``benchmarks/configs``; the runner and codec pool the engine uses. Each
question is one experiment; figures are medians of wall time (``perf_counter``) unless named GPU (CUDA events):

1. ``gpu``: the decode-step graph alone at B = 1, 32, 128; codec window graphs alone (batch x frames).
2. ``gil``: ``runner.step`` wall per step at B = 1, 32, 128 with no other thread, then beside a Python thread
   that holds the GIL half the time (the event loop's stand-in: 1 ms of bytecode, 1 ms asleep), at the
   interpreter's default 5 ms switch interval and at 0.5 ms.
3. ``codec``: talker steps on this thread with a codec job every few steps, four arrangements: ``serial`` (the
   job on the talker's stream, waited for), ``side-normal`` / ``side-high`` (issued on a side stream of that
   priority, collected by this thread after each talker step: the engine's opt-in side-stream mode),
   ``thread`` (a second Python thread runs each job synchronously on its own stream: the earlier opt-in
   design); per arrangement the talker's step wall, the job's latency from hand-over to audio on the host,
   and the job's GPU time on its stream. ``thread`` and ``side-high`` are run again beside the busy thread
   (5 ms and 0.5 ms switch intervals).
4. ``prefill``: a step of newcomers in parts: admission, their prompts embedded one at a time and together,
   the prefill as one eager padded forward vs the (count, length) prefill graph (graphs hold up to 8
   newcomers), the whole step; then the profiler's top operators of a step of 56 newcomers.
5. ``kernels``: CUPTI kernel counts and GPU time by category of the step graph at B = 1 and 128.

Writes ``overlap_profile.json`` to ``$OUT`` (or ``benchmarks/results``) after every experiment; prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
from code_predictor import cuda_ms, kernel_profile
from provenance import git_commit

from omni_stream.batch_model import Batch, Sequence
from omni_stream.models.qwen3_tts.checkpoint import load_lm, write_dummy_checkpoint
from omni_stream.models.qwen3_tts.codec import load_speech_tokenizer
from omni_stream.models.qwen3_tts.codec_graphs import CodecWindows
from omni_stream.models.qwen3_tts.config import load_config, load_generation_defaults
from omni_stream.models.qwen3_tts.prompt import embed_prompt, prepare_request
from omni_stream.models.qwen3_tts.runner import Qwen3TTSRunner
from omni_stream.models.qwen3_tts.tokenizer import TextTokenizer
from omni_stream.requests import SpeechRequest
from omni_stream.runtime.gpu_completions import Completions
from omni_stream.worker import DeviceWorker

ROOT = Path(__file__).resolve().parent
CONFIGS = {
    "0.6b": ROOT / "configs" / "qwen3-tts-12hz-0.6b-customvoice",
    "1.7b": ROOT / "configs" / "qwen3-tts-12hz-1.7b-customvoice",
}
TEXT = "The quick brown fox jumps over the lazy dog while the evening sun sets slowly behind the quiet hills."
VOICES = ("vivian", "serena", "uncle_fu", "ryan", "aiden", "ono_anna", "sohee", "eric", "dylan")
BATCHES = (1, 32, 128)
SPAN = 512


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


class Busy:
    """A thread that runs Python bytecode ``on_ms`` then sleeps ``off_ms`` (GIL released), until stopped."""

    def __init__(self, on_ms: float = 1.0, off_ms: float = 1.0) -> None:
        self.on, self.off = on_ms / 1000, off_ms / 1000
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            end = time.perf_counter() + self.on
            x = 0
            while time.perf_counter() < end:
                for i in range(200):
                    x += i
            time.sleep(self.off)

    def __enter__(self) -> Busy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


class SwitchInterval:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __enter__(self) -> None:
        self.saved = sys.getswitchinterval()
        sys.setswitchinterval(self.seconds)

    def __exit__(self, *exc: object) -> None:
        sys.setswitchinterval(self.saved)


class Rows:
    """``b`` running sequences on the runner (prefilled once), stepped by hand."""

    def __init__(self, runner: Qwen3TTSRunner, requests: list, b: int) -> None:
        self.runner = runner
        self.seqs = [Sequence(seq_id=i, payload=requests[i], slot=i) for i in range(b)]
        runner.step(Batch(prefill=tuple(self.seqs)))
        torch.cuda.synchronize()

    def step(self) -> float:
        t0 = time.perf_counter()
        self.runner.step(Batch(decode=tuple(self.seqs)))
        return time.perf_counter() - t0

    def close(self) -> None:
        for s in self.seqs:
            self.runner.release(s)


def save(result: dict) -> None:
    out = Path(os.environ.get("OUT") or ROOT / "results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "overlap_profile.json").write_text(json.dumps(result, indent=2) + "\n")


def attempt(result: dict, name: str, fn: Callable[[], object]) -> None:
    t0 = time.perf_counter()
    try:
        result[name] = fn()
    except Exception as exc:  # one failed experiment must not lose the others
        result[name] = {"error": repr(exc)}
        print(f"{name} failed: {exc!r}", flush=True)
    print(f"-- {name} done in {time.perf_counter() - t0:.1f} s", flush=True)
    save(result)


def exp_gpu(runner: Qwen3TTSRunner, pool: CodecWindows) -> dict:
    assert runner.graphs is not None and pool.graphs is not None
    out: dict = {"step_graph_ms": {}, "codec_graph_ms": {}}
    with runner._idle():
        for b in BATCHES:
            out["step_graph_ms"][b] = cuda_ms(lambda b=b: runner.graphs.replay((b, SPAN)), 30)
    for b, n in ((1, 1), (1, 2), (1, 25), (32, 2), (32, 25), (128, 2), (128, 25)):
        out["codec_graph_ms"][f"{b}x{n}"] = cuda_ms(lambda b=b, n=n: pool.graphs.replay((b, n)), 10)
    print(f"gpu: {json.dumps(out)}", flush=True)
    return out


def exp_gil(runner: Qwen3TTSRunner, requests: list) -> dict:
    out: dict = {}
    for b in BATCHES:
        rows = Rows(runner, requests, b)
        try:
            for _ in range(5):
                rows.step()
            entry = {"alone_ms": 1000 * med([rows.step() for _ in range(40)])}
            for label, interval in (("busy_5ms_ms", 0.005), ("busy_0.5ms_ms", 0.0005)):
                with SwitchInterval(interval), Busy():
                    entry[label] = 1000 * med([rows.step() for _ in range(40)])
        finally:
            rows.close()
        out[b] = entry
        print(f"gil B={b}: {json.dumps(entry)}", flush=True)
    return out


def codec_jobs(b: int, n: int, base: int) -> tuple[list[int], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(base)
    return list(range(base, base + b)), [torch.randint(0, 2048, (n, 16), generator=gen) for _ in range(b)]


def run_codec_mode(
    mode: str,
    rows: Rows,
    pool: CodecWindows,
    streams: dict,
    completions: Completions,
    job: tuple,
    every: int,
    steps: int,
) -> dict:
    """Talker steps with a codec job handed over every ``every`` steps; see the module docstring."""
    b, n = job
    slots, codes = codec_jobs(b, n, 0)
    fresh = [True] * b
    step_ms: list[float] = []
    latency_ms: list[float] = []
    gpu_ms: list[float] = []
    timers: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    done = threading.Event()
    jobs: queue.SimpleQueue = queue.SimpleQueue()
    thread = None
    if mode == "thread":
        own = streams["normal"]

        def codec_thread() -> None:
            torch.cuda.set_stream(own)
            pool.stream = None  # the thread's current stream, as the earlier design ran it
            while (item := jobs.get()) is not None:
                t_in = item
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                pool.decode(slots, codes, fresh)
                end.record()
                latency_ms.append(1000 * (time.perf_counter() - t_in))
                timers.append((start, end))
            done.set()

        thread = threading.Thread(target=codec_thread, daemon=True)
        thread.start()
    else:
        pool.stream = streams.get(mode.removeprefix("side-")) if mode.startswith("side-") else None
    if mode.startswith("side-"):
        rows.runner.after_step = completions.deliver_ready  # as the family wires it
    t_loop = time.perf_counter()
    for i in range(steps):
        if i % every == 0:
            t_in = time.perf_counter()
            if mode == "thread":
                jobs.put(t_in)
            elif mode == "serial":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                pool.decode(slots, codes, fresh)
                end.record()
                timers.append((start, end))
                latency_ms.append(1000 * (time.perf_counter() - t_in))
            else:
                with torch.cuda.stream(pool.stream):
                    start = torch.cuda.Event(enable_timing=True)
                    start.record()
                pending = pool.issue(slots, codes, fresh)
                with torch.cuda.stream(pool.stream):
                    end = torch.cuda.Event(enable_timing=True)
                    end.record()
                timers.append((start, end))

                def then(err, t_in=t_in, pending=pending) -> None:
                    pending.arrays()
                    latency_ms.append(1000 * (time.perf_counter() - t_in))

                assert pending.event is not None
                completions.watch(pending.event, then)
        step_ms.append(1000 * rows.step())
    loop_s = time.perf_counter() - t_loop
    if thread is not None:
        jobs.put(None)
        done.wait(60)
    torch.cuda.synchronize()
    while completions.has_work():
        completions.run_step()
    rows.runner.after_step = None
    for start, end in timers:
        gpu_ms.append(start.elapsed_time(end))
    pool.stream = None
    return {
        "step_wall_ms_p50": med(step_ms),
        "step_wall_ms_mean": statistics.fmean(step_ms),
        "loop_ms_per_step": 1000 * loop_s / steps,
        "codec_latency_ms_p50": med(latency_ms),
        "codec_gpu_ms_p50": med(gpu_ms),
        "codec_jobs": len(latency_ms),
    }


CODEC_CASES = ((1, (1, 2), 4, 48), (32, (32, 25), 12, 48), (128, (128, 25), 12, 48))


def exp_codec(runner: Qwen3TTSRunner, requests: list, pool: CodecWindows, cases: tuple = CODEC_CASES) -> dict:
    streams = {"normal": torch.cuda.Stream(priority=0), "high": torch.cuda.Stream(priority=-100)}
    completions = Completions(DeviceWorker())  # never started: this thread is the worker
    out: dict = {}
    for b, job, every, steps in cases:
        rows = Rows(runner, requests, b)
        try:
            for _ in range(3):
                rows.step()
            entry = {"job": f"{job[0]}x{job[1]} every {every} steps"}
            for mode in ("serial", "side-normal", "side-high", "thread"):
                entry[mode] = run_codec_mode(mode, rows, pool, streams, completions, job, every, steps)
            if b == 1:
                for interval, tag in ((0.005, "5ms"), (0.0005, "0.5ms")):
                    for mode in ("thread", "side-high"):
                        with SwitchInterval(interval), Busy():
                            entry[f"{mode}+busy_{tag}"] = run_codec_mode(
                                mode, rows, pool, streams, completions, job, every, steps
                            )
        finally:
            rows.close()
        out[b] = entry
        print(f"codec B={b}: {json.dumps(entry)}", flush=True)
    return out


def exp_prefill(runner: Qwen3TTSRunner, requests: list, counts: tuple[int, ...] = (4, 8, 32, 56, 128)) -> dict:
    """A step of ``k`` newcomers in parts (synchronized between them): admission, the joint prompt embedding,
    the prefill (eager padded forward, or the prefill graph where one fits), then the whole ``runner.step``
    of the same newcomers (prefill and their first frame), all wall ms."""
    out: dict = {}
    graphs = runner.prefill_graphs
    for k in counts:
        entry: dict = {}
        for label in ("eager", "graph"):
            runner.prefill_graphs = graphs if label == "graph" else None
            admit, alone, embed, prefill, step = [], [], [], [], []
            for rep in range(4):
                seqs = [Sequence(seq_id=i, payload=requests[i], slot=i) for i in range(k)]
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for s in seqs:
                    runner._admit(s)
                torch.cuda.synchronize()
                t1 = time.perf_counter()
                for s in seqs:
                    embed_prompt(runner.talker, runner.cfg, s.payload.prompt)
                torch.cuda.synchronize()
                t_alone = time.perf_counter()
                _, admitted = runner._embed_all(seqs, {})
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                runner._prefill(admitted)
                torch.cuda.synchronize()
                t3 = time.perf_counter()
                for s in seqs:
                    runner.release(s)
                seqs = [Sequence(seq_id=i, payload=requests[i], slot=i) for i in range(k)]
                torch.cuda.synchronize()
                t4 = time.perf_counter()
                runner.step(Batch(prefill=tuple(seqs)))
                t5 = time.perf_counter()
                for s in seqs:
                    runner.release(s)
                if rep:
                    admit.append(1000 * (t1 - t0))
                    embed.append(1000 * (t2 - t_alone))
                    alone.append(1000 * (t_alone - t1))
                    prefill.append(1000 * (t3 - t2))
                    step.append(1000 * (t5 - t4))
            entry[label] = {"admit_ms": med(admit), "embed_each_alone_ms": med(alone), "embed_ms": med(embed),
                            "prefill_ms": med(prefill), "step_ms": med(step)}  # fmt: skip
        runner.prefill_graphs = graphs
        out[k] = entry
        print(f"prefill k={k}: {json.dumps(entry)}", flush=True)
    k = 56  # where the host's share of a step shows: the profiler's top operators by host and by device time
    seqs = [Sequence(seq_id=i, payload=requests[i], slot=i) for i in range(k)]
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as prof:
        runner.step(Batch(prefill=tuple(seqs)))
        torch.cuda.synchronize()
    for s in seqs:
        runner.release(s)
    for key in ("self_cpu_time_total", "self_cuda_time_total"):
        print(prof.key_averages().table(sort_by=key, row_limit=14), flush=True)
    return out


def exp_kernels(runner: Qwen3TTSRunner) -> dict:
    assert runner.graphs is not None
    with runner._idle():
        return {b: kernel_profile(lambda b=b: runner.graphs.replay((b, SPAN))) for b in (BATCHES[0], BATCHES[-1])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(CONFIGS), default="1.7b")
    ap.add_argument("--only", default="gpu,gil,codec,prefill,kernels")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = True
    result: dict = {
        "git_commit": git_commit(),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "size": args.size,
        "default_switch_interval_s": sys.getswitchinterval(),
    }
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_dummy_checkpoint(CONFIGS[args.size], Path(tmp) / "ckpt", dtype=torch.bfloat16, weights=False)
        cfg, tok, defaults = load_config(ckpt), TextTokenizer(ckpt), load_generation_defaults(ckpt)
        lm = load_lm(ckpt, load_format="dummy", dtype=torch.bfloat16, device="cuda")
        decoder = load_speech_tokenizer(ckpt, "cuda", torch.bfloat16, "dummy", with_encoder=False).eval().decoder

    def speech(i: int) -> SpeechRequest:
        voice = VOICES[i % len(VOICES)]
        return SpeechRequest(text=TEXT, voice=voice, language="English", max_new_tokens=400, ignore_eos=True, seed=i)

    requests = [prepare_request(speech(i), cfg, tok, defaults=defaults) for i in range(max(BATCHES))]
    runner = Qwen3TTSRunner(lm, max_batch_size=max(BATCHES), max_len=SPAN + 128)
    runner.batch_buckets = BATCHES
    runner.length_buckets = (SPAN,)
    runner.prefill_buckets = (128,)
    capture_s = runner.capture_graphs()
    pool = CodecWindows(decoder, 256, windows=(1, 2, 25), max_batch=128)
    pool.batch_buckets = BATCHES
    capture_s += pool.capture_graphs()
    result["setup_s"] = time.perf_counter() - t0
    result["capture_s"] = capture_s
    result["prompt_positions"] = requests[0].prompt.prefill_len
    print(f"setup {result['setup_s']:.1f} s (capture {capture_s:.1f} s)", flush=True)
    only = set(args.only.split(","))
    if "gpu" in only:
        attempt(result, "gpu_alone", lambda: exp_gpu(runner, pool))
    if "gil" in only:
        attempt(result, "gil", lambda: exp_gil(runner, requests))
    if "codec" in only:
        attempt(result, "codec", lambda: exp_codec(runner, requests, pool))
    if "prefill" in only:
        attempt(result, "prefill", lambda: exp_prefill(runner, requests))
    if "kernels" in only:
        attempt(result, "kernels", lambda: exp_kernels(runner))
    print_table(result)
    return 0


def print_table(r: dict) -> None:
    print(f"\n{r['gpu']}, torch {r['torch']}, commit {r['git_commit']}, {r['size']}")
    gpu, gil = r.get("gpu_alone", {}), r.get("gil", {})
    for b in BATCHES:
        g = gil.get(b, {}) if isinstance(gil, dict) else {}
        step = gpu.get("step_graph_ms", {}).get(b) if isinstance(gpu, dict) else None
        nan = float("nan")
        print(
            f"B={b:4d} step GPU {step or nan:6.2f} ms | step wall alone {g.get('alone_ms', nan):6.2f}"
            f" busy@5ms {g.get('busy_5ms_ms', nan):6.2f} busy@0.5ms {g.get('busy_0.5ms_ms', nan):6.2f}"
        )
    codec = r.get("codec", {})
    if isinstance(codec, dict):
        for b, entry in codec.items():
            if not isinstance(entry, dict) or "job" not in entry:
                continue
            print(f"B={b} codec job {entry['job']}:")
            for mode, m in entry.items():
                if isinstance(m, dict):
                    print(
                        f"   {mode:20s} step {m['step_wall_ms_p50']:6.2f} ms (loop {m['loop_ms_per_step']:6.2f})"
                        f" codec latency {m['codec_latency_ms_p50']:7.2f} ms GPU {m['codec_gpu_ms_p50']:7.2f} ms"
                    )
    prefill = r.get("prefill", {})
    if isinstance(prefill, dict):
        for k, e in prefill.items():
            if isinstance(e, dict) and "graph_prefill_ms" in e:
                print(
                    f"prefill {k} newcomers: eager {e['eager_prefill_ms']:.1f} ms,"
                    f" graph {e['graph_prefill_ms']:.1f} ms, embed {e['embed_ms_per_newcomer']:.2f} ms each"
                )


if __name__ == "__main__":
    raise SystemExit(main())
