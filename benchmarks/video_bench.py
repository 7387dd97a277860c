"""Streaming video: time to first chunk and chunk cadence against playback time, at several concurrencies.

Each level starts ``c`` sessions at once; each generates ``--frames`` frames (chunks of 33) and encodes every chunk
to fragmented MP4 the way the server does (PyAV, off the event loop). Per session: time to first chunk (TTFC, from
the request to the first chunk's bytes), the gaps between chunks, x real time (video seconds / seconds to the last
chunk) and the underrun of a player that starts with the first chunk (``omni_stream.metrics.underrun_of``: the worst
wait for a chunk whose playback time had come). Per level: percentiles, frames per second over all sessions, wall.

Modes:

- CPU (default): the tiny random Helios (``make-checkpoint --tiny --kind video``), ``--transport inproc`` (the
  engine in this process) and/or ``ws`` (the real server on loopback, ``websockets`` client; TTFC from sending
  ``session.start`` to the first binary frame). Writes ``video_bench_cpu_tiny[_ws].json``.
- ``--gpu``: Helios-Base at its published sizes with random weights (``benchmarks/configs/helios-base``,
  ``load_format="dummy"``, bf16, built on the device: ~40 GB), in process. Defaults keep the run near a minute on
  an H200: 320x192, 66 frames (2 chunks), 2 steps, no guidance, levels 1, 2, 4, 8. Writes
  ``video_bench_gpu_helios-base.json``. The GPU image needs, besides the TTS benchmark's wheels (see
  ``tts_bench.py``: av, platformdirs, ...): ``diffusers==0.42.1 ftfy==6.3.1 wcwidth==0.9.4`` (and
  ``huggingface_hub>=1.32`` where the image's is older; random weights need no accelerate), fetched with
  ``pip download --no-deps`` into ``.whl`` the same way (``benchmarks/gpu_wheels.sh`` fetches them all).
  Run: ``python3 benchmarks/video_bench.py --gpu`` (or the whole suite, ``benchmarks/gpu_suite.sh``).
- ``--smoke``: a few seconds on CPU (levels 1, 2; 16x16; 2 chunks; both transports); ``tests/test_video_bench.py``.

Results go to ``$OUT`` or ``benchmarks/results``; ``--summarize`` prints the table of every result there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from provenance import git_commit

from omni_stream.metrics import percentile, underrun_of

ROOT = Path(__file__).resolve().parent
GPU_CONFIG = ROOT / "configs" / "helios-base"
PROMPT = "A red kite over a green hill at sunset, the camera slowly panning right."


def out_dir() -> Path:
    path = Path(os.environ.get("OUT") or ROOT / "results")
    path.mkdir(parents=True, exist_ok=True)
    return path


def session_record(t0: float, arrivals: list[float], durations: list[float], frames: int, nbytes: int) -> dict:
    if not arrivals:
        raise RuntimeError("a session returned no chunk")
    rel = [a - t0 for a in arrivals]
    gaps = [b - a for a, b in itertools.pairwise(rel)]
    video_s = sum(durations)
    return {
        "ttfc": rel[0],
        "arrivals": rel,
        "gaps": gaps,
        "chunk_s": durations,
        "video_s": video_s,
        "xrt": video_s / rel[-1],
        "underrun": underrun_of(rel, durations),
        "frames": frames,
        "bytes": nbytes,
    }


def level_summary(c: int, sessions: list[dict], wall: float) -> dict:
    ttfc = [s["ttfc"] for s in sessions]
    gaps = [g for s in sessions for g in s["gaps"]]
    chunk_s = [d for s in sessions for d in s["chunk_s"]]
    return {
        "concurrency": c,
        "sessions": len(sessions),
        "chunks_per_session": len(sessions[0]["arrivals"]),
        "chunk_playback_s": max(chunk_s),
        "ttfc_p50_s": percentile(ttfc, 50),
        "ttfc_max_s": max(ttfc),
        "gap_p50_s": percentile(gaps, 50) if gaps else None,
        "gap_max_s": max(gaps) if gaps else None,
        "gap_over_playback_p50": percentile(gaps, 50) / max(chunk_s) if gaps else None,
        "xrt_p50": percentile([s["xrt"] for s in sessions], 50),
        "xrt_min": min(s["xrt"] for s in sessions),
        "underrun_p50_s": percentile([s["underrun"] for s in sessions], 50),
        "underrun_max_s": max(s["underrun"] for s in sessions),
        "first_chunk_before_half": all(s["ttfc"] < s["arrivals"][-1] / 2 for s in sessions),
        "frames_per_s": sum(s["frames"] for s in sessions) / wall,
        "bytes_per_session": sessions[0]["bytes"],
        "wall_s": wall,
    }


# --- in process --------------------------------------------------------------------------------------------------


async def inproc_session(engine: Any, args: argparse.Namespace, seed: int) -> dict:
    from omni_stream.codecs.video import VideoStreamEncoder
    from omni_stream.video.spec import VideoRequest

    request = VideoRequest(PROMPT, width=args.width, height=args.height, fps=args.fps, num_frames=args.frames,
                           num_inference_steps=args.steps, guidance_scale=args.guidance, seed=seed)  # fmt: skip
    encoder = VideoStreamEncoder("m4s", args.width, args.height, args.fps)
    t0 = time.perf_counter()
    arrivals, durations, nbytes, frames = [], [], 0, 0
    async with engine.generate(request) as stream:
        async for out in stream:
            chunk = out.chunk
            data = await asyncio.to_thread(encoder.encode, chunk.frames, chunk.final)
            arrivals.append(time.perf_counter())
            durations.append(chunk.duration)
            nbytes += len(data)
            frames += chunk.num_frames
    return session_record(t0, arrivals, durations, frames, nbytes)


async def run_inproc(checkpoint: Path, args: argparse.Namespace) -> list[dict]:
    from omni_stream.engine import AsyncEngine

    engine = await AsyncEngine.from_pretrained(
        checkpoint, device=args.device, load_format="dummy" if args.gpu else "auto", progress=False, record=True
    )
    async with engine:
        await inproc_session(engine, args, 0)  # warm-up: first-call costs stay out of the figures
        levels = []
        for c in args.levels:
            seen = engine.worker.log[-1].seq if engine.worker.log else -1
            t0 = time.perf_counter()
            sessions = await asyncio.gather(*(inproc_session(engine, args, i + 1) for i in range(c)))
            t1 = time.perf_counter()
            levels.append(level_summary(c, list(sessions), t1 - t0))
            levels[-1]["model_calls"] = model_calls(list(engine.worker.log), t0, t1, seen)
            print_level("inproc", levels[-1])
    return levels


def model_calls(log: list, start: float, end: float, after_seq: int) -> dict[str, dict[str, float]]:
    """The video model's calls while a level ran, per kind (the transformer's ``denoise``, the VAE's ``decode``):
    how many, the sessions batched in each (mean and largest) and milliseconds per call (the worker's log:
    :mod:`omni_stream.runtime.work_profile`). Whether sessions batch, and what a bigger batch costs a call."""
    from omni_stream.runtime.work_profile import work_profile

    profile = work_profile(log, start, end, after_seq)
    seconds = {(s.kind, s.name): s.seconds for s in profile.shares}
    calls: dict[str, list[int]] = {}
    for record in log:
        if record.seq > after_seq and start <= record.at < end and record.name == "video":
            if record.kind not in ("step", "resume", "join", "done", "release"):
                calls.setdefault(record.kind, []).append(len(record.detail))
    return {
        kind: {
            "calls": len(rows),
            "mean_rows": round(sum(rows) / len(rows), 2),
            "max_rows": max(rows),
            "ms_per_call": round(1000 * seconds.get((kind, "video"), 0.0) / len(rows), 2),
        }
        for kind, rows in sorted(calls.items())
    }


# --- over the server -----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def serving(checkpoint: Path, device: str) -> Iterator[int]:

    from omni_stream.engine import AsyncEngine
    from omni_stream.realtime.app import create_app
    from omni_stream.realtime.graceful import GracefulServer
    from omni_stream.realtime.server import uvicorn_config

    async def load() -> Any:
        return await AsyncEngine.from_pretrained(checkpoint, device=device, progress=False)

    app = create_app(load)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = GracefulServer(uvicorn_config(app, log_level="warning"), app.state.omni)  # serve's own settings
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.01)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


async def ws_session(port: int, args: argparse.Namespace, seed: int) -> dict:
    from websockets.asyncio.client import connect

    start = {"type": "session.start", "prompt": PROMPT, "width": args.width, "height": args.height, "fps": args.fps,
             "num_frames": args.frames, "num_inference_steps": args.steps, "guidance_scale": args.guidance,
             "seed": seed}  # fmt: skip
    arrivals, durations, nbytes, frames = [], [], 0, 0
    async with connect(f"ws://127.0.0.1:{port}/v1/realtime/video", max_size=None) as ws:
        t0 = time.perf_counter()
        await ws.send(json.dumps(start))
        meta = None
        while True:
            message = await ws.recv()
            if isinstance(message, bytes):
                assert meta is not None and len(message) == meta["byte_length"]
                arrivals.append(time.perf_counter())
                durations.append(meta["num_frames"] / args.fps)
                nbytes += len(message)
                frames += meta["num_frames"]
                continue
            meta = json.loads(message)
            if meta["type"] == "session.done":
                break
            if meta["type"] == "error":
                raise RuntimeError(f"session failed: {meta}")
    return session_record(t0, arrivals, durations, frames, nbytes)


async def run_ws_levels(port: int, args: argparse.Namespace) -> list[dict]:
    await ws_session(port, args, 0)  # warm-up
    levels = []
    for c in args.levels:
        t0 = time.perf_counter()
        sessions = await asyncio.gather(*(ws_session(port, args, i + 1) for i in range(c)))
        levels.append(level_summary(c, list(sessions), time.perf_counter() - t0))
        print_level("ws", levels[-1])
    return levels


# --- driver --------------------------------------------------------------------------------------------------------


def print_level(transport: str, level: dict) -> None:
    gap = level["gap_p50_s"]
    print(
        f"{transport:6s} c={level['concurrency']:<2d} ttfc p50 {level['ttfc_p50_s'] * 1000:7.0f} ms "
        f"max {level['ttfc_max_s'] * 1000:7.0f} ms | gap p50 {'-' if gap is None else f'{gap * 1000:.0f} ms':>8s} "
        f"vs {level['chunk_playback_s'] * 1000:.0f} ms of video | x real time p50 {level['xrt_p50']:.2f} "
        f"min {level['xrt_min']:.2f} | underrun max {level['underrun_max_s'] * 1000:.0f} ms | "
        f"{level['frames_per_s']:.1f} frames/s",
        flush=True,
    )
    for kind, c in level.get("model_calls", {}).items():
        print(f"         {kind}: {c['calls']} calls of {c['mean_rows']} sessions (max {c['max_rows']}), "
              f"{c['ms_per_call']} ms a call", flush=True)  # fmt: skip


def summarize() -> None:
    for path in sorted(out_dir().glob("video_bench_*.json")):
        data = json.loads(path.read_text())
        print(f"{path.name}: {data['model']} on {data['device']}, {data['request']}, commit {data['commit']}")
        for level in data["levels"]:
            print_level(data["transport"], level)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="Helios-Base sizes, random weights, on CUDA")
    parser.add_argument("--smoke", action="store_true", help="a few seconds on CPU (tests)")
    parser.add_argument("--transport", default=None, help="inproc,ws (default: inproc,ws on CPU, inproc on GPU)")
    parser.add_argument("--levels", default=None, help="concurrencies (default 1,2,4,8)")
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--height", type=int, default=None)
    parser.add_argument("--frames", type=int, default=None, help="frames per session (33 per chunk)")
    parser.add_argument("--steps", type=int, default=None, help="denoising steps per chunk")
    parser.add_argument("--guidance", type=float, default=1.0, help="guidance scale (> 1 doubles the passes)")
    parser.add_argument("--fps", type=int, default=16)
    parser.add_argument("--summarize", action="store_true", help="print the table of the saved results")
    args = parser.parse_args(argv)
    if args.summarize:
        summarize()
        return 0
    if args.gpu and not torch.cuda.is_available():
        raise SystemExit("--gpu needs a CUDA device")
    if args.gpu:
        defaults = {"width": 320, "height": 192, "frames": 66, "steps": 2, "levels": "1,2,4,8", "transport": "inproc"}
    elif args.smoke:
        defaults = {"width": 16, "height": 16, "frames": 40, "steps": 1, "levels": "1,2", "transport": "inproc,ws"}
    else:
        defaults = {"width": 64, "height": 64, "frames": 99, "steps": 2, "levels": "1,2,4,8", "transport": "inproc,ws"}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.levels = [int(c) for c in str(args.levels).split(",")]
    transports = str(args.transport).split(",")
    args.device = "cuda" if args.gpu else "cpu"
    if not args.gpu:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    with tempfile.TemporaryDirectory() as tmp:
        if args.gpu:
            checkpoint, model = GPU_CONFIG, "helios-base"
        else:
            from omni_stream.models.helios.checkpoint import write_tiny_checkpoint

            checkpoint, model = write_tiny_checkpoint(Path(tmp) / "helios-tiny"), "tiny"
        for transport in transports:
            if transport == "inproc":
                levels = asyncio.run(run_inproc(checkpoint, args))
            elif transport == "ws":
                with serving(checkpoint, args.device) as port:
                    levels = asyncio.run(run_ws_levels(port, args))
            else:
                raise SystemExit(f"unknown transport {transport!r}")
            mode = "gpu" if args.gpu else "cpu"
            name = f"video_bench_{mode}_{'helios-base' if args.gpu else 'tiny'}"
            result = {
                "commit": git_commit(),
                "device": torch.cuda.get_device_name() if args.gpu else f"cpu ({torch.get_num_threads()} threads)",
                "model": model,
                "transport": transport,
                "request": {
                    "width": args.width,
                    "height": args.height,
                    "frames": args.frames,
                    "fps": args.fps,
                    "steps": args.steps,
                    "guidance": args.guidance,
                },
                "levels": levels,
            }
            path = out_dir() / (f"{name}.json" if transport == "inproc" else f"{name}_{transport}.json")
            path.write_text(json.dumps(result, indent=2) + "\n")
            print(f"wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
