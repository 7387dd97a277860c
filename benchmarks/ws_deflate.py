"""What WebSocket per-message deflate costs a speech server (why ``omni-stream serve`` declines it by default).

Run: ``python benchmarks/ws_deflate.py`` (CPU only; writes ``ws_deflate.json`` to ``$OUT`` or
``benchmarks/results``). Two parts:

1. The compressor alone: the extension uvicorn negotiates when a client offers deflate (websockets'
   ``ServerPerMessageDeflateFactory`` with its defaults, context takeover on) encoding the binary messages of
   a PCM stream, 16-bit 24 kHz, in the codec windows' sizes (1-8 frames of 80 ms). Three signals: the
   synthetic model's tone (a plain sine), a speech-like signal (a voiced glide through formant-shaped harmonics with
   breath noise and pauses) and white noise (what random weights say). Printed: microseconds a message, MB/s, the
   compressed size, and the share of one core the compressor takes at 100x, 250x and 400x real time in all.
2. End to end: ``omni-stream serve`` on the embedded tiny Qwen3-TTS (random weights: its audio is noise-like,
   as a real-size checkpoint with dummy weights) as a subprocess, ``--sessions`` WebSocket sessions streaming
   PCM at once (each client offers deflate, as browsers and websockets do), with and without
   ``--ws-deflate``: CPU milliseconds per second of audio delivered of the server's event loop thread (its
   main thread, from /proc), of the whole server process (the model's threads too) and of the client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
from provenance import git_commit
from tts_bench import free_port, wait_healthy
from websockets.asyncio.client import connect
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.frames import Frame, Opcode

from omni_stream.models.qwen3_tts.family import embedded_default_checkpoint

ROOT = Path(__file__).resolve().parent
RATE = 24000
FRAME = 1920  # samples in one 80 ms frame
BYTES_PER_RT_SECOND = RATE * 2  # 16-bit mono


def speech_like(seconds: float, seed: int = 0) -> np.ndarray:
    """Voiced stretches (a pitch glide 80-220 Hz, harmonics under three moving formants), breath noise, pauses."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    f0 = 150 + 60 * np.sin(2 * np.pi * 0.7 * t) + 10 * np.sin(2 * np.pi * 5.3 * t)
    phase = 2 * np.pi * np.cumsum(f0) / RATE
    voiced = np.zeros_like(t)
    formants = [(500 + 200 * np.sin(2 * np.pi * 1.1 * t), 80), (1500 + 400 * np.sin(2 * np.pi * 0.9 * t), 120),
                (2500.0 + 0 * t, 160)]  # fmt: skip
    for k in range(1, 30):
        hk = k * f0
        gain = sum(np.exp(-(((hk - fc) / bw) ** 2) / 2) for fc, bw in formants) / k**0.5
        voiced += gain * np.sin(k * phase)
    syllables = 0.5 * (1 - np.cos(2 * np.pi * 3.5 * t)) * (np.sin(2 * np.pi * 0.31 * t) > -0.4)
    x = voiced * syllables + 0.02 * rng.standard_normal(t.size)
    x = 0.3 * x / np.abs(x).max()
    return (x * 32767).astype(np.int16)


def signals(seconds: float) -> dict[str, np.ndarray]:
    # the sine the tests' synthetic TTS speaks for one voice: 260 Hz at a quarter of full scale, whole 80 ms frames
    n = int(seconds * RATE) // FRAME * FRAME
    tone = (0.25 * np.sin(2 * np.pi * 260.0 * np.arange(n) / RATE) * 32767).astype(np.int16)
    noise = (np.random.default_rng(1).uniform(-0.3, 0.3, int(seconds * RATE)) * 32767).astype(np.int16)
    return {"synthetic tone": tone, "speech-like": speech_like(seconds), "white noise": noise}


def compressor(pcm: np.ndarray, message_samples: int) -> dict:
    """Encode ``pcm`` as binary messages of ``message_samples`` samples through one negotiated extension."""
    _, ext = ServerPerMessageDeflateFactory().process_request_params([], [])
    data = pcm.tobytes()
    step = message_samples * 2
    messages = [data[i : i + step] for i in range(0, len(data) - step + 1, step)]
    start = time.perf_counter()
    out = sum(len(ext.encode(Frame(Opcode.BINARY, m)).data) for m in messages)
    elapsed = time.perf_counter() - start
    sent = len(messages) * step
    mb_s = sent / elapsed / 1e6
    return {"message_bytes": step, "messages": len(messages), "us_per_message": 1e6 * elapsed / len(messages),
            "mb_per_s": mb_s, "compressed_ratio": out / sent,
            **{f"core_share_at_{x}x": x * BYTES_PER_RT_SECOND / (mb_s * 1e6) for x in (100, 250, 400)}}  # fmt: skip


def cpu_seconds(stat: str) -> float:
    """utime + stime of a /proc ``stat`` file (a process, or one of its threads under task/)."""
    fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


