"""Voice-agent latency over the real WebSocket (WS /v1/realtime): voice-to-voice and barge-in, N sessions.

Each session streams a microphone in real time (PCM16 appends at 24 kHz, 100 ms each unless ``--append-ms``):
silence, an utterance, then silence until the agent has answered for ``--barge-after`` seconds, then an
interrupting utterance. Turn detection ``server_vad`` or ``semantic_vad`` (``--turns``, both by default,
reported apart). Sessions speak all at once (the worst case) or at random times within ``--spread`` seconds
(``--arrivals``). On CPU (the synthetic cascade, 1 and 4 sessions) appends of 20, 40 and 100 ms gave the same
voice-to-voice within run-to-run spread (257-282 ms at 1 session): the 200 ms pause and the turn model bound it,
not the append size. Every level runs twice on the same
server, and the two rounds are reported apart: ``cold`` (the level's batch sizes seen for the first time) and
``warm``. Measured on the client:

- voice-to-voice: end of the user's speech -> first agent audio byte; also from ``speech_stopped`` arriving ->
  first audio byte (the server's part after its turn decision);
- its split, from the events' arrival times: turn decision (speech end -> ``speech_stopped``), transcript
  (-> ``input_audio_transcription.completed``), LM first clause (-> the first ``output_audio_transcript.delta``,
  which carries the first clause), TTS first audio (-> the first audio delta). Work started at a pause (the
  speculative transcript and the held answer) shows as parts near 0: they were ready when the turn ended;
- barge-in: start of the interrupting speech -> the last audio byte of the interrupted response (what a client
  plays at most after the user starts talking, before it even flushes its own buffer).

And on the server, per level: the end-of-turn model's pauses judged and its mean wait for a thread, wall time and
CPU time per call (``turn_model``, from the server's ``omni_stream_turn_model_seconds`` on ``/metrics``; a call
whose wall time is well over its CPU time waited on cores or the GIL), and where the device worker's time went while
it ran (``work`` in the JSON, a line under the level's row): its busy share and seconds per scheduler step, job and
batch (``omni_stream.runtime.work_profile`` over the worker's log, read from the benchmark server's ``GET
/bench/work``), and the event loop's preparation threads: jobs, their wait for a thread and their run time, for
turn detection's feeds (``work.turns``) and for prompts (``work.prepare``), how late the server's event loop ran a
10 ms timer (``work.loop_lag``), how late this client sent its appends (``mic_late_ms``: a late client delays what the
server hears), and the ASR's encoder passes and the utterances they encoded (``work.asr_encoder``: many passes of one
utterance each mean the transcripts arrived spread over many steps; ``buckets``: passes by the batch bucket they ran
at, and on CUDA ``device_ms_mean``: each bucket's mean device time by CUDA events, so a transcription step's wall
time can be told from the encoder's own). A slow part with an idle worker waited on
something other than the device.

And the turn's timeline on the server (``timeline`` in the JSON, a line per level): every session marks when its
quiet and pause were detected, the judgement was queued and decided, the speculative transcript was asked for,
submitted, began and ended, the answer's prompt was submitted, the engine's first text and audio came out, and each
turn event was queued (``omni_stream.realtime.agent.trace``, on ``time.monotonic()``, the client's clock too), each
placed against that session's end of speech (p50/p95 ms after it). Between consecutive marks of ``PHASE_MARKS`` (the
sessions' medians), what the device worker did (``phases``: its log over that window, a line each).

The server runs in a child process (``--serve``) so client and server do not share one interpreter.

The VAD is Silero from its wheel (the tone double's energy detector in CPU mode) and ``semantic_vad``'s end-of-turn
model Smart Turn v3.2 from pipecat-ai's wheel (on the GPU image: the model file ``benchmarks/gpu_wheels.sh``
carries); ``semantic_vad`` sessions speak the recorded utterances in every mode (Smart Turn judges speech, not
tones).

CPU mode (default): the tests' synthetic TTS and LM (``tests/synthetic``) with emulated device time per step
(``--tts-step-ms``, ``--lm-step-ms``) and the test doubles for VAD and ASR (``tests/realtime_doubles.py``: an energy
detector and a tone-naming recognizer; the utterances are tones it names). The tiny random Qwen3-TTS never stops
speaking and runs slower than real time on CPU, so it is not used there. GPU mode: pass real checkpoints (``--tts``,
``--lm``/``--lm-family``, ``--asr``, ``--vad module:attr``, ``--device cuda``), or ``--build dummy``: the benchmark
writes Qwen3-TTS 0.6B CustomVoice, Qwen3-0.6B and Whisper large-v3-turbo at their real sizes from ``benchmarks/configs``
(configs and tokenizers; ``load_format="dummy"``, random weights, bf16 on CUDA) and serves them with the server's silero
VAD (``--build tiny``: the tiny random checkpoints, for a CPU dry run of the same path). Whenever the ASR is not the
tone double, the utterances are recorded speech (``benchmarks/speech/*.wav``, espeak-ng at 24 kHz; silero hears no
speech in tones). ``--max-output-tokens`` bounds each reply and, with benchmark fields on, makes a random-weight LM
ignore EOS; ``--first-unit-tokens`` ends a reply's first spoken unit after that many tokens at the latest (``--build``:
8; a random-weight LM writes no clause boundary, so its first unit would be its whole reply); ``--asr-max-tokens``
bounds each transcript (a random-weight Whisper never ends one, and the response waits
for it; ``--build`` sets 24, about what a real model writes for the question).

GPU run, one command per turn detection (about 4 minutes each on one H200, builds and graph captures included):
``python3 benchmarks/voice_bench.py --build dummy --device cuda --turns semantic_vad`` and ``... --turns
server_vad`` (the wheels of ``tts_bench.py``; ``benchmarks/gpu_suite.sh`` runs it with the other benchmarks).

Writes JSON (``--out``, default ``$OUT/voice_bench_<mode>.json`` or ``benchmarks/results/``) and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import itertools
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))  # the synthetic families and the VAD and ASR test doubles (CPU mode)
sys.path.insert(0, str(HERE))

from worklog import fetch_worklog, last_seq, step_sequence, step_sequence_line, worklog_route  # noqa: E402

RATE = 24000
CHUNK = RATE // 10  # 100 ms appends
# --build: a reply's first spoken unit ends after 8 tokens at the latest, about a real model's first clause ("The
# weather in Paris today is sunny," is 9). A random-weight LM writes no clause boundary and few spaces: without a
# bound, its first unit was its whole 64-token reply (run 30: "LM first clause" 1.4 s at 16 sessions).
FIRST_UNIT_TOKENS = 8
REPLY = " ".join(f"Here is sentence {i} of the answer, long enough to keep speaking." for i in range(30))
SPEECH = HERE / "speech"  # question.wav, interruption.wav: espeak-ng, mono int16 at RATE
CONFIGS = HERE / "configs"
BUILDS = {  # --build dummy: real sizes from these configs
    "tts": CONFIGS / "qwen3-tts-12hz-0.6b-customvoice",
    "lm": CONFIGS / "qwen3-0.6b",
    "asr": CONFIGS / "whisper-large-v3-turbo",
}
SILERO = "omni_stream.models.silero_vad:SileroVad"  # VadParams -> detector, the server's default
ENERGY = "realtime_doubles:energy_vad"


def build_checkpoints(kind: str, root: Path) -> dict[str, str]:
    """``--build``: the TTS, LM and ASR directories, ``tiny`` random checkpoints or ``dummy`` real-size layouts."""
    import torch

    from omni_stream.models.causal_lm import checkpoint as lm_ckpt
    from omni_stream.models.qwen3_tts import checkpoint as tts_ckpt
    from omni_stream.models.whisper import checkpoint as asr_ckpt

    if kind == "tiny":
        return {
            "tts": str(tts_ckpt.write_tiny_checkpoint(root / "tts", "custom_voice", "0.6b")),
            "lm": str(lm_ckpt.write_tiny_checkpoint(root / "lm")),
            "asr": str(asr_ckpt.write_tiny_checkpoint(root / "asr")),
        }
    bf16 = torch.bfloat16
    return {
        "tts": str(tts_ckpt.write_dummy_checkpoint(BUILDS["tts"], root / "tts", dtype=bf16, weights=False)),
        "lm": str(lm_ckpt.write_dummy_checkpoint(BUILDS["lm"], root / "lm", dtype=bf16, weights=False)),
        "asr": str(asr_ckpt.write_dummy_checkpoint(BUILDS["asr"], root / "asr", dtype=bf16, weights=False)),
    }


# --- the server (child process) -----------------------------------------------------------------------------


def serve(args: argparse.Namespace) -> None:
    import importlib

    import synthetic
    import uvicorn
    from starlette.routing import Route
    from synthetic import write_checkpoint
    from synthetic.lm_family import write_lm_checkpoint

    from omni_stream.engine import AsyncEngine, ModelSource
    from omni_stream.family import ModelKind
    from omni_stream.realtime.agent.trace import SessionTraces
    from omni_stream.realtime.app import create_app
    from omni_stream.realtime.server import uvicorn_config
    from omni_stream.realtime.settings import Settings

    synthetic.register()  # the tests' synthetic families (no part of the package), for the CPU mode
    tmp = Path(tempfile.mkdtemp(prefix="voice-bench-"))
    if args.tts == "synthetic":
        tts = ModelSource(write_checkpoint(tmp / "tts", step_cost_ms=args.tts_step_ms))
    else:
        tts = ModelSource(Path(args.tts))
    if args.lm == "synthetic":
        lm = ModelSource(write_lm_checkpoint(tmp / "lm", reply_prefix=REPLY, step_cost_ms=args.lm_step_ms))
    else:
        lm = ModelSource(Path(args.lm), family=args.lm_family)
    if args.asr == "tone":
        from realtime_doubles import write_tone_asr

        asr = ModelSource(write_tone_asr(tmp / "asr"))
    else:
        asr = ModelSource(Path(args.asr))
    module, _, attr = args.vad.partition(":")
    vad_factory = getattr(importlib.import_module(module), attr)

    async def load() -> AsyncEngine:
        sources = {
            "tts": tts,
            "lm": ModelSource(lm.path, lm.family, kind=ModelKind.TEXT),
            "asr": ModelSource(asr.path, kind=ModelKind.TRANSCRIPTION),
        }
        return await AsyncEngine.load(
            sources,
            device=args.device,
            load_format=args.load_format,
            max_batch_size=args.max_batch,
            progress=False,
            record=True,  # the worker's log, for each level's work profile
        )

    traces = SessionTraces()
    settings = Settings(vad_factory=vad_factory, enable_benchmark_fields=args.max_output_tokens is not None,
                        realtime_transcription_max_tokens=args.asr_max_tokens,
                        realtime_bench_first_unit_tokens=args.first_unit_tokens, realtime_trace=traces)  # fmt: skip
    app = create_app(load, settings)
    lag = LoopLag()
    app.router.routes.insert(0, Route("/bench/work", work_route(app, lag)))
    app.router.routes.insert(0, Route("/bench/trace", trace_route(traces)))
    app.router.routes.insert(0, Route("/bench/worklog", worklog_route(app)))
    # serve's own uvicorn settings: per-message deflate off (with uvicorn's default, every event of every session
    # was compressed on the event loop, which the served product never does), the same message size limit
    config = uvicorn_config(app, host="127.0.0.1", port=args.port, log_level="warning")

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            self.lag_probe = asyncio.ensure_future(lag.run())
            print("READY", flush=True)  # the engine is loaded (lifespan) and the socket listens

    Server(config).run()


class LoopLag:
    """How late the server's event loop runs a timer (every ``PERIOD`` s): a loop busy with sessions' messages, or
    waiting on the GIL, delivers every event late by this much. The mean and max since the last :meth:`take`."""

    PERIOD = 0.01

    def __init__(self) -> None:
        self.total = self.worst = 0.0
        self.count = 0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.PERIOD
            await asyncio.sleep(self.PERIOD)
            late = max(0.0, loop.time() - due)
            self.total, self.count, self.worst = self.total + late, self.count + 1, max(self.worst, late)

    def take(self) -> dict[str, float | None]:
        out = {"mean_ms": round(1000 * self.total / self.count, 2) if self.count else None,
               "max_ms": round(1000 * self.worst, 2)}  # fmt: skip
        self.total = self.worst = 0.0
        self.count = 0
        return out


def work_route(app: Any, lag: LoopLag) -> Any:
    """``GET /bench/work`` (this benchmark's server only): the device worker's work profile since the last call
    (:mod:`omni_stream.runtime.work_profile`): where its time went while the level ran, idle included."""
    from starlette.responses import JSONResponse

    from omni_stream.family import ModelKind
    from omni_stream.runtime.offload import Lane, preparer
    from omni_stream.runtime.work_profile import work_profile

    read = {"seq": -1, "at": time.perf_counter()}
    encoded: dict[str, Any] = {"calls": 0, "utterances": 0, "buckets": {}, "device_ms": {}, "timed": {}}

    async def work(request: Any) -> Any:
        engine = app.state.omni.engine
        log = list(engine.worker.log)
        now = time.perf_counter()
        profile = work_profile(log, read["at"], now, after_seq=read["seq"])
        read["seq"], read["at"] = (log[-1].seq if log else read["seq"]), now

        def lane_use(lane: Lane) -> dict[str, Any]:
            jobs = preparer(lane=lane).take()
            return {"jobs": jobs.jobs, "wait_ms_mean": round(1000 * jobs.wait_s / jobs.jobs, 2) if jobs.jobs else None,
                    "wait_ms_max": round(1000 * jobs.max_wait_s, 2),
                    "run_ms_mean": round(1000 * jobs.run_s / jobs.jobs, 2) if jobs.jobs else None}  # fmt: skip

        # this loop's preparation threads: the prompts' and turn detection's (the sessions' audio feeds)
        prepare, turns, judge = lane_use(Lane.PROMPTS), lane_use(Lane.TURNS), lane_use(Lane.JUDGE)
        # the ASR's encoder passes (each a step's newcomers): few with many utterances each, or many with one
        kind = ModelKind.TRANSCRIPTION
        asr = getattr(engine.models.get(kind), "runner", None) if kind in engine.models else None
        calls, utterances = getattr(asr, "encoder_calls", 0), getattr(asr, "utterances_encoded", 0)
        encoder: dict[str, Any] = {"calls": calls - encoded["calls"], "utterances": utterances - encoded["utterances"]}
        encoded["calls"], encoded["utterances"] = calls, utterances
        if asr is not None:  # Whisper: its passes by batch bucket, and on CUDA each bucket's mean device time
            asr.time_encoder = True  # from the first read on (the warm-up's), so every level's passes are timed
            buckets, device_ms, timed = dict(asr.encoder_buckets), dict(asr.encoder_device_ms), dict(asr.encoder_timed)
            passes = {b: n - encoded["buckets"].get(b, 0) for b, n in sorted(buckets.items())}
            encoder["buckets"] = {str(b): n for b, n in passes.items() if n}
            # each bucket's device time over the passes timed since the last read (a pass's time is added at a later
            # step, so a pass still running at a read is counted in the next window, with its time)
            spent = {b: (ms - encoded["device_ms"].get(b, 0.0), timed[b] - encoded["timed"].get(b, 0))
                     for b, ms in device_ms.items()}  # fmt: skip
            encoder["device_ms_mean"] = {str(b): round(ms / n, 2) for b, (ms, n) in sorted(spent.items()) if n}
            encoded["buckets"], encoded["device_ms"], encoded["timed"] = buckets, device_ms, timed
        return JSONResponse({**profile.summary(), "prepare": prepare, "turns": turns, "judge": judge,
                             "asr_encoder": encoder, "loop_lag": lag.take()})  # fmt: skip

    return work


def trace_route(traces: Any) -> Any:
    """``GET /bench/trace`` (this benchmark's server only): the sessions' timelines since the last call
    (:mod:`omni_stream.realtime.agent.trace`)."""
    from starlette.responses import JSONResponse

    async def trace(request: Any) -> Any:
        return JSONResponse([{"session_id": t.session_id, "marks": list(t.marks)} for t in traces.take()])

    return trace


# The turn's steps (timeline marks, in order) between which phase_profiles says what the worker did.
PHASE_MARKS = ("speech_end", "vad:quiet", "asr:spec:submitted", "asr:spec:delta", "asr:spec:done", "lm:submitted",
               "engine:audio")  # fmt: skip


def phase_profiles(
    sessions: list[tuple[str, dict[str, float]]], timeline: dict[str, dict[str, Any]], log: list[Any]
) -> list[dict[str, Any]]:
    """What the device worker did in each phase of the answered turn: from one mark of :data:`PHASE_MARKS` to the
    next (the sessions' median times, placed at their median end of speech; marks no session reached are skipped),
    its work profile over that window."""
    from omni_stream.runtime.work_profile import work_profile

    ends = [marks["speech_end"] for _, marks in sessions if "speech_end" in marks]
    if not ends or not log:
        return []
    end = statistics.median(ends)
    points = [("speech_end", end)] + [
        (name, end + timeline[name]["p50"] / 1000)
        for name in PHASE_MARKS[1:]
        if name in timeline and timeline[name]["p50"] is not None
    ]
    phases = []
    for (a, ta), (b, tb) in itertools.pairwise(points):
        if tb <= ta:
            continue
        profile = work_profile(log, ta, tb).summary()
        steps = step_sequence(log, ta, tb)
        phases.append({"from": a, "to": b, "ms": round(1000 * (tb - ta), 1), **profile, "steps": steps})
    return phases


def phase_line(phase: dict[str, Any], top: int = 4) -> str:
    parts = ", ".join(f"{k} {1000 * v:.0f} ({phase['counts'][k]})" for k, v in list(phase["seconds"].items())[:top])
    busy = 100 * phase["busy_fraction"]
    line = f"      {phase['from']} -> {phase['to']}: {phase['ms']:.0f} ms, busy {busy:.0f}%: {parts}"
    if phase.get("steps") and phase["busy_fraction"] > 0:
        line += f"\n        in order (ms; +newcomers/running): {step_sequence_line(phase['steps'])}"
    return line


def fetch_work(port: int) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/bench/work", timeout=30) as response:
        return json.loads(response.read())


TurnModelCounts = dict[str, tuple[float, float, dict[float, float]]]


def fetch_turn_model(port: int) -> TurnModelCounts:
    """The server's ``omni_stream_turn_model_seconds`` histogram: phase -> (sum of seconds, count, cumulative count
    per bucket bound)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "omni_stream_turn_model_seconds":
            continue
        for sample in family.samples:
            phase = sample.labels.get("phase", "")
            if sample.name.endswith("_sum"):
                sums[phase] = sample.value
            elif sample.name.endswith("_count"):
                counts[phase] = sample.value
            elif sample.name.endswith("_bucket"):
                buckets.setdefault(phase, {})[float(sample.labels["le"])] = sample.value
    return {p: (sums.get(p, 0.0), counts.get(p, 0.0), buckets.get(p, {})) for p in ("wait", "run", "cpu")}


def p95_bound(before: dict[float, float], after: dict[float, float]) -> float | None:
    """The smallest bucket bound under which 95 % of the level's observations fall (seconds; inf past the last)."""
    total = after.get(float("inf"), 0.0) - before.get(float("inf"), 0.0)
    if total <= 0:
        return None
    for bound in sorted(after):
        if after[bound] - before.get(bound, 0.0) >= 0.95 * total:
            return bound
    return None


def turn_model_use(before: TurnModelCounts, after: TurnModelCounts) -> dict[str, Any]:
    """The end-of-turn model over one level: pauses judged and mean milliseconds per phase (wait for its thread,
    the call's wall time, its thread's CPU time in it: run well over cpu means the call waited on cores or the
    GIL), and the bucket bound under which 95 % of the waits and runs fell (sessions that pause together judge at
    once: the mean hides their peak)."""
    judged = int(after["run"][1] - before["run"][1])
    out: dict[str, Any] = {"judged": judged}
    for phase in ("wait", "run", "cpu"):
        total = after[phase][0] - before[phase][0]
        out[f"{phase}_ms_mean"] = round(1000 * total / judged, 2) if judged else None
    for phase in ("wait", "run"):
        bound = p95_bound(before[phase][2], after[phase][2])
        out[f"{phase}_ms_p95_under"] = None if bound is None else 1000 * bound
    return out


def turn_model_line(use: dict[str, Any]) -> str:
    return (f"    turn model: {use['judged']} pauses judged, mean wait {use['wait_ms_mean']} ms, "
            f"run {use['run_ms_mean']} ms (cpu {use['cpu_ms_mean']} ms); 95 % of waits under "
            f"{use['wait_ms_p95_under']} ms, of runs under {use['run_ms_p95_under']} ms")  # fmt: skip


def work_line(work: dict[str, Any], top: int = 5) -> str:
    """The profile in one line: busy share, then the largest pieces (seconds)."""
    seconds = sorted(work["seconds"].items(), key=lambda kv: -kv[1])[:top]
    counts = work.get("counts", {})

    def piece(name: str, value: float) -> str:  # a scheduler's steps: how many, and the mean step
        n = counts.get(name, 0)
        each = f" ({n} x {1000 * value / n:.1f} ms)" if name.startswith("step:") and n else ""
        return f"{name} {value:.2f}{each}"

    parts = ", ".join(piece(name, value) for name, value in seconds)
    # a pool that ran no job has no wait or run time: "-", not None
    p, t = ({k: "-" if v is None else v for k, v in work[pool].items()} for pool in ("prepare", "turns"))
    e = work["asr_encoder"]
    device = e.get("device_ms_mean", {})
    buckets = "; ".join(f"batch {b}: {n} pass{'es' * (n > 1)}" + (f" of {device[b]} ms" if b in device else "")
                        for b, n in e.get("buckets", {}).items())  # fmt: skip
    return (f"    worker busy {100 * work['busy_fraction']:.0f}% of {work['span_s']:.1f} s: {parts}\n"
            f"    turn detection threads: {t['jobs']} feeds, wait mean {t['wait_ms_mean']} ms (max {t['wait_ms_max']} "
            f"ms), run mean {t['run_ms_mean']} ms; preparation threads: {p['jobs']} jobs, wait mean "
            f"{p['wait_ms_mean']} ms (max {p['wait_ms_max']} ms), run mean {p['run_ms_mean']} ms; ASR encoder: "
            f"{e['calls']} passes for {e['utterances']} utterances" + (f" ({buckets})" if buckets else ""))  # fmt: skip


@contextlib.contextmanager
def server_process(args: argparse.Namespace) -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    forwarded = ["--tts", args.tts, "--lm", args.lm, "--asr", args.asr, "--vad", args.vad, "--device", args.device]
    forwarded += ["--tts-step-ms", str(args.tts_step_ms), "--lm-step-ms", str(args.lm_step_ms)]
    forwarded += ["--load-format", args.load_format, "--max-batch", str(args.max_batch)]
    if args.asr_max_tokens is not None:
        forwarded += ["--asr-max-tokens", str(args.asr_max_tokens)]
    if args.lm_family:
        forwarded += ["--lm-family", args.lm_family]
    if args.max_output_tokens is not None:
        forwarded += ["--max-output-tokens", str(args.max_output_tokens)]
    if args.first_unit_tokens is not None:
        forwarded += ["--first-unit-tokens", str(args.first_unit_tokens)]
    cmd = [sys.executable, __file__, "--serve", "--port", str(port), *forwarded]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=tempfile.gettempdir())
    try:
        deadline = time.monotonic() + args.server_timeout
        assert proc.stdout is not None
        while True:
            line = proc.stdout.readline()
            if line.strip() == "READY":
                break
            if (not line and proc.poll() is not None) or time.monotonic() > deadline:
                raise RuntimeError("the benchmark server did not start")
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


# --- one client session -------------------------------------------------------------------------------------


def round_names(rounds: int) -> list[str]:
    """A level's rounds: ``cold`` (its batch sizes new to the server), ``warm``, then ``warm2``, ``warm3``, ..."""
    if rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, got {rounds}")
    return ["cold", "warm", *(f"warm{i}" for i in range(2, rounds))][:rounds]


def utterance(words: list[str]) -> np.ndarray:
    from realtime_doubles import spoken_words

    return spoken_words(words, lead_ms=0, tail_ms=0)


def recorded(name: str) -> np.ndarray:
    """``benchmarks/speech/<name>.wav`` as int16 samples at ``RATE``."""
    import wave

    with wave.open(str(SPEECH / f"{name}.wav"), "rb") as w:
        if (w.getnchannels(), w.getsampwidth(), w.getframerate()) != (1, 2, RATE):
            raise ValueError(f"{name}.wav must be mono int16 at {RATE} Hz")
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").copy()


class Mic:
    """A real-time microphone: ``chunk``-sample appends (100 ms by default) at their wall-clock times; knows when
    each sample was 'spoken'."""

    def __init__(self, ws: Any, loop: asyncio.AbstractEventLoop, chunk: int = CHUNK) -> None:
        self.ws, self.loop, self.chunk = ws, loop, chunk
        self.t0 = loop.time()
        self.sent = 0  # samples
        self.late = 0.0  # the latest an append left after its due time (this client process's own lag)

    def time_of(self, sample: int) -> float:
        """Wall time at which stream sample ``sample`` was spoken."""
        return self.t0 + sample / RATE

    async def play(self, samples: np.ndarray) -> int:
        """Send ``samples`` in real time; returns the stream position where they began."""
        start = self.sent
        for i in range(0, samples.size, self.chunk):
            chunk = samples[i : i + self.chunk]
            due = self.time_of(self.sent + chunk.size)  # a chunk leaves once its last sample is 'recorded'
            await asyncio.sleep(max(0.0, due - self.loop.time()))
            self.late = max(self.late, self.loop.time() - due)
            audio = base64.b64encode(chunk.astype("<i2").tobytes()).decode()
            await self.ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
            self.sent += chunk.size
        return start

    async def silence_until(self, event: asyncio.Event, limit_s: float) -> None:
        quiet = np.zeros(self.chunk, np.int16)
        end = self.loop.time() + limit_s
        while not event.is_set() and self.loop.time() < end:
            await self.play(quiet)


async def one_session(url: str, args: argparse.Namespace, turns: str, delay: float = 0.0) -> dict[str, Any]:
    import websockets

    await asyncio.sleep(delay)  # random arrivals: this session's turn comes later
    loop = asyncio.get_running_loop()
    result: dict[str, Any] = {}
    async with websockets.connect(url, max_size=None) as ws:
        result["session_id"] = json.loads(await ws.recv())["session"]["id"]  # session.created
        await ws.recv()  # conversation.created
        if turns == "semantic_vad":
            vad: dict[str, Any] = {"type": "semantic_vad", "eagerness": args.eagerness}
        else:
            vad = {"type": "server_vad", "silence_duration_ms": args.silence_ms, "prefix_padding_ms": 300}
        session: dict[str, Any] = {"type": "realtime", "audio": {"input": {"turn_detection": vad}}}
        if args.max_output_tokens is not None:
            session["max_output_tokens"] = args.max_output_tokens
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        while json.loads(await ws.recv())["type"] != "session.updated":
            pass
        mic = Mic(ws, loop, RATE * args.append_ms // 1000)
        if args.asr == "tone" and turns == "server_vad":
            first, interruption = utterance(["three", "five"]), utterance(["seven"])
        else:
            first, interruption = recorded("question"), recorded("interruption")
        barge = asyncio.Event()
        done = asyncio.Event()
        marks: dict[str, float] = {}

        async def speak() -> None:
            await mic.play(np.zeros(CHUNK * 3, np.int16))
            start = await mic.play(first)
            marks["speech_end"] = mic.time_of(start + first.size)
            await mic.silence_until(barge, args.session_timeout)
            if not barge.is_set():
                return
            start = await mic.play(interruption)
            marks["barge_start"] = mic.time_of(start)
            await mic.silence_until(done, args.session_timeout)

        async def listen() -> None:
            rid, audio_s = None, 0.0
            async for raw in ws:
                event = json.loads(raw)
                kind, now = event["type"], loop.time()
                if kind == "input_audio_buffer.speech_stopped" and "stopped" not in marks:
                    marks["stopped"] = now
                elif kind == "conversation.item.input_audio_transcription.completed" and "transcript" not in marks:
                    marks["transcript"] = now
                elif kind == "response.output_audio_transcript.delta" and "first_text" not in marks:
                    marks["first_text"] = now
                    result["first_clause_words"] = len(event["delta"].split())
                elif kind == "response.output_audio.delta" and (rid is None or event["response_id"] == rid):
                    rid = event["response_id"]
                    marks.setdefault("first_audio", now)
                    marks["last_audio"] = now
                    audio_s += len(base64.b64decode(event["delta"])) / 2 / RATE
                    if audio_s >= args.barge_after:
                        barge.set()
                elif kind == "response.done" and event["response"]["id"] == rid:
                    result["status"] = event["response"]["status"]
                    result["reason"] = (event["response"].get("status_details") or {}).get("reason")
                    done.set()
                    return
                elif kind == "error":
                    result.setdefault("errors", []).append(event["error"]["code"])

        async with asyncio.timeout(args.session_timeout):
            await asyncio.gather(speak(), listen())
    result["marks"] = marks  # loop.time() is time.monotonic(): the server's timeline clock (trace_line)
    if "first_audio" in marks:
        result["v2v_ms"] = 1000 * (marks["first_audio"] - marks["speech_end"])
        result["server_v2v_ms"] = 1000 * (marks["first_audio"] - marks["stopped"])
        result["split_ms"] = split(marks)
    result["mic_late_ms"] = 1000 * mic.late
    if "barge_start" in marks and result.get("status") == "cancelled":
        result["barge_in_ms"] = 1000 * (marks["last_audio"] - marks["barge_start"])
    return result


def split(marks: dict[str, float]) -> dict[str, float]:
    """End of speech -> first audio as consecutive parts (each from the later of the marks before it)."""
    stopped = marks["stopped"]
    transcript = max(marks.get("transcript", stopped), stopped)
    first_text = max(marks.get("first_text", transcript), transcript)
    first_audio = max(marks["first_audio"], first_text)
    return {
        "turn_decision": 1000 * (stopped - marks["speech_end"]),
        "transcript": 1000 * (transcript - stopped),
        "lm_first_clause": 1000 * (first_text - transcript),
        "tts_first_audio": 1000 * (first_audio - first_text),
    }


# --- levels -------------------------------------------------------------------------------------------------


def summary(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "mean": None, "max": None}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {
        "p50": round(statistics.median(ordered), 1),
        "p95": round(p95, 1),
        "mean": round(statistics.fmean(ordered), 1),
        "max": round(ordered[-1], 1),
    }


async def run_level(
    url: str, n: int, args: argparse.Namespace, turns: str = "server_vad", arrivals: str = "at-once", round_: str = ""
) -> dict[str, Any]:
    import random

    rng = random.Random(n)
    delays = [0.0 if arrivals == "at-once" else rng.uniform(0, args.spread) for _ in range(n)]
    started = time.perf_counter()
    outcomes = await asyncio.gather(*(one_session(url, args, turns, d) for d in delays), return_exceptions=True)
    wall = time.perf_counter() - started
    ok = [o for o in outcomes if isinstance(o, dict)]
    failures = [f"{type(o).__name__}: {o}" for o in outcomes if not isinstance(o, dict)]
    parts = ("turn_decision", "transcript", "lm_first_clause", "tts_first_audio")
    return {
        "turns": turns,
        "arrivals": arrivals,
        "round": round_,
        "concurrency": n,
        "sessions": n,
        "answered": sum("v2v_ms" in o for o in ok),
        "interrupted": sum(o.get("status") == "cancelled" for o in ok),
        "voice_to_voice_ms": summary([o["v2v_ms"] for o in ok if "v2v_ms" in o]),
        "server_voice_to_voice_ms": summary([o["server_v2v_ms"] for o in ok if "server_v2v_ms" in o]),
        "split_ms": {p: summary([o["split_ms"][p] for o in ok if "split_ms" in o]) for p in parts},
        "barge_in_ms": summary([o["barge_in_ms"] for o in ok if "barge_in_ms" in o]),
        # the first spoken unit's length: the LM's first-clause time is the tokens it took to write it
        "first_clause_words": summary([o["first_clause_words"] for o in ok if "first_clause_words" in o]),
        # each session's latest append (after its due time): a late client delays the server's view of the speech
        "mic_late_ms": summary([o["mic_late_ms"] for o in ok if "mic_late_ms" in o]),
        "error_events": sorted({e for o in ok for e in o.get("errors", [])}),
        "failures": failures[:5],
        "wall_s": round(wall, 2),
        "_sessions": [(o["session_id"], o["marks"]) for o in ok],  # placed against the server's timelines, then dropped
    }


def fetch_trace(port: int) -> dict[str, list[tuple[str, float]]]:
    """The server's session timelines since the last call (``GET /bench/trace``): session id -> marks."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/bench/trace", timeout=30) as response:
        return {t["session_id"]: [(name, at) for name, at in t["marks"]] for t in json.loads(response.read())}


def turn_timeline(
    sessions: list[tuple[str, dict[str, float]]], timelines: dict[str, list[tuple[str, float]]]
) -> dict[str, dict[str, float | None]]:
    """Each server mark of the answered turn, ms after the end of the user's speech, over the sessions (p50, p95,
    ...): the first of each name from 300 ms before the speech's end (a quiet can fall inside the recording's tail) to
    the first audio byte's arrival at the client, in the order of their medians. ``client:first_audio`` is that
    arrival."""
    offsets: dict[str, list[float]] = {}
    for sid, marks in sessions:
        end, first_audio = marks.get("speech_end"), marks.get("first_audio")
        if end is None or first_audio is None:
            continue
        seen: set[str] = set()
        for name, at in sorted(timelines.get(sid, []), key=lambda m: m[1]):
            if name in seen or not end - 0.3 <= at <= first_audio:
                continue
            seen.add(name)
            offsets.setdefault(name, []).append(1000 * (at - end))
        offsets.setdefault("client:first_audio", []).append(1000 * (first_audio - end))
    stats = {name: summary(values) | {"sessions": len(values)} for name, values in offsets.items()}
    return dict(sorted(stats.items(), key=lambda kv: kv[1]["p50"] if kv[1]["p50"] is not None else math.inf))


def trace_line(timeline: dict[str, dict[str, float | None]]) -> str:
    parts = [f"{name} {s['p50']:.0f}/{s['p95']:.0f}" for name, s in timeline.items() if s["p50"] is not None]
    return "    server timeline, ms after speech end (p50/p95): " + ", ".join(parts)


def table(levels: list[dict[str, Any]]) -> str:
    names = ("turns", "arrivals", "round", "sessions", "answered", "v2v p50", "v2v p95", "srv p50", "turn p50",
             "asr p50", "lm p50", "tts p50", "barge p50", "barge p95")  # fmt: skip
    rows = [" ".join(f"{name:>12}" for name in names)]
    for lv in levels:
        v, s, b, sp = lv["voice_to_voice_ms"], lv["server_voice_to_voice_ms"], lv["barge_in_ms"], lv["split_ms"]
        cells = (lv["turns"], lv["arrivals"], lv["round"], lv["concurrency"], lv["answered"], v["p50"], v["p95"],
                 s["p50"], sp["turn_decision"]["p50"], sp["transcript"]["p50"], sp["lm_first_clause"]["p50"],
                 sp["tts_first_audio"]["p50"], b["p50"], b["p95"])  # fmt: skip
        rows.append(" ".join(f"{x!s:>12}" for x in cells))
    rows.append(
        "(ms; v2v: the user's speech end -> the agent's first audio byte at the client; barge: the interruption's "
        "start -> the interrupted answer's last audio byte, negative where that byte came before the interruption)"
    )
    return "\n".join(rows)


def round_summary(levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each level's v2v p95 across its rounds (mean, min, max; in ms), for levels run more than once: between
    rounds of one level the 16- and 32-session figures move by 100 ms and more, so an A/B compares these."""
    groups: dict[tuple[str, str, int], list[float]] = {}
    for lv in levels:
        groups.setdefault((lv["turns"], lv["arrivals"], lv["concurrency"]), []).append(lv["voice_to_voice_ms"]["p95"])
    return [
        {"turns": t, "arrivals": a, "sessions": n, "rounds": len(p95s),
         "v2v_p95_mean_ms": round(sum(p95s) / len(p95s), 1), "v2v_p95_min_ms": min(p95s), "v2v_p95_max_ms": max(p95s)}
        for (t, a, n), p95s in groups.items()
        if len(p95s) > 1 and all(isinstance(x, int | float) for x in p95s)
    ]  # fmt: skip


