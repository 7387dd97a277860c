"""Co-location: speech streams, voice agents, image edits and video sessions on one engine behind one server.

One ``omni-stream serve`` process (one engine, one device worker for every model) and real clients over its wire:

- ``speech_http`` / ``speech_ws``: ``c`` streams over ``POST /v1/audio/speech`` (raw PCM) or ``WS
  /v1/audio/speech/stream`` (``benchmarks/tts_clients.py``; each exactly ``--speech-frames`` 80 ms frames, EOS
  suppressed): time to first audio (TTFA) and underrun on the playback clock (a stream is *continuous* when its
  player never waits more than 0.1 s);
- ``agent``: voice-agent sessions over ``WS /v1/realtime`` (a recorded question spoken in real time, server VAD):
  voice-to-voice, from the end of the question to the first audio of the answer;
- ``image``: edits over ``POST /v1/images/edits`` (SSE, one preview): first preview and final image latency;
- ``video``: sessions over ``WS /v1/realtime/video``: time to first chunk, x real time (video seconds per second
  from the start to the last chunk) and underrun.

Scenarios: ``alone`` (each workload by itself), ``together`` (all start at once) and ``apart`` (speech and agents
first, image and video ``--stagger`` seconds later: the issue's "started 0.3 s in"); each mixed figure is reported
beside the same workload alone, with what the server's device worker ran until the speech streams' last first
audio (its log) and what its event loop ran in the scenario (``loop_meter.LoopMeter``: the longest callbacks and
the code sampled inside them; the server runs asyncio's loop for it, ``--server-loop auto`` gives uvloop where it is
installed, as on the GPU machines, where runs up to 69 ran and their meter counted nothing). The benchmark's own loop
(every client runs on it) is metered too, and for both loops each scenario reports what held them until the speech
streams' last first audio (``loop_meter.window``: the callbacks over a millisecond, each at its offset). ``probe``: the
issue's CPU repro, one short speech request at a time (``Hi there.``, 20 frames, TTFA over HTTP) during one image
edit and during one video session, and alone before each and after the last (pooled: on a shared machine the load
drifts over minutes).

``--policy deadlines|rounds|both``: the device worker's order (``Tuning.device_policy``): by class and deadline
(default), or the old plain rounds (every model stepped once per round), for comparison.

Modes:

- ``--smoke``: CPU, the server with no arguments (every kind's embedded tiny model), tiny sizes, a minute or so
  (``tests/test_colocation_bench_cpu.py``);
- default (CPU): the embedded default at the issue's repro sizes: probes beside a 512 px, 60-step edit and a
  256 px, 8-step, 330-frame video session; the mixed scenarios at small sizes. ~5 min on 2 cores;
- ``--gpu``: random weights at real sizes (``load_format="dummy"``, bf16): Qwen3-TTS 1.7B CustomVoice,
  InstructPix2Pix (512 px, 20 steps), Helios-Base (320x192, 2 steps), and for the agents Qwen3-0.6B and Whisper
  large-v3-turbo; speech at c=16 and 32. Run one transport per command (each well under 8 minutes on an H200):
  ``python3 benchmarks/colocation_bench.py --gpu --transports http`` and ``... --transports ws``.

Writes ``colocation_bench_<mode>[_<transports>].json`` under ``$OUT`` (or ``benchmarks/results``; ``--smoke``
writes only under ``$OUT``) and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import functools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import wave
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from loop_meter import LoopMeter, window, window_line  # noqa: E402
from provenance import git_commit  # noqa: E402
from tts_clients import TEXT, RequestFields, Spoken, http_request, ws_request  # noqa: E402
from voice_bench import split  # noqa: E402
from worklog import (  # noqa: E402
    fetch_loop,
    fetch_worklog,
    last_seq,
    longest_pieces,
    loop_line,
    loop_route,
    worklog_route,
)

from omni_stream.metrics import percentile, underrun_of  # noqa: E402

CONFIGS = HERE / "configs"
RATE = 24000
MIC_CHUNK = RATE // 10  # 100 ms microphone appends
CONTINUITY_S = 0.1  # a stream whose player waited at most this long is continuous (as tts_bench.py)
PROBE_TEXT = "Hi there."
IMAGE_PROMPT = "make the sky look like a snowy winter evening"
VIDEO_PROMPT = "A red kite over a green hill at sunset, the camera slowly panning right."


@dataclass(frozen=True, slots=True)
class Sizes:
    """One mode's workloads."""

    speech_levels: tuple[int, ...]
    speech_frames: int
    agents: int
    agent_reply_tokens: int
    images: int
    image_side: int
    image_steps: int
    videos: int
    video_width: int
    video_height: int
    video_frames: int
    video_steps: int
    probes: int
    probe_image_side: int
    probe_image_steps: int
    probe_video_side: int
    probe_video_frames: int
    probe_video_steps: int


