"""Streaming TTS: TTFA, x real time and underruns at several concurrencies, in process or over HTTP / WebSocket.

Each run builds a real-size checkpoint with random weights (``load_format="dummy"``, bf16 on CUDA) from
``benchmarks/configs`` (``--tiny``: the tiny test checkpoint, for a CPU smoke run) and drives it with
``--frames`` frames per request, EOS suppressed (``ignore_eos``), at each concurrency, over each ``--transport``,
in each ``--voice-mode`` (``tts_clients.py``): ``custom`` (CustomVoice, the default) or, on a Base checkpoint,
``clone`` (reference audio and its transcript with every request), ``clone-xvec`` (the reference's speaker
embedding alone), ``voice`` / ``voice-xvec`` (voices uploaded once, then named). The modes of one run share one
server (or one engine) and write one result each, tagged ``<size>-<mode>`` (CustomVoice keeps the bare size):

- ``inproc``: ``engine.speech()`` in this process; TTFA from the call to the first ``Audio`` chunk in the
  consumer; adds the worker's wall time per talker step and per codec window job.
- ``http``: the real server (``omni-stream serve --load-format dummy --enable-benchmark-fields`` in a
  subprocess), raw PCM streaming (``stream_format="audio"``) with httpx; TTFA from sending the request to the
  first audio byte.
- ``ws``: the same server over ``/v1/audio/speech/stream`` (``session.config`` with ``stream_audio``, then
  ``input.text`` + ``input.done``); TTFA from sending ``input.text`` to the first binary frame (the connection
  and its config are set up before, outside the clock).

Per request: TTFA, x real time (audio seconds / seconds from the send to the last chunk), underrun
(PERFORMANCE.md, ``omni_stream.metrics.underrun_of``; continuity OK = under 100 ms) and whether exactly
``--frames`` frames of audio came back. Per level: aggregate x real time (all audio / wall from the first send
to the last chunk); in process, what newcomers' prefills cost the batch (steps holding newcomers against steps of
running rows alone, the prompts' positions) and each voice-prompt extraction on the worker; over the server, the
engine's own step time, batch size and TTFA from ``/metrics``, and over
HTTP how much of the time to first audio passed on the client's side (``HTTP_PHASES``: connected, request sent;
p50 and p95).
Writes ``tts_bench_<size>[_<transport>].json`` (inproc keeps the bare name) to ``$OUT`` or ``benchmarks/results``.

GPU machine (H200 image: no starlette, uvicorn, websockets, python-multipart, platformdirs, soundfile, av,
lameenc). Here, in the repository root, once (``/.whl/`` is git-ignored)::

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform manylinux1_x86_64 -d .whl starlette==1.10.0 uvicorn==0.54.0 websockets==17.4 \
      python-multipart==0.0.34 platformdirs==4.14.8 soundfile==0.14.0 cffi==2.1.1 pycparser==3.12 \
      av==18.1.0 lameenc==1.9.0

(``benchmarks/gpu_wheels.sh`` fetches these and the other benchmarks' wheels; ``benchmarks/gpu_suite.sh`` runs
every GPU benchmark in one call) and after every change to the tree (the package itself travels as a wheel;
~38 MB in all)::

    rm -f .whl/omni_stream-*.whl && python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl .

Then one command there (carry ``.whl``), per size, under the 10-minute limit::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 || exit; \
    python3 benchmarks/tts_bench.py --size 1.7b --transport http,ws && python3 benchmarks/tts_bench.py --summarize

Voice cloning (1.7B Base, c = 1 and 64; the server's voices are uploaded before the levels)::

    python3 benchmarks/tts_bench.py --size 1.7b --transport ws --levels 1,64 --voice-mode clone,voice,voice-xvec

CPU smoke run (tests/test_tts_bench_cpu.py):
``python benchmarks/tts_bench.py --device cpu --tiny --levels 1,2 --frames 6 --transport inproc,http,ws``, and with
``--voice-mode clone,clone-xvec,voice,voice-xvec``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from provenance import git_commit
from tts_clients import (
    FRAME_S,
    HTTP_PHASES,
    TEXT,
    VOICE_MODES,
    VOICES,
    RequestFields,
    Spoken,
    http_request,
    inproc_request,
    mode_kind,
    ws_request,
)

from omni_stream.metrics import percentile


def n_frames(codes) -> int:
    """Frames in a codec window's codes: one ``[n, 16]`` tensor, or its pieces in frame order."""
    return int(codes.shape[0]) if hasattr(codes, "shape") else sum(int(piece.shape[0]) for piece in codes)


