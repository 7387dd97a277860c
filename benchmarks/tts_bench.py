"""Streaming TTS: TTFA, x real time and underruns at several concurrencies, in process or over HTTP / WebSocket.

Each run builds a real-size CustomVoice checkpoint with random weights (``load_format="dummy"``, bf16 on CUDA)
from ``benchmarks/configs`` (``--tiny``: the tiny test checkpoint, for a CPU smoke run) and drives it with
``--frames`` frames per request, EOS suppressed (``ignore_eos``), at each concurrency, over each ``--transport``:

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
to the last chunk); over the server, the engine's own step time, batch size and TTFA from ``/metrics``, and over
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

CPU smoke run (tests/test_tts_bench_cpu.py):
``python benchmarks/tts_bench.py --device cpu --tiny --levels 1,2 --frames 6 --transport inproc,http,ws``.
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

from omni_stream.metrics import percentile, underrun_of

ROOT = Path(__file__).resolve().parent
CONFIGS = {
    "0.6b": ROOT / "configs" / "qwen3-tts-12hz-0.6b-customvoice",
    "1.7b": ROOT / "configs" / "qwen3-tts-12hz-1.7b-customvoice",
}
TRANSPORTS = ("inproc", "http", "ws")
TRANSPORT_DETAIL = {
    "inproc": "in-process engine.speech(); TTFA from the call to the first Audio chunk",
    "http": "omni-stream serve over HTTP/1.1 loopback, raw PCM streaming (stream_format=audio), httpx client (a fresh "
    "pool each level); TTFA from sending the request to the first audio byte",
    "ws": "omni-stream serve over WebSocket loopback (session.config stream_audio, input.text + input.done), "
    "websockets client; TTFA from sending input.text to the first binary frame",
}
VOICES = ("vivian", "serena", "uncle_fu", "ryan", "aiden", "ono_anna", "sohee", "eric", "dylan")
TEXT = "The quick brown fox jumps over the lazy dog while the evening sun sets slowly behind the quiet hills."
FRAME_S = 0.08
CONTINUITY_S = 0.1
WARMUP_FRAMES = 12


def out_dir() -> Path:
    path = Path(os.environ.get("OUT") or ROOT / "results")
    path.mkdir(parents=True, exist_ok=True)
    return path


def result_path(tag: str, transport: str) -> Path:
    return out_dir() / (f"tts_bench_{tag}.json" if transport == "inproc" else f"tts_bench_{tag}_{transport}.json")


INITIAL_FRAMES: int | None = None  # --initial-frames: every request fixes its first window (None: the engine's)


def request_fields(i: int, frames: int) -> dict:
    """The speech fields of request ``i``: a fixed length (EOS suppressed), voices in turn, seeded."""
    fields = {"voice": VOICES[i % len(VOICES)], "language": "English", "max_new_tokens": frames, "ignore_eos": True,
              "seed": i}  # fmt: skip
    if INITIAL_FRAMES is not None:
        fields["initial_codec_chunk_frames"] = INITIAL_FRAMES
    return fields


def request_record(t0: float, arrivals: list[float], durations: list[float], samples: int) -> dict:
    """One request's figures from its send time and its chunks' arrival times and audio seconds."""
    if not arrivals:
        raise RuntimeError("a request returned no audio")
    audio_s = sum(durations)
    return {
        "start": t0,
        "ttfa": arrivals[0] - t0,
        "end": arrivals[-1],
        "audio_s": audio_s,
        "xrt": audio_s / (arrivals[-1] - t0),
        "underrun": underrun_of(arrivals, durations),
        "chunks": len(arrivals),
        "samples": samples,
    }


class StepTimer:
    """Wraps the runner's step and the codec window job to record worker wall time per call (in process only)."""

    def __init__(self, family) -> None:
        from omni_stream.models.qwen3_tts import codec_stage as stages

        self.steps: list[tuple[int, float]] = []
        self.codec: list[tuple[int, int, float]] = []
        runner = family.runner
        step = runner.step

        def timed_step(batch):
            t0 = time.perf_counter()
            out = step(batch)
            self.steps.append((len(batch.prefill) + len(batch.decode), time.perf_counter() - t0))
            return out

        runner.step = timed_step
        decode = stages.decode_codec_windows

        def timed_decode(decoder, windows):
            t0 = time.perf_counter()
            out = decode(decoder, windows)
            self.codec.append((len(windows), int(windows[0].codes.shape[0]), time.perf_counter() - t0))
            return out

        stages.decode_codec_windows = timed_decode
        slot_decode = stages.decode_slot_windows

        def timed_slot_decode(pool, jobs):
            t0 = time.perf_counter()
            out = slot_decode(pool, jobs)
            self.codec.append((len(jobs), int(jobs[0].codes.shape[0]), time.perf_counter() - t0))
            return out

        stages.decode_slot_windows = timed_slot_decode
        slot_issue = stages.issue_slot_windows

        def timed_slot_issue(pool, jobs, completions):
            # Overlapped codec: the worker's own time per job is the launch (the audio comes back later).
            t0 = time.perf_counter()
            out = slot_issue(pool, jobs, completions)
            self.codec.append((len(jobs), int(jobs[0].codes.shape[0]), time.perf_counter() - t0))
            return out

        stages.issue_slot_windows = timed_slot_issue

    def reset(self) -> None:
        self.steps.clear()
        self.codec.clear()

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
        }