async def session(url: str, text: str) -> tuple[int, list[str]]:
    """Audio bytes one session receives, and the extensions its handshake negotiated."""
    received = 0
    async with connect(url, max_size=None, ping_interval=None) as ws:  # compression="deflate": the offer
        await ws.send(json.dumps({"type": "session.config", "voice": "ryan", "response_format": "pcm",
                                  "stream_audio": True}))  # fmt: skip
        await ws.send(json.dumps({"type": "input.text", "text": text}))
        await ws.send(json.dumps({"type": "input.done"}))
        async for message in ws:
            if isinstance(message, bytes):
                received += len(message)
            elif json.loads(message)["type"] == "session.done":
                return received, [e.name for e in ws.protocol.extensions]
    raise RuntimeError("the session ended before session.done")


async def measure(proc: subprocess.Popen, port: int, sessions: int, text: str) -> dict:
    """``sessions`` streams at once against the running server; CPU and wall time while they run."""
    async with httpx.AsyncClient() as client:
        await wait_healthy(client, f"http://127.0.0.1:{port}", proc, 120.0)
    loop_stat, process_stat = f"/proc/{proc.pid}/task/{proc.pid}/stat", f"/proc/{proc.pid}/stat"
    url = f"ws://127.0.0.1:{port}/v1/audio/speech/stream"
    loop0, server0 = cpu_seconds(loop_stat), cpu_seconds(process_stat)
    client0, wall0 = time.process_time(), time.perf_counter()
    done = await asyncio.gather(*(session(url, text) for _ in range(sessions)))
    loop, server = cpu_seconds(loop_stat) - loop0, cpu_seconds(process_stat) - server0
    client, wall = time.process_time() - client0, time.perf_counter() - wall0
    audio_s = sum(n for n, _ in done) / BYTES_PER_RT_SECOND
    negotiated = sorted({name for _, names in done for name in names})
    return {"negotiated": negotiated, "sessions": sessions, "audio_s": audio_s, "wall_s": wall,
            "loop_cpu_ms_per_audio_s": 1e3 * loop / audio_s, "server_cpu_ms_per_audio_s": 1e3 * server / audio_s,
            "client_cpu_ms_per_audio_s": 1e3 * client / audio_s, "x_real_time": audio_s / wall}  # fmt: skip


def end_to_end(checkpoint: Path, deflate: bool, sessions: int, chars: int) -> dict:
    """``omni-stream serve`` on ``checkpoint`` (with ``--ws-deflate`` when ``deflate``) for one measurement."""
    port = free_port()
    cmd = [sys.executable, "-m", "omni_stream.cli", "serve", "--model", str(checkpoint), "--port", str(port),
           "--log-level", "warning", "--max-concurrency", str(sessions)]  # fmt: skip
    cmd += ["--ws-deflate"] if deflate else []
    text = ("Streaming speech keeps every listener's audio flowing. " * 40)[:chars]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        return {"deflate": deflate, **asyncio.run(measure(proc, port, sessions, text))}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="audio per signal in part 1")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--chars", type=int, default=160, help="text per session")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    result: dict = {"git_commit": git_commit(), "machine": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "compressor": {}, "end_to_end": []}  # fmt: skip
    spf = FRAME
    print("== the compressor alone (zlib through websockets' permessage-deflate, context takeover)")
    for name, pcm in signals(args.seconds).items():
        for frames in (1, 2, 4, 8):
            r = compressor(pcm, frames * spf)
            result["compressor"].setdefault(name, []).append(r)
            print(f"  {name:15s} {frames} frames ({r['message_bytes']:6d} B): {r['us_per_message']:7.1f} us a message,"
                  f" {r['mb_per_s']:6.1f} MB/s, size x{r['compressed_ratio']:.2f}; one core's share at 100x/250x/400x:"
                  f" {r['core_share_at_100x']:.0%} / {r['core_share_at_250x']:.0%} / {r['core_share_at_400x']:.0%}",
                  flush=True)  # fmt: skip
    print(f"== end to end: {args.sessions} WebSocket sessions on the embedded tiny Qwen3-TTS, the client offering"
          " deflate")  # fmt: skip
    checkpoint = embedded_default_checkpoint()
    for _ in range(args.rounds):
        for deflate in (False, True):
            r = end_to_end(checkpoint, deflate, args.sessions, args.chars)
            result["end_to_end"].append(r)
            print(f"  deflate {'on ' if deflate else 'off'}: {r['audio_s']:.0f} s of audio in {r['wall_s']:.2f} s"
                  f" ({r['x_real_time']:.1f}x); CPU ms an audio second: event loop"
                  f" {r['loop_cpu_ms_per_audio_s']:.2f}, server process {r['server_cpu_ms_per_audio_s']:.1f},"
                  f" client {r['client_cpu_ms_per_audio_s']:.2f}", flush=True)  # fmt: skip
    out = Path(os.environ.get("OUT") or ROOT / "results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "ws_deflate.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