ROOT = Path(__file__).resolve().parent
CONFIGS = {  # CustomVoice
    "0.6b": ROOT / "configs" / "qwen3-tts-12hz-0.6b-customvoice",
    "1.7b": ROOT / "configs" / "qwen3-tts-12hz-1.7b-customvoice",
}
BASE_CONFIGS = {  # Base (voice cloning): the same talker, no built-in voices, the speaker encoder
    "0.6b": ROOT / "configs" / "qwen3-tts-12hz-0.6b-base",
    "1.7b": ROOT / "configs" / "qwen3-tts-12hz-1.7b-base",
}
TRANSPORTS = ("inproc", "http", "ws")
TRANSPORT_DETAIL = {
    "inproc": "in-process engine.speech(); TTFA from the call to the first Audio chunk",
    "http": "omni-stream serve over HTTP/1.1 loopback, raw PCM streaming (stream_format=audio), httpx client (a fresh "
    "pool each level); TTFA from sending the request to the first audio byte",
    "ws": "omni-stream serve over WebSocket loopback (session.config stream_audio, input.text + input.done), "
    "websockets client; TTFA from sending input.text to the first binary frame",
}
CONTINUITY_S = 0.1
WARMUP_FRAMES = 12
__all__ = ["CONFIGS", "TEXT", "VOICES", "free_port", "out_dir", "wait_healthy"]  # what the other benchmarks import


def out_dir() -> Path:
    path = Path(os.environ.get("OUT") or ROOT / "results")
    path.mkdir(parents=True, exist_ok=True)
    return path


def result_path(tag: str, transport: str) -> Path:
    return out_dir() / (f"tts_bench_{tag}.json" if transport == "inproc" else f"tts_bench_{tag}_{transport}.json")


def write_checkpoint(size: str, kind: str, tiny: bool, out: Path, dtype: torch.dtype) -> Path:
    """The benchmark's checkpoint: ``kind`` (custom_voice or base) at ``size``; real sizes without weight files
    (the server loads them with ``load_format="dummy"``), or the tiny test checkpoint (CPU smoke runs)."""
    from omni_stream.models.qwen3_tts.checkpoint import write_dummy_checkpoint, write_tiny_checkpoint

    if tiny:
        return write_tiny_checkpoint(out, kind, size, dtype=dtype)
    configs = BASE_CONFIGS if kind == "base" else CONFIGS
    return write_dummy_checkpoint(configs[size], out, dtype=dtype, weights=False)