# --- clients: one request each, from its send to its last chunk ---


async def inproc_request(engine, i: int, frames: int) -> dict:
    t0 = time.perf_counter()
    arrivals, durations, samples = [], [], 0
    async with engine.speech(TEXT, **request_fields(i, frames)) as stream:
        async for audio in stream:
            arrivals.append(time.perf_counter())
            durations.append(audio.samples.shape[0] / audio.sample_rate)
            samples += audio.samples.shape[0]
    return request_record(t0, arrivals, durations, samples)


# Where an HTTP request's time to first audio goes on the client's side, from httpcore's trace events (ms after
# the send): its connection ready (a fresh pool per level: every request connects) and the request written. The
# rest is the server's (it reads and checks the body, creates the engine request, and sends its status line with
# the first audio, so an early error is a plain HTTP error). Run 25, c=32: TTFA 125 ms, of which the connection
# 13.5 ms and the request written 16.4 ms (p50), the engine's own TTFA 79 ms (a mean): the WebSocket benchmark
# connects before its clock, so HTTP's figure holds ~16 ms more of the client's work.
HTTP_PHASES = {
    "http11.send_request_headers.started": "connected",
    "http11.send_request_body.complete": "sent",
}


async def http_request(client, url: str, i: int, frames: int) -> dict:
    body = {"input": TEXT, "response_format": "pcm", "stream_format": "audio", **request_fields(i, frames)}
    arrivals, durations, size = [], [], 0
    marks: dict[str, float] = {}

    async def trace(event: str, info: dict) -> None:
        if event in HTTP_PHASES:
            marks[HTTP_PHASES[event]] = time.perf_counter()

    t0 = time.perf_counter()
    request = client.stream("POST", f"{url}/v1/audio/speech", json=body, extensions={"trace": trace})
    async with request as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread()).decode(errors='replace')}")
        rate = int(response.headers["x-sample-rate"])
        async for data in response.aiter_raw():
            if data:
                arrivals.append(time.perf_counter())
                durations.append(len(data) / 2 / rate)  # int16 mono
                size += len(data)
    return request_record(t0, arrivals, durations, size // 2) | {f"{k}_s": v - t0 for k, v in marks.items()}


async def ws_request(ws_url: str, i: int, frames: int, start: asyncio.Barrier) -> dict:
    from websockets.asyncio.client import connect

    config = {"type": "session.config", "response_format": "pcm", "stream_audio": True, **request_fields(i, frames)}
    async with connect(f"{ws_url}/v1/audio/speech/stream", max_size=None, ping_interval=None) as ws:
        await ws.send(json.dumps(config))
        await start.wait()
        arrivals, durations, size, rate = [], [], 0, None
        t0 = time.perf_counter()
        await ws.send(json.dumps({"type": "input.text", "text": TEXT}))
        await ws.send(json.dumps({"type": "input.done"}))
        async for message in ws:
            if isinstance(message, bytes):
                arrivals.append(time.perf_counter())
                durations.append(len(message) / 2 / rate)
                size += len(message)
                continue
            event = json.loads(message)
            if event["type"] == "audio.start":
                rate = event["sample_rate"]
            elif event["type"] == "error" or event.get("error") is True:
                raise RuntimeError(f"WebSocket error: {event}")
            elif event["type"] == "session.done":
                break
    return request_record(t0, arrivals, durations, size // 2)


class Driver:
    """Runs ``c`` concurrent requests over one transport; ``stats()`` adds what the engine measured meanwhile."""

    def __init__(self, transport: str, *, engine=None, url: str = "", client=None, new_client=None) -> None:
        """``client``: the server's metrics and health; ``new_client()``: a fresh HTTP client for each level."""
        self.transport, self.engine, self.url, self.client = transport, engine, url, client
        self.new_client = new_client

    async def level(self, c: int, frames: int) -> list[dict]:
        if self.transport == "inproc":
            return await asyncio.gather(*(inproc_request(self.engine, i, frames) for i in range(c)))
        if self.transport == "http":
            # A fresh pool each level, as fresh listeners would come. With one pool for all levels, a level's
            # requests reached the server up to 2.5 s late while the pool held the previous level's idle
            # connections (the server's own TTFA stayed ~0.2 s; httpx's pool scans every pooled connection on
            # each request and release): a client artefact that cut c=128 by ~40 % after the lower levels
            # (results/tts_bench.md, run 20).
            async with self.new_client() as client:
                return await asyncio.gather(*(http_request(client, self.url, i, frames) for i in range(c)))
        # Every session connects and sends its config first; then all utterances start together.
        start = asyncio.Barrier(c)
        ws_url = "ws" + self.url.removeprefix("http")
        return await asyncio.gather(*(ws_request(ws_url, i, frames, start) for i in range(c)))

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


def base_result(args: argparse.Namespace, transport: str) -> dict:
    result: dict = {
        "size": args.tag,
        "model": f"tiny-{args.size}" if args.tiny else CONFIGS[args.size].name,
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
    }
    try:
        import transformers

        result["transformers"] = transformers.__version__
    except ImportError:
        result["transformers"] = None
    return result


async def run_inproc(ckpt: Path, args: argparse.Namespace) -> None:
    from omni_stream.engine import AsyncEngine

    result = base_result(args, "inproc")
    t0 = time.perf_counter()
    engine = await AsyncEngine.from_pretrained(
        ckpt, device=args.device, dtype=args.dtype, load_format="dummy", max_batch_size=args.max_batch, progress=True
    )
    result["load_s"] = time.perf_counter() - t0
    family = engine.models.speech()
    result["samples_per_frame"] = round(engine.speech_info.sample_rate * FRAME_S)
    result["graph_capture_s"] = getattr(family, "capture_seconds", 0.0)
    result["graphs"] = len(family.runner.graphs or ())
    print(f"[{args.tag} inproc] loaded in {result['load_s']:.1f} s (graph capture {result['graph_capture_s']:.1f} s, "
          f"{result['graphs']} graphs)", flush=True)  # fmt: skip
    async with engine:
        await drive(Driver("inproc", engine=engine), result, args, StepTimer(family))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server_process(ckpt: Path, args: argparse.Namespace, port: int, voices: Path) -> Iterator[subprocess.Popen]:
    """``omni-stream serve`` on ``ckpt`` with dummy weights and benchmark fields; SIGTERM (then kill) on exit."""
    cmd = [sys.executable, "-m", "omni_stream.cli", "serve", "--model", str(ckpt), "--load-format", "dummy",
           "--enable-benchmark-fields", "--device", args.device, "--dtype", args.dtype,
           "--max-concurrency", str(args.max_batch), "--host", "127.0.0.1", "--port", str(port),
           "--voices-dir", str(voices), "--log-level", "warning"]  # fmt: skip
    env = {**os.environ, "OMNI_STREAM_API_KEY": "", "PYTHONUNBUFFERED": "1"}
    print("$ " + " ".join(cmd), flush=True)
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


async def wait_healthy(client, url: str, proc: subprocess.Popen, limit_s: float) -> float:
    """Seconds until ``/health`` answers 200; raises if the server exits or ``limit_s`` passes."""
    import httpx

    t0 = time.perf_counter()
    # The server is another process: its health endpoint is the only readiness signal there is, so poll it.
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode} before it was ready")
        if time.perf_counter() - t0 > limit_s:
            raise RuntimeError(f"the server was not ready after {limit_s:.0f} s")
        with contextlib.suppress(httpx.HTTPError):
            if (await client.get(f"{url}/health", timeout=2.0)).status_code == 200:
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
            ready_s = await wait_healthy(client, url, proc, args.server_timeout)
            print(f"[{args.tag}] server ready in {ready_s:.1f} s (start, load, graph capture)", flush=True)
            for transport in transports:
                result = base_result(args, transport)
                result["server_ready_s"] = ready_s
                model = (await client.get(f"{url}/v1/models")).json()["data"][0]
                result["samples_per_frame"] = round(model["sample_rate"] * FRAME_S)
                fresh = functools.partial(httpx.AsyncClient, limits=limits, timeout=timeout)
                await drive(Driver(transport, url=url, client=client, new_client=fresh), result, args)


async def run_size(args: argparse.Namespace) -> None:
    from omni_stream.models.qwen3_tts.checkpoint import write_dummy_checkpoint, write_tiny_checkpoint

    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    with tempfile.TemporaryDirectory() as tmp:
        if args.tiny:
            ckpt = write_tiny_checkpoint(Path(tmp) / "ckpt", "custom_voice", args.size, dtype=dtype)
        else:
            ckpt = write_dummy_checkpoint(CONFIGS[args.size], Path(tmp) / "ckpt", dtype=dtype, weights=False)
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
    """Print every saved result as a Markdown table and plot them (``tts_bench.png``)."""
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
    ap.add_argument("--tag-suffix", default="", help="appended to the result file's size tag (A/B runs)")
    ap.add_argument("--summarize", action="store_true", help="print the table of saved results and plot them")
    args = ap.parse_args(argv)
    args.levels = [int(x) for x in args.levels.split(",")]
    args.transports = [t.strip() for t in args.transport.split(",") if t.strip()]
    unknown = sorted(set(args.transports) - set(TRANSPORTS))
    if unknown or not args.transports:
        ap.error(f"--transport: unknown {unknown} (choose from {', '.join(TRANSPORTS)})")
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    args.tag = (f"tiny-{args.size}" if args.tiny else args.size) + args.tag_suffix
    return args


def main(argv: list[str] | None = None) -> int:
    global INITIAL_FRAMES
    args = parse_args(argv)
    INITIAL_FRAMES = args.initial_frames
    if args.summarize:
        return summarize([f"tiny-{s}" for s in ("1.7b", "0.6b")] if args.tiny else ["1.7b", "0.6b"])
    asyncio.run(run_size(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