SMOKE = Sizes((2,), 12, 1, 8, 1, 64, 3, 1, 32, 32, 66, 1, 3, 256, 40, 64, 330, 2)
CPU = Sizes((4,), 25, 1, 16, 4, 64, 4, 2, 64, 64, 99, 2, 10, 512, 60, 256, 330, 8)
GPU = Sizes((16, 32), 50, 4, 48, 4, 512, 20, 2, 320, 192, 165, 2, 8, 512, 20, 320, 330, 2)


# --- the server ------------------------------------------------------------------------------------------------


def build_gpu_models(root: Path) -> list[str]:
    """Real-size layouts without weights (the server builds random ones): TTS 1.7B, the agent's LM and ASR."""
    import torch

    from omni_stream.models.causal_lm.checkpoint import write_dummy_checkpoint as lm_dummy
    from omni_stream.models.qwen3_tts.checkpoint import write_dummy_checkpoint as tts_dummy
    from omni_stream.models.whisper.checkpoint import write_dummy_checkpoint as asr_dummy

    bf16 = torch.bfloat16
    return [
        str(tts_dummy(CONFIGS / "qwen3-tts-12hz-1.7b-customvoice", root / "tts", dtype=bf16, weights=False)),
        str(lm_dummy(CONFIGS / "qwen3-0.6b", root / "lm", dtype=bf16, weights=False)),
        str(asr_dummy(CONFIGS / "whisper-large-v3-turbo", root / "asr", dtype=bf16, weights=False)),
        str(CONFIGS / "instruct-pix2pix"),
        str(CONFIGS / "helios-base"),
    ]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(argv: list[str]) -> int:
    """``omni-stream serve`` itself (``argv``: its flags), with the device worker's log kept (``record=True``) and
    readable at ``GET /bench/worklog`` (``worklog.py``), so each scenario can say what the worker ran meanwhile."""
    from starlette.routing import Route

    import omni_stream.realtime.app as app_module
    from omni_stream.cli import main as cli_main
    from omni_stream.engine import AsyncEngine

    load, make_app = AsyncEngine.load.__func__, app_module.create_app  # type: ignore[attr-defined]

    async def recorded(cls: Any, sources: Any = None, **options: Any) -> Any:
        return await load(cls, sources, **options, record=True)

    def create_app(*args: Any, **kwargs: Any) -> Any:
        app = make_app(*args, **kwargs)
        app.router.routes.insert(0, Route("/bench/worklog", worklog_route(app)))
        app.router.routes.insert(0, Route("/bench/loop", loop_route(LoopMeter(sample_after=0.01))))
        return app

    AsyncEngine.load = classmethod(recorded)  # type: ignore[method-assign,assignment]
    app_module.create_app = create_app
    return cli_main(["serve", *argv])


@contextlib.contextmanager
def server(models: list[str], policy: str, tune: list[str], args: argparse.Namespace) -> Iterator[str]:
    """``omni-stream serve`` (no ``--model``: every kind's embedded default) with benchmark fields; its URL."""
    port = free_port()
    cmd = [sys.executable, str(Path(__file__).resolve()), "serve", "--host", "127.0.0.1", "--port", str(port),
           "--enable-benchmark-fields", "--log-level", "warning", "--tune", f"device_policy={policy}",
           "--max-concurrency", "64", "--loop", args.server_loop]  # fmt: skip
    for assignment in tune:
        cmd += ["--tune", assignment]
    for model in models:
        cmd += ["--model", model]
    if args.gpu:
        cmd += ["--device", "cuda", "--load-format", "dummy", "--dtype", "bfloat16"]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tempfile.gettempdir())
    url = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(wait_healthy(url, proc, args.server_timeout))
        yield url
    except BaseException:
        log.seek(0)
        sys.stderr.write(log.read().decode(errors="replace")[-4000:])
        raise
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


async def wait_healthy(url: str, proc: subprocess.Popen, limit_s: float) -> None:
    import httpx

    t0 = time.perf_counter()
    async with httpx.AsyncClient() as client:
        # The server is another process: its health endpoint is the only readiness signal there is, so poll it.
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with status {proc.returncode} before it was ready")
            if time.perf_counter() - t0 > limit_s:
                raise RuntimeError(f"the server was not ready after {limit_s:.0f} s")
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(f"{url}/health", timeout=2.0)).status_code == 200:
                    return
            await asyncio.sleep(0.25)


# --- clients -----------------------------------------------------------------------------------------------------


async def speech(url: str, transport: str, c: int, frames: int, text: str = TEXT) -> list[dict]:
    """``c`` streams at once over ``transport``; each record has its TTFA, underrun and x real time."""
    import httpx

    fields = RequestFields()
    spoken = [Spoken(i, text, frames) for i in range(c)]
    if transport == "http":
        limits = httpx.Limits(max_connections=c + 4)
        async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits, verify=tls()) as client:
            return await asyncio.gather(*(http_request(client, url, s, fields) for s in spoken))
    start = asyncio.Barrier(c)
    return await asyncio.gather(*(ws_request("ws" + url.removeprefix("http"), s, fields, start) for s in spoken))


