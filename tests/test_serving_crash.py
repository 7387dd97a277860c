"""A server killed (SIGKILL) during a voice upload leaves no half-written voice; a restart restores the rest.

The server is ``omni-stream serve`` on the tiny Qwen3-TTS Base checkpoint (the family that clones uploaded voices)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import httpx
from serving_helpers import wav_bytes
from test_serving_cli import free_port, wait_healthy
from tiny_models import tiny_tts

BOUNDARY = "omni-stream-test-boundary"


def _multipart(name: str, audio: bytes) -> bytes:
    parts = []
    for field, value in (("name", name), ("consent", "yes")):
        parts.append(f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{field}"\r\n\r\n{value}\r\n'.encode())
    parts.append(
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="audio_sample"; filename="v.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n".encode()
        + audio
        + b"\r\n"
    )
    parts.append(f"--{BOUNDARY}--\r\n".encode())
    return b"".join(parts)


def _start(checkpoint, voices_dir, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "omni_stream.cli", "serve", "--model", str(checkpoint), "--port", str(port)]
    cmd += ["--voices-dir", str(voices_dir), "--log-level", "warning"]
    env = {k: v for k, v in os.environ.items() if k != "OMNI_STREAM_API_KEY"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_sigkill_mid_upload_leaves_no_half_voice_and_restart_restores(tmp_path):
    checkpoint = tiny_tts("base")
    voices_dir = tmp_path / "voices"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start(checkpoint, voices_dir, port)
    try:
        wait_healthy(url, proc)
        ok = httpx.post(
            f"{url}/v1/audio/voices",
            data={"name": "Keeper", "consent": "yes"},
            files={"audio_sample": ("k.wav", wav_bytes(2.0), "audio/wav")},
            timeout=30,
        )
        assert ok.status_code == 200, ok.text
        # Send the headers and half of a valid upload's body, then kill the server while it waits for the rest.
        body = _multipart("halfway", wav_bytes(3.0))
        head = (
            f"POST /v1/audio/voices HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
            f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(head + body[: len(body) // 2])
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    # A crash between the temp write and the rename leaves only a temp file: plant one as that crash would.
    (voices_dir / ".tmp-halfway-abc123").write_bytes(b"partial")

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start(checkpoint, voices_dir, port)
    try:
        wait_healthy(url, proc)
        listing = httpx.get(f"{url}/v1/audio/voices", timeout=10).json()
        names = [v["name"] for v in listing["uploaded_voices"]]
        assert names == ["Keeper"]
        assert "keeper" in [v.lower() for v in listing["voices"]]
        assert "halfway" not in [v.lower() for v in listing["voices"]]
        assert not [p.name for p in voices_dir.iterdir() if p.name.startswith(".tmp-")]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