def summary_lines(summary: list[dict[str, Any]]) -> str:
    return "\n".join(
        f"{s['turns']} {s['arrivals']} {s['sessions']} sessions: v2v p95 over {s['rounds']} rounds mean "
        f"{s['v2v_p95_mean_ms']} ms (min {s['v2v_p95_min_ms']}, max {s['v2v_p95_max_ms']})"
        for s in summary
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="1,4,16,32,64", help="concurrent sessions per level (default: %(default)s)")
    ap.add_argument("--turns", default="server_vad,semantic_vad", help="turn detections (default: %(default)s)")
    ap.add_argument("--arrivals", default="at-once,random", help="at-once and/or random (default: %(default)s)")
    ap.add_argument("--spread", type=float, default=3.0, help="random arrivals: seconds they spread over")
    ap.add_argument("--eagerness", default="auto", help="semantic_vad eagerness (default: %(default)s)")
    ap.add_argument("--smoke", action="store_true", help="levels 1,2 and a short run (CI)")
    ap.add_argument("--tts", default="synthetic", help="'synthetic' or a checkpoint directory")
    ap.add_argument("--lm", default="synthetic", help="'synthetic' or a checkpoint directory")
    ap.add_argument("--lm-family", default=None, help="backend for --lm (e.g. vllm); default: its model_type")
    ap.add_argument("--asr", default="tone", help="'tone' (the test double) or a checkpoint directory")
    ap.add_argument("--vad", default=None, help=f"VAD factory module:attr (default: {ENERGY} with the tone ASR, "
                    f"else {SILERO})")  # fmt: skip
    ap.add_argument(
        "--build",
        choices=("tiny", "dummy"),
        default=None,
        help="write TTS, LM and ASR checkpoints: tiny random ones, or real sizes with dummy weights",
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--load-format", choices=("auto", "dummy"), default="auto")
    ap.add_argument("--max-batch", type=int, default=64, help="engine max_batch_size (default: %(default)s)")
    ap.add_argument("--asr-max-tokens", type=int, default=None, help="bound each transcript (--build: 24)")
    ap.add_argument("--tts-step-ms", type=float, default=4.0, help="synthetic TTS device time per frame step")
    ap.add_argument("--lm-step-ms", type=float, default=2.0, help="synthetic LM device time per token step")
    ap.add_argument("--max-output-tokens", type=int, default=None, help="bound each reply (random-weight LMs)")
    ap.add_argument("--first-unit-tokens", type=int, default=None,
                    help="a reply's first spoken unit ends after this many tokens at the latest (random-weight LMs "
                         "write no clause boundary; --build: 8, a real model's first clause)")  # fmt: skip
    ap.add_argument("--silence-ms", type=int, default=500, help="server VAD silence_duration_ms")
    ap.add_argument("--append-ms", type=int, default=100, choices=(10, 20, 40, 50, 100),
                    help="the microphone's appends (ms of audio each; default: %(default)s)")  # fmt: skip
    ap.add_argument("--barge-after", type=float, default=1.0, help="seconds of agent audio before interrupting")
    ap.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="rounds per level: cold, warm, then warm2, warm3, ... (default: %(default)s)",
    )
    ap.add_argument("--session-timeout", type=float, default=60.0)
    ap.add_argument("--server-timeout", type=float, default=600.0)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.build is not None and not args.serve:
        if args.build == "dummy":
            args.load_format = "dummy"
        if args.max_output_tokens is None:
            args.max_output_tokens = 64
        if args.asr_max_tokens is None:
            args.asr_max_tokens = 24
        if args.first_unit_tokens is None:
            args.first_unit_tokens = FIRST_UNIT_TOKENS
    if args.vad is None:
        args.vad = ENERGY if args.asr == "tone" and args.build is None else SILERO
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        serve(args)
        return 0
    from provenance import git_commit

    from omni_stream.runtime.settings import Tuning

    levels = [1, 2] if args.smoke else [int(x) for x in args.levels.split(",")]
    if args.smoke:
        args.barge_after = min(args.barge_after, 0.5)
        args.spread = min(args.spread, 0.5)
    mode = "cpu" if args.device == "cpu" else "gpu"
    if args.build is not None:
        mode += f"_{args.build}"
    results: list[dict[str, Any]] = []
    if args.build == "dummy":
        models = {k: f"{v.name} (random weights, real size)" for k, v in BUILDS.items()}
    elif args.build == "tiny":
        models = {k: "tiny random" for k in BUILDS}
    else:
        models = {"tts": args.tts, "lm": args.lm, "asr": args.asr}
    out = (
        args.out
        or Path(os.environ.get("OUT") or HERE / "results") / f"voice_bench_{mode}{'_smoke' if args.smoke else ''}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)

    def write_report(complete: bool) -> dict[str, Any]:
        """The report so far, written over ``out`` (after every level: a run cut short keeps what it measured)."""
        report = {
            "benchmark": "voice_bench",
            "mode": mode,
            "smoke": args.smoke,
            "complete": complete,
            "git_commit": git_commit(),
            "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()},
            "models": {**models, "vad": args.vad, "load_format": args.load_format, "max_batch": args.max_batch},
            "settings": {
                "tts_step_ms": args.tts_step_ms if args.tts == "synthetic" else None,
                "lm_step_ms": args.lm_step_ms if args.lm == "synthetic" else None,
                "silence_duration_ms": args.silence_ms,
                "eagerness": args.eagerness,
                "random_arrival_spread_s": args.spread,
                "barge_after_s": args.barge_after,
                "run_ahead_s": 2.0,
                "append_ms": args.append_ms,
                "utterances": "tones" if args.asr == "tone" else "recorded speech (benchmarks/speech)",
                "max_output_tokens": args.max_output_tokens,
                "asr_max_tokens": args.asr_max_tokens,
                "first_unit_tokens": args.first_unit_tokens,
                # the server's OMNI_STREAM_* switches (e.g. transcription_window_ms in an A/B)
                "tuning": Tuning.from_env().describe(),
            },
            "levels": results,
            "rounds": round_summary(results),
        }
        out.write_text(json.dumps(report, indent=2) + "\n")
        return report

    with contextlib.ExitStack() as stack:
        if args.build is not None:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="voice-bench-ckpt-")))
            built = build_checkpoints(args.build, root)
            args.tts, args.lm, args.asr = built["tts"], built["lm"], built["asr"]
        port = stack.enter_context(server_process(args))
        url = f"ws://127.0.0.1:{port}/v1/realtime"
        print(table([]), flush=True)
        # No warm-up round: a level's first round is its cold one (its batch sizes new to the server).
        for turns in args.turns.split(","):
            for arrivals in args.arrivals.split(","):
                for n in levels:
                    for round_ in round_names(args.rounds):
                        fetch_work(port)  # the profile's window starts with the level
                        fetch_trace(port)
                        seen = last_seq(f"http://127.0.0.1:{port}")
                        judged = fetch_turn_model(port)
                        results.append(asyncio.run(run_level(url, n, args, turns, arrivals, round_)))
                        results[-1]["work"] = fetch_work(port)
                        sessions = results[-1].pop("_sessions")
                        results[-1]["timeline"] = turn_timeline(sessions, fetch_trace(port))
                        worklog = fetch_worklog(f"http://127.0.0.1:{port}", seen)
                        results[-1]["phases"] = phase_profiles(sessions, results[-1]["timeline"], worklog)
                        results[-1]["turn_model"] = turn_model_use(judged, fetch_turn_model(port))
                        print(table(results[-1:]).splitlines()[-1], flush=True)
                        print(work_line(results[-1]["work"]), flush=True)
                        words, late = results[-1]["first_clause_words"], results[-1]["mic_late_ms"]
                        loop_lag = results[-1]["work"]["loop_lag"]
                        print(f"    first spoken unit: {words['p50']} words p50 (max {words['max']}); client appends "
                              f"late by up to {late['p95']} ms p95 (max {late['max']}); server loop late by "
                              f"{loop_lag['mean_ms']} ms mean (max {loop_lag['max_ms']})", flush=True)  # fmt: skip
                        if turns == "semantic_vad":
                            print(turn_model_line(results[-1]["turn_model"]), flush=True)
                        print(trace_line(results[-1]["timeline"]), flush=True)
                        print("    the device worker in each phase, ms (count):", flush=True)
                        for phase in results[-1]["phases"]:
                            print(phase_line(phase), flush=True)
                        write_report(complete=False)
    report = write_report(complete=True)
    print(table(results))
    print(summary_lines(report["rounds"]))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