class StepTimer:
    """Wraps the runner's step, the codec window job and the voice-prompt extraction to record the worker's wall time
    per call (in process only). Per step: newcomers prefilled, their prompts' positions, rows decoded."""

    def __init__(self, family) -> None:
        from omni_stream.models.qwen3_tts import codec_stage as stages

        self.steps: list[tuple[int, float]] = []
        self.step_detail: list[tuple[int, int, int, float]] = []  # (newcomers, their positions, decoded rows, wall)
        self.codec: list[tuple[int, int, float]] = []
        self.extractions: list[float] = []
        # Each newcomer's request id -> (start, end) of the talker call that admitted it (``perf_counter``), so a
        # request's first audio splits into its wait for that call, the call, and what came after it.
        self.admitted: dict[str, tuple[float, float]] = {}
        runner = family.runner
        step = runner.step

        def timed_step(batch):
            t0 = time.perf_counter()
            out = step(batch)
            wall = time.perf_counter() - t0
            self.steps.append((len(batch.prefill) + len(batch.decode), wall))
            positions = sum(seq.payload.prompt.prefill_len for seq in batch.prefill)
            self.step_detail.append((len(batch.prefill), positions, len(batch.decode), wall))
            for seq in batch.prefill:
                self.admitted[seq.payload.request_id] = (t0, t0 + wall)
            return out

        runner.step = timed_step
        if hasattr(family, "_extract_voice"):
            extract = family._extract_voice

            def timed_extract(*args, **kwargs):
                t0 = time.perf_counter()
                out = extract(*args, **kwargs)
                self.extractions.append(time.perf_counter() - t0)
                return out

            family._extract_voice = timed_extract
        decode = stages.decode_codec_windows

        def timed_decode(decoder, windows):
            t0 = time.perf_counter()
            out = decode(decoder, windows)
            self.codec.append((len(windows), n_frames(windows[0].codes), time.perf_counter() - t0))
            return out

        stages.decode_codec_windows = timed_decode
        slot_decode = stages.decode_slot_windows

        def timed_slot_decode(pool, jobs):
            t0 = time.perf_counter()
            out = slot_decode(pool, jobs)
            self.codec.append((len(jobs), n_frames(jobs[0].codes), time.perf_counter() - t0))
            return out

        stages.decode_slot_windows = timed_slot_decode
        slot_issue = stages.issue_slot_windows

        def timed_slot_issue(pool, jobs, completions):
            # Overlapped codec: the worker's own time per job is the launch (the audio comes back later).
            t0 = time.perf_counter()
            out = slot_issue(pool, jobs, completions)
            self.codec.append((len(jobs), n_frames(jobs[0].codes), time.perf_counter() - t0))
            return out

        stages.issue_slot_windows = timed_slot_issue

    def reset(self) -> None:
        self.admitted.clear()
        self.steps.clear()
        self.step_detail.clear()
        self.codec.clear()
        self.extractions.clear()

    def prefill_cost(self) -> dict:
        """What newcomers' prefills cost the batch: steps holding newcomers against steps of running rows alone
        (worker wall, p50), and the newcomers' prompt positions."""
        with_new = [(k, n, w) for k, n, _, w in self.step_detail if k]
        alone = [w for k, _, d, w in self.step_detail if not k and d]
        return {
            "prefill_steps": len(with_new),
            "prefill_step_wall_ms_p50": 1000 * percentile([w for *_, w in with_new], 50) if with_new else None,
            "decode_only_step_wall_ms_p50": 1000 * percentile(alone, 50) if alone else None,
            "prefill_newcomers_mean": statistics.fmean(k for k, _, _ in with_new) if with_new else None,
            "prefill_positions_per_newcomer_mean": (
                sum(n for _, n, _ in with_new) / sum(k for k, _, _ in with_new) if with_new else None
            ),
            "voice_extractions": len(self.extractions),
            "voice_extraction_wall_ms_p50": 1000 * percentile(self.extractions, 50) if self.extractions else None,
            "voice_extraction_wall_s_total": sum(self.extractions),
        }

    def summary(self, c: int) -> dict:
        steps = [s for _, s in self.steps]
        full = [s for n, s in self.steps if n == c]
        codec = [s for *_, s in self.codec]
        return {
            "talker_steps": len(steps),
            "step_wall_ms_p50": 1000 * percentile(steps, 50) if steps else None,
            "step_wall_ms_full_batch_p50": 1000 * percentile(full, 50) if full else None,
            "codec_jobs": len(codec),
            "codec_job_wall_ms_p50": 1000 * percentile(codec, 50) if codec else None,
            "codec_wall_s_total": sum(codec),
            "talker_wall_s_total": sum(steps),
            "codec_windows_per_job_mean": statistics.fmean(n for n, *_ in self.codec) if codec else None,
        } | self.prefill_cost()