def speech_samples() -> np.ndarray:
    with wave.open(str(HERE / "speech" / "question.wav"), "rb") as w:
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").copy()


# An agent session hears this much of its answer, then cancels it (``response.cancel``) and ends. A random-weight
# TTS never ends a unit, so an answer left to finish played each unit to the talker's limit in real time: a GPU
# run's agent warm-up took 165 s and the agents-alone phase most of its call (run 30).
AGENT_LISTEN_S = 2.0


# The server events that end each stage of a voice turn, by the mark ``voice_bench.split`` reads.
AGENT_MARKS = {
    "input_audio_buffer.speech_stopped": "stopped",
    "conversation.item.input_audio_transcription.completed": "transcript",
    "response.output_audio_transcript.delta": "first_text",
}


async def agent(url: str, reply_tokens: int, limit_s: float) -> dict:
    """One voice-agent session: the recorded question in real time, then silence until it has heard
    :data:`AGENT_LISTEN_S` of the answer (or the answer is done)."""
    from websockets.asyncio.client import connect

    loop = asyncio.get_running_loop()
    question = speech_samples()
    marks: dict[str, float] = {}
    done = asyncio.Event()
    async with connect("ws" + url.removeprefix("http") + "/v1/realtime", max_size=None) as ws:
        vad = {"type": "server_vad", "silence_duration_ms": 500, "prefix_padding_ms": 300}
        session = {"type": "realtime", "audio": {"input": {"turn_detection": vad}}, "max_output_tokens": reply_tokens}
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        while json.loads(await ws.recv())["type"] != "session.updated":
            pass
        t0 = loop.time()
        sent = 0

        async def send(samples: np.ndarray) -> None:
            nonlocal sent
            for i in range(0, samples.size, MIC_CHUNK):
                chunk = samples[i : i + MIC_CHUNK]
                await asyncio.sleep(max(0.0, t0 + (sent + chunk.size) / RATE - loop.time()))  # real time
                audio = base64.b64encode(chunk.astype("<i2").tobytes()).decode()
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
                sent += chunk.size

        async def speak() -> None:
            await send(np.zeros(3 * MIC_CHUNK, np.int16))
            await send(question)
            marks["speech_end"] = t0 + sent / RATE
            while not done.is_set():
                await send(np.zeros(MIC_CHUNK, np.int16))

        async def listen() -> None:
            heard = 0.0
            async for raw in ws:
                event = json.loads(raw)
                if event["type"] in AGENT_MARKS:  # the turn's stages as the client sees them (voice_bench's split)
                    marks.setdefault(AGENT_MARKS[event["type"]], loop.time())
                if event["type"] == "response.output_audio.delta":
                    marks.setdefault("first_audio", loop.time())
                    heard += len(base64.b64decode(event["delta"])) / 2 / RATE
                    if heard >= AGENT_LISTEN_S:
                        await ws.send(json.dumps({"type": "response.cancel"}))
                        break
                elif event["type"] == "response.done" and "first_audio" in marks:
                    break
                elif event["type"] == "error":
                    raise RuntimeError(f"realtime error: {event['error']}")
            done.set()

        async with asyncio.timeout(limit_s):
            await asyncio.gather(speak(), listen())
    return {"v2v": marks["first_audio"] - marks["speech_end"]} | ({"split": split(marks)} if "stopped" in marks else {})


@functools.cache
def tls() -> Any:
    """One TLS context for every client: httpx builds one per ``AsyncClient`` otherwise (loading the CA bundle,
    20-60 ms of the client's loop each), and four edits starting with a scenario would build four."""
    import httpx

    return httpx.create_ssl_context()


