"""Benchmark-only serving: ``serve --load-format dummy``, and ``ignore_eos`` only with ``--enable-benchmark-fields``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
import torch
from serving_helpers import running_server
from websockets.sync.client import connect

from omni_stream.models.qwen3_tts.checkpoint import write_dummy_checkpoint, write_tiny_checkpoint
from omni_stream.realtime.common.errors import ApiError, from_exception
from omni_stream.realtime.common.json_fields import FieldError
from omni_stream.realtime.settings import Settings
from omni_stream.realtime.speech.params import parse_options

FRAMES = 6
SAMPLES_PER_FRAME = 1920  # 80 ms at 24 kHz
BENCH = Settings(enable_benchmark_fields=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("qwen3-tiny"), "custom_voice")


def _pcm_stream(url: str, **fields) -> httpx.Response:
    body = {"input": "Hello there.", "voice": "vivian", "response_format": "pcm", "stream_format": "audio", **fields}
    return httpx.post(f"{url}/v1/audio/speech", json=body, timeout=120)


def _ws_pcm(ws_url: str, **config) -> tuple[int, dict]:
    """Total PCM bytes of one utterance over the WebSocket, and its audio.done event."""
    with connect(f"{ws_url}/v1/audio/speech/stream") as ws:
        config = {"voice": "vivian", "response_format": "pcm", "stream_audio": True, **config}
        ws.send(json.dumps({"type": "session.config", **config}))
        ws.send(json.dumps({"type": "input.text", "text": "Hello there."}))
        ws.send(json.dumps({"type": "input.done"}))
        total, done = 0, None
        while True:
            message = ws.recv(timeout=120)
            if isinstance(message, bytes):
                total += len(message)
                continue
            event = json.loads(message)
            assert event["type"] != "error", event
            if event["type"] == "audio.done":
                done = event
            if event["type"] == "session.done":
                return total, done


# --- request schema ---


@pytest.mark.parametrize("websocket", [False, True])
@pytest.mark.parametrize("value", [True, False, None, "yes"])
def test_ignore_eos_is_refused_unless_enabled(websocket, value):
    with pytest.raises(ApiError) as info:
        parse_options({"ignore_eos": value, "max_new_tokens": 4}, Settings(), websocket=websocket)
    assert info.value.status == 400 and info.value.param == "ignore_eos"
    assert "benchmark" in info.value.message
    assert parse_options({"max_new_tokens": 4}, Settings(), websocket=websocket).ignore_eos is False


@pytest.mark.parametrize("websocket", [False, True])
def test_ignore_eos_with_benchmark_fields(websocket):
    assert parse_options({"ignore_eos": True, "max_new_tokens": 4}, BENCH, websocket=websocket).ignore_eos is True
    assert parse_options({"ignore_eos": False}, BENCH, websocket=websocket).ignore_eos is False
    for body in ({"ignore_eos": True}, {"ignore_eos": "true", "max_new_tokens": 4}):
        with pytest.raises((ApiError, FieldError)) as info:  # a wire rule's, or the boolean reader's: a 400
            parse_options(body, BENCH, websocket=websocket)
        error = from_exception(info.value)
        assert error.status == 400 and error.param == "ignore_eos"


# --- a real server (tiny checkpoint, weights read from disk) ---


def test_without_the_flag_ignore_eos_is_a_400_on_http_and_closes_the_websocket(tiny):
    with running_server(tiny, Settings()) as server:
        r = _pcm_stream(server.url, max_new_tokens=FRAMES, ignore_eos=True)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "ignore_eos"
        with connect(f"{server.ws_url}/v1/audio/speech/stream") as ws:
            ws.send(json.dumps({"type": "session.config", "voice": "vivian", "ignore_eos": True}))
            event = json.loads(ws.recv(timeout=30))
            assert event["type"] == "error" and "ignore_eos" in event["message"]
        # The same request without the field is served.
        r = _pcm_stream(server.url, max_new_tokens=FRAMES)
        assert r.status_code == 200 and 0 < len(r.content) <= 2 * (FRAMES - 1) * SAMPLES_PER_FRAME


def test_ignore_eos_generates_exactly_max_new_tokens_frames(tiny):
    with running_server(tiny, BENCH) as server:
        for seed in (0, 1):
            r = _pcm_stream(server.url, max_new_tokens=FRAMES, ignore_eos=True, seed=seed)
            assert r.status_code == 200, r.text
            assert len(r.content) == 2 * FRAMES * SAMPLES_PER_FRAME  # int16 PCM
            # Without it at most N - 1 frames come out (the last code-0 sample never gets its residual codes).
            r = _pcm_stream(server.url, max_new_tokens=FRAMES, seed=seed)
            assert r.status_code == 200 and len(r.content) <= 2 * (FRAMES - 1) * SAMPLES_PER_FRAME
        total, done = _ws_pcm(server.ws_url, max_new_tokens=FRAMES, ignore_eos=True)
        assert total == done["total_bytes"] == 2 * FRAMES * SAMPLES_PER_FRAME


# --- `omni-stream serve --load-format dummy` as a subprocess ---


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_loads_a_dummy_checkpoint_and_accepts_ignore_eos(tiny, tmp_path):
    # The tiny talker config with the real-size speech tokenizer config; no weight file anywhere.
    dummy = write_dummy_checkpoint(tiny, tmp_path / "dummy", dtype=torch.float32, weights=False)
    assert not list(dummy.glob("**/*.safetensors"))
    port = _free_port()
    cmd = [sys.executable, "-m", "omni_stream.cli", "serve", "--model", str(dummy), "--load-format", "dummy",
           "--enable-benchmark-fields", "--dtype", "float32", "--port", str(port), "--log-level", "warning",
           "--voices-dir", str(tmp_path / "voices")]  # fmt: skip
    env = {**os.environ, "OMNI_STREAM_API_KEY": ""}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "server did not become healthy"
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        r = _pcm_stream(url, max_new_tokens=FRAMES, ignore_eos=True, seed=3)
        assert r.status_code == 200, r.text
        assert len(r.content) == 2 * FRAMES * SAMPLES_PER_FRAME
        total, _ = _ws_pcm(f"ws://127.0.0.1:{port}", max_new_tokens=FRAMES, ignore_eos=True)
        assert total == 2 * FRAMES * SAMPLES_PER_FRAME
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out
    assert "--load-format dummy" in out and "benchmark fields enabled" in out


def test_serve_help_lists_the_benchmark_options():
    out = subprocess.run([sys.executable, "-m", "omni_stream.cli", "serve", "--help"], capture_output=True, text=True)
    assert "--load-format {auto,dummy}" in out.stdout and "--enable-benchmark-fields" in out.stdout