class Driver:
    """Runs ``c`` concurrent requests over one transport; ``stats()`` adds what the engine measured meanwhile."""

    def __init__(
        self, transport: str, fields: RequestFields, *, engine=None, url: str = "", client=None, new_client=None
    ) -> None:
        """``fields``: every request's voice and first window; ``client``: the server's metrics and health;
        ``new_client()``: a fresh HTTP client for each level."""
        self.transport, self.fields, self.engine, self.url, self.client = transport, fields, engine, url, client
        self.new_client = new_client

    async def level(self, c: int, frames: int) -> list[dict]:
        spoken = [Spoken(i, TEXT, frames) for i in range(c)]
        fields = self.fields
        if self.transport == "inproc":
            return await asyncio.gather(*(inproc_request(self.engine, s, fields) for s in spoken))
        if self.transport == "http":
            # A fresh pool each level, as fresh listeners would come. With one pool for all levels, a level's
            # requests reached the server up to 2.5 s late while the pool held the previous level's idle
            # connections (the server's own TTFA stayed ~0.2 s; httpx's pool scans every pooled connection on
            # each request and release): a client artefact that cut c=128 by ~40 % after the lower levels
            # (results/tts_bench.md, run 20).
            async with self.new_client() as client:
                return await asyncio.gather(*(http_request(client, self.url, s, fields) for s in spoken))
        # Every session connects and sends its config first; then all utterances start together.
        start = asyncio.Barrier(c)
        ws_url = "ws" + self.url.removeprefix("http")
        return await asyncio.gather(*(ws_request(ws_url, s, fields, start) for s in spoken))

    async def engine_counters(self) -> dict[str, float]:
        """The talker's step-time and batch-size histogram sums and counts, from the server's /metrics."""
        from prometheus_client.parser import text_string_to_metric_families

        text = (await self.client.get(f"{self.url}/metrics")).text
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if not sample.name.endswith(("_sum", "_count")):
                    continue
                name = sample.name.removeprefix("omni_stream_")
                if sample.labels.get("scheduler") == "talker" or name.startswith("ttfa_seconds"):
                    out[name] = sample.value
        return out


def server_stats(before: dict[str, float], after: dict[str, float]) -> dict:
    """What the engine measured during one level: steps, mean model time per step, mean batch size."""

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    def mean_ms(name: str) -> float | None:
        n = delta(f"{name}_count")
        return 1000 * delta(f"{name}_sum") / n if n else None

    steps = delta("step_seconds_count")
    # Where a request's first audio waits, as the server saw it: from its creation to its admission into
    # the talker's batch, and to its first chunk (the client's TTFA minus these is the transport's share).
    return {
        "talker_steps": int(steps),
        "server_step_ms_mean": mean_ms("step_seconds"),
        "server_batch_size_mean": delta("batch_size_sum") / steps if steps else None,
        "server_queue_ms_mean": mean_ms("queue_seconds"),
        "server_ttfa_ms_mean": mean_ms("ttfa_seconds"),
    }


def summarize_level(c: int, reqs: list[dict], frames: int, samples_per_frame: int) -> dict:
    ttfa = [r["ttfa"] for r in reqs]
    und = [r["underrun"] for r in reqs]
    wall = max(r["end"] for r in reqs) - min(r["start"] for r in reqs)
    audio = sum(r["audio_s"] for r in reqs)
    return {
        "concurrency": c,
        "frames_per_request": frames,
        "audio_s_per_request": statistics.median(r["audio_s"] for r in reqs),
        "exact_length_rate": sum(r["samples"] == frames * samples_per_frame for r in reqs) / len(reqs),
        "ttfa_p50_ms": 1000 * percentile(ttfa, 50),
        "ttfa_p95_ms": 1000 * percentile(ttfa, 95),
        "ttfa_max_ms": 1000 * max(ttfa),
        "xrt_per_stream_p50": percentile([r["xrt"] for r in reqs], 50),
        "xrt_per_stream_min": min(r["xrt"] for r in reqs),
        "aggregate_xrt": audio / wall,
        "wall_s": wall,
        "underrun_p50_ms": 1000 * percentile(und, 50),
        "underrun_p99_ms": 1000 * percentile(und, 99),
        "continuity_ok_rate": sum(u < CONTINUITY_S for u in und) / len(und),
        "chunks_per_request_p50": statistics.median(r["chunks"] for r in reqs),
    } | {
        f"http_{phase}_ms_p{q}": 1000 * percentile([r[f"{phase}_s"] for r in reqs], q)
        for phase in HTTP_PHASES.values()
        if all(f"{phase}_s" in r for r in reqs)
        for q in (50, 95)
    }


