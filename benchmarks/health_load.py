"""``GET /health`` under load: how long the probe waits while the no-argument server (every kind's embedded tiny
model, or ``--device cuda``) serves mixed streams, and what holds its event loop meanwhile.

The server runs in this process (uvicorn on loopback, in a thread of its own, its loop watched by
:class:`loop_meter.LoopMeter`); the clients and the prober each run in a process of their own (this script with
``--clients HOST`` and ``--probe HOST``): neither holds the server's interpreter lock, and the prober's timing does
not wait on the clients' work. ``--streams`` clients (36 by default) each
repeat one kind of request for ``--seconds``: speech over SSE and over the speech WebSocket, chat (text, and text
with audio), image edits streamed with previews, video sessions and realtime responses, in the mix of
:data:`MIX`. A prober asks ``/health`` every ``--probe-ms`` and records how long each answer took.

Printed and written to ``health_load.json`` (``$OUT`` or ``benchmarks/results``): the probe's latency (p50, p90,
p99, max) against PROTOCOLS' 100 ms, requests finished per kind, and the loop's report: callbacks run, the longest
ones by wall and by thread CPU time, and where the loop thread was while a callback ran past 20 ms (stack samples).

Run: ``python benchmarks/health_load.py`` (CPU, about a minute and a half with the models' load);
``--device cuda`` on a GPU; ``--smoke``: one stream of each kind for 8 s (``tests/test_health_load.py`` runs it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from loop_meter import LoopMeter
from provenance import git_commit
from websockets.asyncio.client import connect

from omni_stream.metrics import percentile

ROOT = Path(__file__).resolve().parent
TARGET_MS = 100.0  # PROTOCOLS: a /health probe answers within 100 ms while the models are busy
# Clients of each kind out of 36 (scaled to --streams).
MIX = {"speech_sse": 10, "speech_ws": 8, "chat": 6, "chat_audio": 4, "image": 4, "video": 2, "realtime": 2}
SENTENCE = "The quick brown fox jumps over the lazy dog, and then it runs home."


def out_dir() -> Path:
    path = Path(os.environ.get("OUT") or ROOT / "results")
    path.mkdir(parents=True, exist_ok=True)
    return path


def mix(streams: int) -> dict[str, int]:
    """``streams`` clients split in :data:`MIX`'s proportions, each kind at least one."""
    total = sum(MIX.values())
    counts = {kind: max(1, round(n * streams / total)) for kind, n in MIX.items()}
    while sum(counts.values()) > streams and max(counts.values()) > 1:
        counts[max(counts, key=lambda k: counts[k])] -= 1
    return counts


# --- the server ----------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def serve(device: str, meter: LoopMeter) -> Iterator[tuple[str, Any]]:
    """The no-argument server on a free loopback port, its loop measured by ``meter``; yields (url, app)."""
    from omni_stream.engine import AsyncEngine
    from omni_stream.realtime.app import create_app
    from omni_stream.realtime.graceful import GracefulServer
    from omni_stream.realtime.server import uvicorn_config
    from omni_stream.realtime.settings import Settings

    async def load() -> AsyncEngine:
        return await AsyncEngine.load(None, device=device, progress=False)

    app = create_app(load, Settings())
    # IPPROTO_TCP named: asyncio turns Nagle's algorithm off only on sockets whose protocol says TCP (as the ones
    # uvicorn binds itself do); with it on, a keep-alive client waits 40 ms for each response's second segment
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    # asyncio's loop, not uvloop where installed: the meter times callbacks that pass through asyncio's Handle
    config = uvicorn_config(app, log_level="warning", timeout_graceful_shutdown=5, loop="asyncio")
    server = GracefulServer(config, app.state.omni)

    def run() -> None:
        meter.install()  # this thread's loop is the server's
        with meter.watch_torch():
            server.run(sockets=[sock])

    thread = threading.Thread(target=run, daemon=True, name="health-load-server")
    thread.start()
    deadline = time.monotonic() + 600
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.05)
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}", app
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        meter.uninstall()
        sock.close()


# --- the clients ---------------------------------------------------------------------------------------------------