@functools.cache
def png(side: int) -> bytes:
    """The edits' input (random pixels, ~0.8 MB at 512 px): encoded once, not on the client's loop at each edit's
    start, where four encodes at a scenario's start would hold every other client (~40 ms each)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


async def image(url: str, side: int, steps: int, seed: int) -> dict:
    """One edit over SSE with one preview: seconds to the first preview and to the final image."""
    import httpx

    data = {"prompt": IMAGE_PROMPT, "size": f"{side}x{side}", "num_inference_steps": str(steps), "stream": "true",
            "partial_images": "1", "seed": str(seed)}  # fmt: skip
    files = {"image": ("in.png", png(side), "image/png")}
    marks: dict[str, float] = {}
    async with httpx.AsyncClient(timeout=httpx.Timeout(1200.0), verify=tls()) as client:
        t0 = time.perf_counter()
        async with client.stream("POST", f"{url}/v1/images/edits", data=data, files=files) as response:
            if response.status_code != 200:
                raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread()).decode()[:300]}")
            async for line in response.aiter_lines():
                if "partial_image" in line:
                    marks.setdefault("preview", time.perf_counter() - t0)
                elif "completed" in line:
                    marks["final"] = time.perf_counter() - t0
    if "final" not in marks:
        raise RuntimeError("the edit ended without its image")
    return marks


async def video(url: str, width: int, height: int, frames: int, steps: int, seed: int) -> dict:
    """One video session: time to first chunk, x real time, underrun."""
    from websockets.asyncio.client import connect

    fps = 16
    start = {"type": "session.start", "prompt": VIDEO_PROMPT, "width": width, "height": height, "fps": fps,
             "num_frames": frames, "num_inference_steps": steps, "guidance_scale": 1.0, "seed": seed}  # fmt: skip
    arrivals: list[float] = []
    durations: list[float] = []
    async with connect("ws" + url.removeprefix("http") + "/v1/realtime/video", max_size=None) as ws:
        t0 = time.perf_counter()
        await ws.send(json.dumps(start))
        meta: dict[str, Any] = {}
        async for message in ws:
            if isinstance(message, bytes):
                arrivals.append(time.perf_counter() - t0)
                durations.append(meta["num_frames"] / fps)
                continue
            meta = json.loads(message)
            if meta["type"] == "session.done":
                break
            if meta["type"] == "error":
                raise RuntimeError(f"video session failed: {meta}")
    if not arrivals:
        raise RuntimeError("a video session returned no chunk")
    return {"ttfc": arrivals[0], "xrt": sum(durations) / arrivals[-1], "underrun": underrun_of(arrivals, durations)}


# --- scenarios ---------------------------------------------------------------------------------------------------


async def outcomes(tasks: list[Awaitable[Any]]) -> tuple[list[Any], list[str]]:
    done = await asyncio.gather(*tasks, return_exceptions=True)
    records: list[Any] = []
    errors: list[str] = []
    for item in done:
        if isinstance(item, BaseException):
            errors.append(f"{type(item).__name__}: {item}"[:200])
        elif isinstance(item, list):
            records.extend(item)
        else:
            records.append(item)
    return records, errors


def stat(values: list[float], scale: float = 1.0, digits: int = 1) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "max": None}
    return {k: round(scale * v, digits) for k, v in
            (("p50", percentile(values, 50)), ("p95", percentile(values, 95)), ("max", max(values)))}  # fmt: skip


def summarize(name: str, records: list[dict], errors: list[str]) -> dict:
    out: dict[str, Any] = {"n": len(records), "errors": errors[:3]}
    if name.startswith("speech") or name == "probe":
        out["ttfa_ms"] = stat([r["ttfa"] for r in records], 1000)
        out["underrun_ms"] = stat([r["underrun"] for r in records], 1000)
        out["continuous"] = sum(r["underrun"] <= CONTINUITY_S for r in records)
        out["xrt_p50"] = round(percentile([r["xrt"] for r in records], 50), 2) if records else None
    elif name == "agent":
        out["v2v_ms"] = stat([r["v2v"] for r in records], 1000)
        # where the turns went (p50 of each stage: the turn decision, the transcript, the LM's first clause, the
        # speech's first audio), so a v2v that grows beside other work says in which stage
        splits = [r["split"] for r in records if "split" in r]
        if splits:
            out["split_ms_p50"] = {part: round(percentile([s[part] for s in splits], 50), 1) for part in splits[0]}
    elif name == "image":
        out["first_preview_s"] = stat([r["preview"] for r in records if "preview" in r], 1, 2)
        out["final_s"] = stat([r["final"] for r in records], 1, 2)
    elif name == "video":
        out["ttfc_s"] = stat([r["ttfc"] for r in records], 1, 2)
        out["xrt"] = stat([r["xrt"] for r in records], 1, 2)
        out["underrun_s"] = stat([r["underrun"] for r in records], 1, 2)
    return out


def workloads(url: str, sizes: Sizes, transport: str, c: int, args: argparse.Namespace) -> dict[str, Callable]:
    """Each workload as a coroutine factory (the realtime ones first)."""
    speech_name = f"speech_{transport}"
    return {
        speech_name: lambda: speech(url, transport, c, sizes.speech_frames),
        "agent": lambda: [agent(url, sizes.agent_reply_tokens, args.session_timeout) for _ in range(sizes.agents)],
        "image": lambda: [image(url, sizes.image_side, sizes.image_steps, i) for i in range(sizes.images)],
        "video": lambda: [
            video(url, sizes.video_width, sizes.video_height, sizes.video_frames, sizes.video_steps, i)
            for i in range(sizes.videos)
        ],
    }


THROUGHPUT = ("image", "video")


def tasks_of(work: dict[str, Callable], name: str) -> list[Awaitable[Any]]:
    made = work[name]()
    return made if isinstance(made, list) else [made]


async def alone(work: dict[str, Callable], names: list[str]) -> dict:
    """Each of ``names`` by itself, one after another."""
    return {name: summarize(name, *await outcomes(tasks_of(work, name))) for name in names}


async def mixed(kind: str, work: dict[str, Callable], stagger: float) -> tuple[dict, float | None]:
    """``together``: every workload at once; ``apart``: the throughput ones ``stagger`` seconds later. Also the
    speech streams' last first audio (:func:`timed`)."""
    return await timed(work, list(work), stagger if kind == "apart" else 0.0)


