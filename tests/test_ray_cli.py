"""``omni-stream serve --ray`` as a subprocess: starts a local cluster, deploys, serves through Ray's proxy,
refuses replicas the cluster cannot place, and on SIGTERM deletes the app and stops the cluster. The replicas serve
the tiny Qwen3-TTS CustomVoice checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from tiny_models import tiny_tts

from omni_stream.realtime.replica import HEADER

pytest.importorskip("ray.serve")

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_ray(*args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "omni_stream.cli", "serve", "--ray", *args]
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_serve_ray_deploys_serves_and_stops(tmp_path):
    port = free_port()
    proc = serve_ray(
        "--model", str(tiny_tts()), "--port", str(port), "--replicas", "2",
        "--ray-cpus-per-replica", "0.5", "--max-concurrency", "4", "--voices-dir", str(tmp_path / "voices"),
    )  # fmt: skip
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the command prints the address once the replicas are up
            lines.append(line)
            if "listening on" in line:
                break
        assert f"2 replica(s) listening on http://127.0.0.1:{port}" in lines[-1], "".join(lines)
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=60) as c:
            seen = {c.get("/health").headers[HEADER] for _ in range(40)}
            body = {"input": "From the command.", "voice": "vivian", "response_format": "pcm", "stream": False}
            r = c.post("/v1/audio/speech", json={**body, "max_new_tokens": 4})
        assert len(seen) == 2
        assert r.status_code == 200 and 0 < len(r.content) <= 4 * 1920 * 2 and len(r.content) % (1920 * 2) == 0
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, "".join(lines) + out
    assert time.monotonic() - started < 120
    with pytest.raises(httpx.HTTPError):  # the proxy is gone with the cluster
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


def test_serve_ray_refuses_replicas_the_local_cluster_cannot_place():
    proc = serve_ray(
        "--model", str(tiny_tts()), "--port", str(free_port()), "--replicas", "2", "--device", "cuda",
    )  # fmt: skip
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 2, out
    assert "cannot place replicas: 2 replica(s) need 2 GPU, the cluster has 0" in out