def _ms(value: float | None) -> str:
    return "    -" if value is None else f"{value:5.2f}"


def print_level(tag: str, transport: str, lv: dict) -> None:
    step = lv.get("step_wall_ms_p50", lv.get("server_step_ms_mean"))
    print(
        f"[{tag} {transport}] c={lv['concurrency']:4d}"
        f" TTFA p50 {lv['ttfa_p50_ms']:8.1f} p95 {lv['ttfa_p95_ms']:8.1f} ms"
        f" | xRT/stream {lv['xrt_per_stream_p50']:6.2f} agg {lv['aggregate_xrt']:7.1f}"
        f" | underrun p50 {lv['underrun_p50_ms']:7.1f} p99 {lv['underrun_p99_ms']:7.1f} ms"
        f" ok {lv['continuity_ok_rate']:.2f} | exact length {lv['exact_length_rate']:.2f} | step {_ms(step)} ms"
        f" codec job {_ms(lv.get('codec_job_wall_ms_p50'))} ms"
        + (
            f" | server: queue {_ms(lv.get('server_queue_ms_mean'))} TTFA {_ms(lv.get('server_ttfa_ms_mean'))} ms"
            if "server_queue_ms_mean" in lv
            else ""
        )
        + (
            " | client p50 / p95: "
            + ", ".join(
                f"{p} {lv[f'http_{p}_ms_p50']:.1f} / {lv[f'http_{p}_ms_p95']:.1f}" for p in HTTP_PHASES.values()
            )
            + " ms"
            if "http_sent_ms_p50" in lv
            else ""
        ),
        flush=True,
    )


# --- one transport at every level ---


async def drive(driver: Driver, result: dict, args: argparse.Namespace, timer: StepTimer | None = None) -> None:
    """Warm up (one request, then a small burst; not measured), then every level in turn; saves after each."""
    warm = min(WARMUP_FRAMES, args.frames)
    await driver.level(1, warm)
    await driver.level(min(4, max(args.levels)), warm)
    path = result_path(result["size"], result["transport"])
    for c in args.levels:
        if timer is not None:
            timer.reset()
        before = await driver.engine_counters() if timer is None else {}
        reqs = await driver.level(c, args.frames)
        level = summarize_level(c, reqs, args.frames, result["samples_per_frame"])
        if timer is not None:
            family = driver.engine.models.speech()
            level.update(timer.summary(c))
            level["graph_steps"] = family.runner.graph_steps
            level["eager_steps"] = family.runner.eager_steps
            cw = getattr(family, "codec_windows", None)
            level["codec_graph_jobs"] = cw.graph_jobs if cw is not None else 0
            level["codec_eager_jobs"] = cw.eager_jobs if cw is not None else None
        else:
            level.update(server_stats(before, await driver.engine_counters()))
        result["levels"].append(level)
        print_level(result["size"], result["transport"], level)
        path.write_text(json.dumps(result, indent=2) + "\n")


def mode_tag(args: argparse.Namespace, mode: str) -> str:
    """The result's tag: the size, the voice mode unless CustomVoice, then ``--tag-suffix``."""
    size = f"tiny-{args.size}" if args.tiny else args.size
    return size + ("" if mode == "custom" else f"-{mode}") + args.tag_suffix


def base_result(args: argparse.Namespace, transport: str, fields: RequestFields) -> dict:
    kind = mode_kind([fields.mode])
    config = (BASE_CONFIGS if kind == "base" else CONFIGS)[args.size]
    result: dict = {
        "size": mode_tag(args, fields.mode),
        "model": f"tiny-{args.size}-{kind}" if args.tiny else config.name,
        "transport": transport,
        "transport_detail": TRANSPORT_DETAIL[transport],
        "git_commit": git_commit(),
        "device": args.device,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "dtype": args.dtype,
        "max_batch": args.max_batch,
        "sampling": "checkpoint defaults (talker top-k 50 T 0.9 rep 1.05; code predictor top-k 50 T 0.9)",
        "initial_frames": args.initial_frames,
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("OMNI_STREAM_") and "KEY" not in k},
        "levels": [],
    } | fields.describe()
    try:
        import transformers

        result["transformers"] = transformers.__version__
    except ImportError:
        result["transformers"] = None
    return result