def png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.full((64, 64, 3), 120, np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


async def speech_sse(http: httpx.AsyncClient, host: str) -> None:
    body = {"input": SENTENCE, "stream": True, "response_format": "pcm"}
    async with http.stream("POST", f"http://{host}/v1/audio/speech", json=body) as response:
        async for _ in response.aiter_lines():
            pass


async def speech_ws(http: httpx.AsyncClient, host: str) -> None:
    async with connect(f"ws://{host}/v1/audio/speech/stream", max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config", "response_format": "pcm", "stream_audio": True}))
        await ws.send(json.dumps({"type": "input.text", "text": SENTENCE}))
        await ws.send(json.dumps({"type": "input.done"}))
        async for message in ws:
            if isinstance(message, str) and json.loads(message)["type"] == "session.done":
                return


async def chat(http: httpx.AsyncClient, host: str, audio: bool = False) -> None:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "Tell me a story."}], "stream": True}
    body["max_tokens"] = 24 if audio else 64
    if audio:
        body.update(modalities=["text", "audio"], audio={"voice": "vivian", "format": "pcm16"})
    async with http.stream("POST", f"http://{host}/v1/chat/completions", json=body) as response:
        async for _ in response.aiter_lines():
            pass


async def image(http: httpx.AsyncClient, host: str) -> None:
    files = {"image": ("in.png", png(), "image/png")}
    data = {"prompt": "make it snowy", "stream": "true", "partial_images": "2"}
    async with http.stream("POST", f"http://{host}/v1/images/edits", files=files, data=data) as response:
        async for _ in response.aiter_lines():
            pass


async def video(http: httpx.AsyncClient, host: str) -> None:
    async with connect(f"ws://{host}/v1/realtime/video", max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.start", "prompt": "a kite over a hill", "num_frames": 66}))
        async for message in ws:
            if isinstance(message, str) and json.loads(message)["type"] in ("session.done", "error"):
                return


async def realtime(http: httpx.AsyncClient, host: str) -> None:
    async with connect(f"ws://{host}/v1/realtime", max_size=None) as ws:
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello there."}]}
        await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 24}}))
        async for message in ws:
            if json.loads(message)["type"] == "response.done":
                return


CLIENTS = {
    "speech_sse": speech_sse,
    "speech_ws": speech_ws,
    "chat": chat,
    "chat_audio": lambda http, host: chat(http, host, audio=True),
    "image": image,
    "video": video,
    "realtime": realtime,
}


async def load(host: str, counts: dict[str, int], seconds: float) -> dict[str, Any]:
    """``counts`` clients of each kind repeating their request for ``seconds``: requests done and failed."""
    done: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    end = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:

        async def client(kind: str) -> None:
            while time.monotonic() < end:
                try:
                    await CLIENTS[kind](http, host)
                    done[kind] += 1
                except Exception as exc:  # counted and shown: a failing stream is part of the result
                    failed[f"{kind}: {type(exc).__name__}"] += 1
                    await asyncio.sleep(0.2)

        tasks = [asyncio.create_task(client(kind)) for kind, n in counts.items() for _ in range(n)]
        await asyncio.sleep(seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"done": dict(done), "failed": dict(failed)}


def probe(host: str, seconds: float, probe_ms: float) -> list[float]:
    """``/health`` every ``probe_ms`` for ``seconds`` over one kept-alive connection, as a health checker asks:
    each answer's latency (ms). Blocking, in a process of its own: nothing else competes with its timing."""
    probes = []
    end = time.monotonic() + seconds
    with httpx.Client(timeout=30) as client:
        while time.monotonic() < end:
            start = time.perf_counter()
            response = client.get(f"http://{host}/health")
            probes.append((time.perf_counter() - start) * 1e3)
            response.raise_for_status()
            time.sleep(probe_ms / 1e3)
    return probes