async def timed(work: dict[str, Callable], names: list[str], stagger: float = 0.0) -> tuple[dict, float | None]:
    """``names`` at once (the throughput ones ``stagger`` seconds late): their figures, and when the last speech
    stream's first audio arrived (``time.monotonic()``; None without speech), the end of :func:`worker_window`."""

    async def later(name: str) -> tuple[list[Any], list[str]]:
        await asyncio.sleep(stagger if name in THROUGHPUT else 0.0)
        return await outcomes(tasks_of(work, name))

    gathered = await asyncio.gather(*(later(name) for name in names))
    offset = time.monotonic() - time.perf_counter()  # the records' perf_counter times -> the worker log's clock
    firsts = [r["start"] + r["ttfa"] + offset
              for name, (records, _) in zip(names, gathered, strict=True) if name.startswith("speech")
              for r in records]  # fmt: skip
    summaries = {name: summarize(name, *got) for name, got in zip(names, gathered, strict=True)}
    return summaries, max(firsts, default=None)


def worker_window(url: str, after: int, start: float, end: float | None) -> dict:
    """What the server's device worker ran from a scenario's start to its speech streams' last first audio (its
    log entries after ``after``; ``time.monotonic()`` times): the work profile of that window, and its longest
    single pieces (one piece that held every model shows there)."""
    from omni_stream.runtime.work_profile import work_profile

    if end is None or end <= start:
        return {}
    log = fetch_worklog(url, after)
    return {"window_ms": round(1000 * (end - start), 1), **work_profile(log, start, end).summary(),
            "longest": longest_pieces(log, start, end)}  # fmt: skip


def worker_line(window: dict, top: int = 4) -> str:
    """``worker_window`` in one line: busy share, the largest shares (ms, count), the longest pieces."""
    if not window:
        return "    worker: no speech first audio in the window"
    shares = ", ".join(f"{k} {1000 * v:.0f} ({window['counts'][k]})" for k, v in list(window["seconds"].items())[:top])
    longest = ", ".join(f"{p['piece']} {p['ms']:.0f} ms at +{p['at_ms']:.0f}" for p in window["longest"][:3])
    return (f"    worker until the last first audio ({window['window_ms']:.0f} ms): busy "
            f"{100 * window['busy_fraction']:.0f}%: {shares}; longest: {longest}")  # fmt: skip


async def probes(url: str, sizes: Sizes, under: str | None) -> list[dict]:
    """The issue's repro: short speech requests one at a time, alone or during one image edit or video session."""
    records, errors, _ = await probe_outcomes(url, sizes, under)
    if errors:
        raise RuntimeError(f"probes failed: {errors}")
    return records


async def one_after_another(run: Callable[[], Awaitable[Any]]) -> None:
    """The probes' background: one edit or video session at a time, the next as soon as one ends, until the probes
    are done (a machine fast enough to finish one before the first probe still probes beside one)."""
    while True:
        await run()


async def probe_outcomes(url: str, sizes: Sizes, under: str | None) -> tuple[list[dict], list[str], bool]:
    """The probes' records and errors, and whether the background ended before the last probe (it runs until they
    are done, so only by failing: they stop then, since they measure speech beside it)."""
    background: asyncio.Task | None = None
    if under == "image":
        background = asyncio.create_task(
            one_after_another(lambda: image(url, sizes.probe_image_side, sizes.probe_image_steps, 0))
        )
    elif under == "video":
        side, frames = sizes.probe_video_side, sizes.probe_video_frames
        background = asyncio.create_task(
            one_after_another(lambda: video(url, side, side, frames, sizes.probe_video_steps, 0))
        )
    records: list[dict] = []
    errors: list[str] = []
    early = False
    if background is not None:
        await asyncio.sleep(1.0)  # it is running (as the repro's "sleep 2": past its join step)
    for _ in range(sizes.probes):
        if background is not None and background.done():
            early = True
            break
        got, failed = await outcomes([speech(url, "http", 1, 20, PROBE_TEXT)])
        records += got
        errors += failed
        await asyncio.sleep(0.3)
    if background is not None:
        background.cancel()  # the probes are what is measured; closing it aborts it on the server
        (ended,) = await asyncio.gather(background, return_exceptions=True)
        if early and isinstance(ended, Exception):
            errors.append(f"{under}: {ended!r}")
    return records, errors, early