def request_fields(args: argparse.Namespace, mode: str) -> RequestFields:
    return RequestFields(mode, args.ref_seconds, args.ref_pool, args.initial_frames)


async def load_engine(ckpt: Path, args: argparse.Namespace, label: str, *, record: bool = False):
    """The in-process engine on ``ckpt`` (dummy weights), with its load and capture times; ``record``: its device
    worker keeps a log of its work (``engine.worker.log``, for a work profile)."""
    from omni_stream.engine import AsyncEngine

    t0 = time.perf_counter()
    engine = await AsyncEngine.from_pretrained(
        ckpt,
        device=args.device,
        dtype=args.dtype,
        load_format="dummy",
        max_batch_size=args.max_batch,
        progress=True,
        record=record,
    )
    family = engine.models.speech()
    info = {
        "load_s": time.perf_counter() - t0,
        "samples_per_frame": round(engine.speech_info.sample_rate * FRAME_S),
        "graph_capture_s": getattr(family, "capture_seconds", 0.0),
        "graphs": len(family.runner.graphs or ()),
        "step_ahead": family.runner.ahead,
    }
    print(f"[{label} inproc] loaded in {info['load_s']:.1f} s (graph capture {info['graph_capture_s']:.1f} s, "
          f"{info['graphs']} graphs)", flush=True)  # fmt: skip
    return engine, info


async def run_inproc(ckpt: Path, args: argparse.Namespace) -> None:
    engine, info = await load_engine(ckpt, args, args.tag)
    family = engine.models.speech()
    timer = StepTimer(family)
    async with engine:
        for mode in args.modes:
            fields = request_fields(args, mode)
            result = base_result(args, "inproc", fields) | info
            result["voice_prompt_s"] = await fields.extract(engine)
            await drive(Driver("inproc", fields, engine=engine), result, args, timer)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server_process(
    ckpt: Path, args: argparse.Namespace, port: int, voices: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen]:
    """``omni-stream serve`` on ``ckpt`` with dummy weights and benchmark fields; SIGTERM (then kill) on exit.

    ``env``: variables set for the server beside this process's, and ``--flag`` keys: ``serve`` flags (an arm of an
    A/B run)."""
    cmd = [sys.executable, "-m", "omni_stream.cli", "serve", "--model", str(ckpt), "--load-format", "dummy",
           "--enable-benchmark-fields", "--device", args.device, "--dtype", args.dtype,
           "--max-concurrency", str(args.max_batch), "--host", "127.0.0.1", "--port", str(port),
           "--voices-dir", str(voices), "--log-level", "warning",
           "--served-model-name", served_name(port)]  # fmt: skip
    extra = {k: v for k, v in (env or {}).items() if not k.startswith("--")}
    cmd += [part for k, v in (env or {}).items() if k.startswith("--") for part in (k, v)]  # serve flags
    env = {**os.environ, **extra, "OMNI_STREAM_API_KEY": "", "PYTHONUNBUFFERED": "1"}
    print("$ " + " ".join(f"{k}={v}" for k, v in extra.items()) + (" " if extra else "") + " ".join(cmd), flush=True)
    # Start outside the repository: `python -m` puts the working directory first on sys.path, and the source tree's
    # omni_stream/ (without realtime/ and codecs/ mapped into it) would shadow an installed wheel.
    proc = subprocess.Popen(cmd, env=env, cwd=voices.parent)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def served_name(port: int) -> str:
    """The model id a benchmark's server on ``port`` answers with: its own, so a health check can tell it from another
    process's server that took the port between ``free_port()`` and the bind (parallel test workers)."""
    return f"omni-bench-{os.getpid()}-{port}"