def summary(probes: list[float]) -> dict[str, float]:
    return {
        "n": len(probes),
        "p50_ms": percentile(probes, 50),
        "p90_ms": percentile(probes, 90),
        "p99_ms": percentile(probes, 99),
        "max_ms": max(probes),
        "over_target": sum(1 for p in probes if p > TARGET_MS),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=36)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--probe-ms", type=float, default=25.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--smoke", action="store_true", help="one stream of each kind for 8 s")
    ap.add_argument("--clients", metavar="HOST", help=argparse.SUPPRESS)  # the clients' process (see the docstring)
    ap.add_argument("--probe", metavar="HOST", help=argparse.SUPPRESS)  # the prober's process
    args = ap.parse_args(argv)
    if args.smoke:
        args.streams, args.seconds = 6, 8.0
    counts = mix(args.streams)
    if args.clients:
        print(json.dumps(asyncio.run(load(args.clients, counts, args.seconds))))
        return 0
    if args.probe:
        print(json.dumps(probe(args.probe, args.seconds, args.probe_ms)))
        return 0
    meter = LoopMeter(sample_after=0.02)
    with serve(args.device, meter) as (host, _app):
        meter.reset()  # what loading ran on the loop is not what serving runs
        own = [sys.executable, __file__, "--streams", str(args.streams), "--seconds", str(args.seconds)]
        prober = subprocess.Popen(
            [*own, "--probe", host, "--probe-ms", str(args.probe_ms)], stdout=subprocess.PIPE, text=True
        )
        clients = subprocess.run([*own, "--clients", host], capture_output=True, text=True, timeout=args.seconds + 600)
        probes = json.loads(prober.communicate(timeout=600)[0].strip().splitlines()[-1])
        if clients.returncode:
            raise RuntimeError(f"the clients failed: {clients.stderr[-2000:]}")
        run = {**json.loads(clients.stdout.strip().splitlines()[-1]), "probes_ms": probes}
        loop = meter.report()
        loop["callbacks_over_20ms_cpu"] = meter.over(0.02)
    result = {
        "commit": git_commit(),
        "device": args.device,
        "streams": counts,
        "seconds": args.seconds,
        "health": summary(run["probes_ms"]),
        "target_ms": TARGET_MS,
        "requests_done": run["done"],
        "requests_failed": run["failed"],
        "loop": loop,
    }
    path = out_dir() / ("health_load_smoke.json" if args.smoke else f"health_load_{args.device}.json")
    path.write_text(json.dumps(result, indent=2) + "\n")
    h = result["health"]
    print(f"/health with {sum(counts.values())} streams {counts} for {args.seconds:.0f} s on {args.device}:")
    print(f"  p50 {h['p50_ms']:.1f} ms  p90 {h['p90_ms']:.1f}  p99 {h['p99_ms']:.1f}  max {h['max_ms']:.1f}"
          f"  ({h['over_target']} of {h['n']} over {TARGET_MS:.0f} ms)")  # fmt: skip
    print(f"  requests done {run['done']}  failed {run['failed']}")
    print("  longest loop callbacks (wall ms, thread CPU ms):")
    for wall, cpu in zip(loop["longest_wall"][:8], loop["longest_cpu"][:8], strict=False):
        print(f"    {wall['max_ms']:7.1f}  {wall['what']:<60}  |  {cpu['max_ms']:7.1f}  {cpu['what']}")
    print(f"  the loop's own CPU time: {loop['loop_cpu_s']:.1f} s; where most of it went (ms in all, runs):")
    for row in loop["busiest_cpu"][:8]:
        print(f"    {row['total_ms']:9.0f}  {row['runs']:7d}  {row['what']}")
    print("  where the loop was during callbacks over 20 ms:")
    for row in loop["sampled_inside_long_callbacks"][:10]:
        print(f"    {row['samples']:5d}  {row['where']}")
    slow_gc = loop["collections_over_5ms"]
    print(
        f"  garbage collections over 5 ms: {len(slow_gc)}, longest {max([c['ms'] for c in slow_gc], default=0):.0f} ms"
    )
    for stall in loop["stalls"][:5]:
        print(f"  the loop stalled {stall['late_ms']:.0f} ms; other threads were at:")
        for thread, stack in stall["threads"].items():
            print(f"    {thread:<28} {stack}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