def compare(alone: dict, mixed: dict) -> dict:
    """The mixed figure beside the one alone, per workload: ratios (TTFA, image latency), deltas (v2v)."""
    out: dict[str, Any] = {}
    for name, m in mixed.items():
        a = alone.get(name)
        if not a or not a["n"] or not m["n"]:
            continue
        if "ttfa_ms" in m:
            out[name] = {"ttfa_p95_ratio": _ratio(m["ttfa_ms"]["p95"], a["ttfa_ms"]["p95"]),
                         "continuous": f"{m['continuous']}/{m['n']}"}  # fmt: skip
        elif "v2v_ms" in m:
            out[name] = {"v2v_p95_delta_ms": _delta(m["v2v_ms"]["p95"], a["v2v_ms"]["p95"])}
        elif "final_s" in m:
            out[name] = {"final_p50_ratio": _ratio(m["final_s"]["p50"], a["final_s"]["p50"])}
        elif "xrt" in m:
            out[name] = {"xrt_p50_ratio": _ratio(m["xrt"]["p50"], a["xrt"]["p50"])}
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 2)


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 1)


T0 = time.perf_counter()


def progress(label: str, figures: dict | None = None) -> None:
    """One line per finished phase, as it finishes: a run cut off by its time limit still shows what it measured
    (the table and the JSON come only at the end)."""
    line = f"[{time.perf_counter() - T0:6.1f} s] {label}"
    if figures is not None:
        line += " " + json.dumps(figures, separators=(",", ":"))
    print(line, flush=True)


async def run_policy(url: str, sizes: Sizes, args: argparse.Namespace, reference: dict | None = None) -> dict:
    """Every scenario on the server at ``url``. ``reference``: an earlier arm's result, whose workloads alone (and
    probes) stand for this arm's: a switch that changes how models share the device leaves each alone as it was,
    so an A/B arm measures only the mixed scenarios (``--arm``)."""
    result: dict[str, Any] = {"probe": {}, "alone": {}, "levels": []}
    # warm-up: every route once, one at a time (first calls fill caches, pick kernels and capture graphs), each
    # timed, so a slow first call shows which route it was
    one = replace(sizes, agents=min(1, sizes.agents), images=min(1, sizes.images), videos=min(1, sizes.videos))
    for name, make in workloads(url, one, "http", 1, args).items():
        got, errors = await outcomes(tasks_of({name: make}, name))
        progress(f"warm-up: {name}", summarize(name, got, errors))
    await speech(url, "http", 1, 20, PROBE_TEXT)
    progress("warmed up")
    if args.probe and reference is None:
        # alone before each background and after the last, pooled: a shared machine's load drifts over minutes
        records: list[dict] = []
        for under in ("image", "video"):
            records += await probes(url, sizes, None)
            got, errors, early = await probe_outcomes(url, sizes, under)
            result["probe"][under] = summarize("probe", got, errors) | {"background_ended_early": early}
            progress(f"probes during {under}", result["probe"][under])
        records += await probes(url, sizes, None)
        result["probe"]["alone"] = summarize("probe", records, [])
        by_itself = result["probe"]["alone"]["ttfa_ms"]["p50"]
        for under in ("image", "video"):
            during = result["probe"][under]["ttfa_ms"]["p50"]
            result["probe"][f"ttfa_p50_ratio_{under}"] = _ratio(during, by_itself)
    # the agent, image and video workloads alone do not depend on the speech level: once
    if args.mixed and reference is not None:
        result["alone"] = reference["alone"]
    elif args.mixed:
        result["alone"] = await alone(workloads(url, sizes, "http", 1, args), ["agent", "image", "video"])
        progress("agent, image and video alone", result["alone"])
    # this process's own loop too: every client runs on it, so a callback that holds it delays a stream's send or
    # its first audio's receipt exactly as the server's would
    client = LoopMeter(sample_after=0.01)
    client.install()
    try:
        await levels(url, sizes, args, reference, result, client)
    finally:
        client.uninstall()
    return result


def loops(level: dict, kind: str, client: LoopMeter, start: float, until: float | None) -> None:
    """What held the server's loop and this process's from a scenario's ``start`` to its speech streams' last first
    audio (``loop_meter.window``); the raw timelines are dropped (the JSON keeps each window's summary)."""
    server = level[f"{kind}_loop"]
    level[f"{kind}_loop_window"] = window(server, start, until)
    server.pop("timeline", None)
    report = client.report(5, timeline=True)
    level[f"{kind}_client_loop_window"] = window(report, start, until)
    report.pop("timeline")
    level[f"{kind}_client_loop"] = report


