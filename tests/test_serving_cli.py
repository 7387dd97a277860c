"""`omni-stream serve` as a subprocess: loads, serves, shuts down gracefully on SIGINT/SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
from serving_helpers import MODEL

pytest_plugins = ("serving_fixtures",)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0]
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("server did not become healthy")


def serve(args: list[str], env: dict[str, str], sig: int = signal.SIGINT) -> tuple[str, list[str]]:
    """Run ``omni-stream serve ARGS`` until healthy, list its models, stop it with ``sig``; (output, model ids)."""
    port = free_port()
    cmd = [sys.executable, "-m", "omni_stream.cli", "serve", "--port", str(port), "--log-level", "warning", *args]
    proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc)
        assert httpx.get(f"{url}/v1/models").status_code == 401  # the key came from the environment
        models = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer k"}).json()
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert f"listening on http://127.0.0.1:{port}" in out
    return out, [m["id"] for m in models["data"]]


def test_serve_subcommand_stops_cleanly_on_sigterm(synthetic_checkpoint, tmp_path):
    args = ["--model", str(synthetic_checkpoint), "--voices-dir", str(tmp_path / "voices")]
    out, models = serve(args, {"OMNI_STREAM_API_KEY": "k"}, signal.SIGTERM)
    assert models == [MODEL] and "loaded synthetic-tts" in out
    assert (tmp_path / "voices").is_dir()


def test_serve_without_model_uses_the_embedded_checkpoint_and_stops_on_sigint(tmp_path):
    env = {"OMNI_STREAM_API_KEY": "k", "OMNI_STREAM_CACHE": str(tmp_path / "cache")}
    out, models = serve(["--voices-dir", str(tmp_path / "voices")], env, signal.SIGINT)
    assert "no --model given: serving the embedded tiny checkpoint" in out
    assert len(models) == 1 and models[0].startswith("qwen3-tts-tiny")


def test_serve_help_lists_options():
    out = subprocess.run([sys.executable, "-m", "omni_stream.cli", "serve", "--help"], capture_output=True, text=True)
    for option in (
        "--model",
        "--host",
        "--port",
        "--api-key",
        "--voices-dir",
        "--device",
        "--dtype",
        "--max-concurrency",
    ):
        assert option in out.stdout