async def wait_healthy(client, url: str, proc: subprocess.Popen, limit_s: float, model: str | None = None) -> float:
    """Seconds until ``/health`` answers 200 (for ``model``: naming that model); raises if the server exits or
    ``limit_s`` passes."""
    import httpx

    t0 = time.perf_counter()
    # The server is another process: its health endpoint is the only readiness signal there is, so poll it.
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode} before it was ready")
        if time.perf_counter() - t0 > limit_s:
            raise RuntimeError(f"the server was not ready after {limit_s:.0f} s")
        with contextlib.suppress(httpx.HTTPError):
            answer = await client.get(f"{url}/health", timeout=2.0)
            if answer.status_code == 200 and (model is None or answer.json().get("model") == model):
                return time.perf_counter() - t0
        await asyncio.sleep(0.25)


async def run_server(ckpt: Path, args: argparse.Namespace, transports: list[str], voices: Path) -> None:
    import httpx

    port = args.port or free_port()
    url = f"http://127.0.0.1:{port}"
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(args.request_timeout, connect=30.0)
    with server_process(ckpt, args, port, voices) as proc:
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            ready_s = await wait_healthy(client, url, proc, args.server_timeout, served_name(port))
            print(f"[{args.tag}] server ready in {ready_s:.1f} s (start, load, graph capture)", flush=True)
            model = (await client.get(f"{url}/v1/models")).json()["data"][0]
            for mode in args.modes:
                fields = request_fields(args, mode)
                upload_s = await fields.upload(client, url)
                for transport in transports:
                    result = base_result(args, transport, fields)
                    result["server_ready_s"] = ready_s
                    result["voice_upload_s"] = upload_s
                    result["samples_per_frame"] = round(model["sample_rate"] * FRAME_S)
                    fresh = functools.partial(httpx.AsyncClient, limits=limits, timeout=timeout)
                    driver = Driver(transport, fields, url=url, client=client, new_client=fresh)
                    await drive(driver, result, args)


async def run_size(args: argparse.Namespace) -> None:
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_checkpoint(args.size, args.kind, args.tiny, Path(tmp) / "ckpt", dtype)
        if "inproc" in args.transports:
            await run_inproc(ckpt, args)
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # the server process needs the memory this one cached
        served = [t for t in args.transports if t != "inproc"]
        if served:
            await run_server(ckpt, args, served, Path(tmp) / "voices")


# --- table and plot of saved results ---