async def levels(
    url: str, sizes: Sizes, args: argparse.Namespace, reference: dict | None, result: dict, client: LoopMeter
) -> None:
    """Each transport and speech level: speech alone, then the mixed scenarios (:func:`run_policy`)."""
    for transport in args.transports:
        for c in sizes.speech_levels:
            work = workloads(url, sizes, transport, c, args)
            level: dict[str, Any] = {"transport": transport, "speech_c": c}
            if reference is not None:
                (same,) = [lv for lv in reference["levels"] if (lv["transport"], lv["speech_c"]) == (transport, c)]
                level["alone"], level["alone_worker"] = same["alone"], same["alone_worker"]
                for key in ("alone_loop", "alone_loop_window", "alone_client_loop", "alone_client_loop_window"):
                    level[key] = same[key]
            else:
                seen, t0 = await asyncio.to_thread(last_seq, url), time.monotonic()
                await asyncio.to_thread(fetch_loop, url)  # the loop meter's window starts here
                client.reset()
                level["alone"], until = await timed(work, [f"speech_{transport}"])
                level["alone_worker"] = await asyncio.to_thread(worker_window, url, seen, t0, until)
                level["alone_loop"] = await asyncio.to_thread(fetch_loop, url)
                loops(level, "alone", client, t0, until)
                progress(f"speech {transport} c={c} alone", level["alone"])
                print(worker_line(level["alone_worker"]), flush=True)
                print(loop_line(level["alone_loop"]), flush=True)
                print(window_line("server", level["alone_loop_window"]), flush=True)
                print(window_line("client", level["alone_client_loop_window"]), flush=True)
            solo = result["alone"] | level["alone"]
            for kind in ("together", "apart"):
                seen, t0 = await asyncio.to_thread(last_seq, url), time.monotonic()
                await asyncio.to_thread(fetch_loop, url)
                client.reset()
                level[kind], until = await mixed(kind, work, args.stagger)
                level[f"{kind}_worker"] = await asyncio.to_thread(worker_window, url, seen, t0, until)
                # what held the server's event loop meanwhile (a burst's requests wait for it before the worker)
                level[f"{kind}_loop"] = await asyncio.to_thread(fetch_loop, url)
                loops(level, kind, client, t0, until)
                level[f"{kind}_vs_alone"] = compare(solo, level[kind])
                progress(f"speech {transport} c={c} {kind}", level[kind])
                print(worker_line(level[f"{kind}_worker"]), flush=True)
                print(loop_line(level[f"{kind}_loop"]), flush=True)
                print(window_line("server", level[f"{kind}_loop_window"]), flush=True)
                print(window_line("client", level[f"{kind}_client_loop_window"]), flush=True)
            result["levels"].append(level)


# --- report ------------------------------------------------------------------------------------------------------