def summarize(sizes: list[str]) -> int:
    """Print every saved result of the tags ``sizes`` as a Markdown table and plot them (``tts_bench.png``)."""
    results = {}
    for size in sizes:
        for transport in TRANSPORTS:
            path = result_path(size, transport)
            if path.exists():
                results[(size, transport)] = json.loads(path.read_text())
    if not results:
        print("no results")
        return 1
    # A Markdown table, as in benchmarks/results/tts_bench.md ("step ms": worker wall per talker step in
    # process, the engine's mean model time per step over the server).
    print("| size | transport | c | TTFA p50 ms | TTFA p95 ms | xRT/stream p50 | aggregate xRT | underrun p50/p99 ms "
          "| continuity OK | exact length | step ms | codec job ms |")  # fmt: skip
    print("|---" * 12 + "|")
    for (size, transport), res in results.items():
        for lv in res["levels"]:
            step = lv.get("step_wall_ms_p50", lv.get("server_step_ms_mean"))
            print(
                f"| {size} | {transport} | {lv['concurrency']} | {lv['ttfa_p50_ms']:.1f} | {lv['ttfa_p95_ms']:.1f}"
                f" | {lv['xrt_per_stream_p50']:.2f} | {lv['aggregate_xrt']:.1f}"
                f" | {lv['underrun_p50_ms']:.0f} / {lv['underrun_p99_ms']:.0f} | {lv['continuity_ok_rate']:.2f}"
                f" | {lv.get('exact_length_rate', float('nan')):.2f} | {_ms(step).strip()}"
                f" | {_ms(lv.get('codec_job_wall_ms_p50')).strip()} |"
            )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return 0
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for (size, transport), res in results.items():
        name = f"{size} {transport}"
        cs = [lv["concurrency"] for lv in res["levels"]]
        axes[0].plot(cs, [lv["ttfa_p50_ms"] for lv in res["levels"]], "o-", label=f"{name} p50")
        axes[0].plot(cs, [lv["ttfa_p95_ms"] for lv in res["levels"]], "x--", label=f"{name} p95")
        axes[1].plot(cs, [lv["aggregate_xrt"] for lv in res["levels"]], "o-", label=f"{name} aggregate")
        axes[1].plot(cs, [lv["xrt_per_stream_p50"] for lv in res["levels"]], "x--", label=f"{name} per stream")
        axes[2].plot(cs, [lv["underrun_p99_ms"] for lv in res["levels"]], "o-", label=f"{name} p99")
    titles = ("TTFA (ms)", "x real time", "underrun p99 (ms)")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streams")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    first = next(iter(results.values()))
    fig.suptitle(f"Qwen3-TTS CustomVoice, random weights, {first['gpu']}, commit {first['git_commit'][:12]}")
    fig.tight_layout()
    fig.savefig(out_dir() / "tts_bench.png", dpi=110)
    print(f"wrote {out_dir() / 'tts_bench.png'}")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(CONFIGS), default="1.7b")
    ap.add_argument("--tiny", action="store_true", help="the tiny test checkpoint of --size's shape (CPU smoke runs)")
    ap.add_argument("--levels", "--concurrency", dest="levels", default="1,4,16,32,64,128", help="concurrencies")
    ap.add_argument("--frames", type=int, default=150, help="frames per request (150 = 12 s of audio)")
    ap.add_argument("--max-batch", type=int, default=128, help="engine batch size (the server's --max-concurrency)")
    ap.add_argument("--transport", default="inproc", help="comma-separated: inproc, http, ws (default: inproc)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default=None, help="default: bf16 on CUDA, else fp32")
    ap.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    ap.add_argument("--server-timeout", type=float, default=900.0, help="seconds to wait for the server to load")
    ap.add_argument("--request-timeout", type=float, default=600.0, help="seconds a read may wait on a stream")
    ap.add_argument(
        "--initial-frames",
        type=int,
        default=None,
        help="first audio window of every request (initial_codec_chunk_frames; default: the engine's)",
    )
    ap.add_argument(
        "--voice-mode",
        default="custom",
        help=f"comma-separated voice modes, all of one checkpoint kind: {', '.join(VOICE_MODES)} (tts_clients.py)",
    )
    ap.add_argument("--ref-seconds", type=float, default=6.0, help="reference audio per clip (clone and voice modes)")
    ap.add_argument("--ref-pool", type=int, default=0, help="reference clips in turn (0: every request its own)")
    ap.add_argument("--tag-suffix", default="", help="appended to the result file's size tag (A/B runs)")
    ap.add_argument("--summarize", action="store_true", help="print the table of saved results and plot them")
    args = ap.parse_args(argv)
    args.levels = [int(x) for x in args.levels.split(",")]
    args.transports = [t.strip() for t in args.transport.split(",") if t.strip()]
    unknown = sorted(set(args.transports) - set(TRANSPORTS))
    if unknown or not args.transports:
        ap.error(f"--transport: unknown {unknown} (choose from {', '.join(TRANSPORTS)})")
    args.modes = [m.strip() for m in args.voice_mode.split(",") if m.strip()]
    try:
        args.kind = mode_kind(args.modes)
    except ValueError as exc:
        ap.error(f"--voice-mode: {exc}")
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    args.tag = (f"tiny-{args.size}" if args.tiny else args.size) + args.tag_suffix
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.summarize:
        sizes = [f"tiny-{s}" for s in ("1.7b", "0.6b")] if args.tiny else ["1.7b", "0.6b"]
        return summarize([s + ("" if m == "custom" else f"-{m}") for s in sizes for m in VOICE_MODES])
    asyncio.run(run_size(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