def table(result: dict) -> str:
    rows = [f"colocation_bench {result['mode']} ({result['device_name']}), commit {result['commit']}"]
    for policy, body in result["policies"].items():
        rows.append(f"policy {policy}" if policy not in result["arms"] else f"arm {policy}: {result['arms'][policy]}")
        probe = body["probe"]
        if probe:
            parts = [f"{k} {v['ttfa_ms']['p50']} ms" for k, v in probe.items() if isinstance(v, dict)]
            rows.append(
                "  probe TTFA p50: " + ", ".join(parts)
                + f"  (x alone: image {probe['ttfa_p50_ratio_image']}, video {probe['ttfa_p50_ratio_video']})"
            )  # fmt: skip
        for level in body["levels"]:
            rows.append(f"  speech {level['transport']} c={level['speech_c']}")
            for kind in ("alone", "together", "apart"):
                cells = []
                figures = body["alone"] | level["alone"] if kind == "alone" else level[kind]
                for name, s in figures.items():
                    if "ttfa_ms" in s:
                        cells.append(f"{name} TTFA p50/p95 {s['ttfa_ms']['p50']}/{s['ttfa_ms']['p95']} ms "
                                     f"cont {s['continuous']}/{s['n']}")  # fmt: skip
                    elif "v2v_ms" in s:
                        parts = " + ".join(f"{k} {v:.0f}" for k, v in s.get("split_ms_p50", {}).items())
                        cells.append(f"agent v2v p50/p95 {s['v2v_ms']['p50']}/{s['v2v_ms']['p95']} ms"
                                     + (f" ({parts})" if parts else ""))  # fmt: skip
                    elif "final_s" in s:
                        cells.append(f"image final p50 {s['final_s']['p50']} s")
                    elif "xrt" in s:
                        cells.append(f"video xrt p50 {s['xrt']['p50']}")
                    if s["errors"]:
                        cells.append(f"{name} errors {s['errors']}")
                rows.append(f"    {kind:>8}: " + "; ".join(cells))
    return "\n".join(rows)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, about a minute (tests)")
    ap.add_argument("--gpu", action="store_true", help="real sizes with random weights on CUDA")
    ap.add_argument(
        "--policy",
        choices=("deadlines", "rounds", "both"),
        default=None,
        help="the device worker's order (default: both on CPU, deadlines on GPU and in --smoke)",
    )
    ap.add_argument("--transports", default="http,ws", help="speech transports (default: http,ws)")
    ap.add_argument("--levels", default=None, help="speech streams at once, e.g. 32 (default: the mode's)")
    ap.add_argument("--stagger", type=float, default=0.3, help="apart: image and video start this late (s)")
    ap.add_argument(
        "--scenarios",
        default="probe,mixed",
        help="probe (the one-request speech probes), mixed (alone / together / apart); default: both",
    )
    ap.add_argument(
        "--tune",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a tuning switch for the server (may repeat), e.g. realtime_priority=on (A/B runs)",
    )
    ap.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="LABEL:NAME=VALUE[,NAME=VALUE]",
        help="an A/B arm after the policies' runs: its own server with these switches (over --tune), measured in "
        "the mixed scenarios only, against the first run's workloads alone; may repeat",
    )
    ap.add_argument(
        "--server-loop",
        choices=("asyncio", "auto"),
        default="asyncio",
        help="the server's event loop (serve --loop): asyncio (default), whose callbacks the loop meter times, or "
        "auto (uvloop where installed, as a plain serve runs; the meter then reports nothing)",
    )
    ap.add_argument("--tag", default="", help="appended to the result file's name (A/B runs)")
    ap.add_argument("--session-timeout", type=float, default=300.0)
    ap.add_argument("--server-timeout", type=float, default=900.0)
    args = ap.parse_args(argv)
    args.transports = [t for t in args.transports.split(",") if t]
    if not set(args.transports) <= {"http", "ws"}:
        ap.error("--transports takes http and/or ws")
    scenarios = {x for x in args.scenarios.split(",") if x}
    if not scenarios or not scenarios <= {"probe", "mixed"}:
        ap.error("--scenarios takes probe and/or mixed")
    args.probe, args.mixed = "probe" in scenarios, "mixed" in scenarios
    if not args.mixed:
        args.transports = []
    if args.policy is None:
        args.policy = "deadlines" if args.smoke or args.gpu else "both"
    arms = []
    for spec in args.arm:
        label, _, tunes = spec.partition(":")
        if not label or not tunes or "=" not in tunes:
            ap.error(f"--arm takes LABEL:NAME=VALUE[,NAME=VALUE], got {spec!r}")
        arms.append((label, [t for t in tunes.split(",") if t]))
    args.arm = arms
    if arms and not args.mixed:
        ap.error("--arm measures the mixed scenarios: add mixed to --scenarios")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    sizes = SMOKE if args.smoke else GPU if args.gpu else CPU
    if args.levels:
        sizes = replace(sizes, speech_levels=tuple(int(c) for c in args.levels.split(",")))
    mode = "smoke" if args.smoke else "gpu" if args.gpu else "cpu"
    policies = ["deadlines", "rounds"] if args.policy == "both" else [args.policy]
    result: dict[str, Any] = {
        "benchmark": "colocation_bench",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "mode": mode,
        "device_name": _device_name(args.gpu),
        "sizes": asdict(sizes),
        "stagger_s": args.stagger,
        "server_loop": args.server_loop,
        "tune": args.tune,
        "arms": {label: tunes for label, tunes in args.arm},
        "policies": {},
    }
    with tempfile.TemporaryDirectory(prefix="colocation-") as tmp:
        models = build_gpu_models(Path(tmp)) if args.gpu else []
        runs = [(policy, policy, list(args.tune)) for policy in policies]
        runs += [(label, "deadlines", [*args.tune, *tunes]) for label, tunes in args.arm]
        for k, (label, policy, tune) in enumerate(runs):
            progress(f"{label}: starting the server (device_policy={policy} {' '.join(tune)})")
            with server(models, policy, tune, args) as url:
                progress("server ready")
                first = result["policies"][runs[0][0]] if k >= len(policies) else None
                result["policies"][label] = asyncio.run(run_policy(url, sizes, args, first))
    print(table(result))
    name = f"colocation_bench_{mode}"
    if not args.mixed:
        name += "_probe"
    elif args.transports != ["http", "ws"]:
        name += "_" + "_".join(args.transports)
    if args.levels:
        name += "_c" + "_".join(str(c) for c in sizes.speech_levels)
    name += args.tag
    targets = [Path(os.environ["OUT"])] if os.environ.get("OUT") else []
    if not args.smoke:
        targets.append(HERE / "results")
    for folder in targets:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {folder / name}.json")
    return result


def _device_name(gpu: bool) -> str:
    if gpu:
        import torch

        return torch.cuda.get_device_name()
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:  # the benchmark's server process (``server``)
        sys.exit(serve(sys.argv[2:]))
    main()
