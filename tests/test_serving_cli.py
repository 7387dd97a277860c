"""`omni-stream serve` as a subprocess: loads, serves, shuts down gracefully on SIGINT/SIGTERM."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import pty
import re
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time

import httpx
import pytest
from serving_helpers import FRAME, tts_checkpoint

from omni_stream.family_registry import default_available, default_kinds


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


def serve(
    args: list[str], env: dict[str, str], sig: int = signal.SIGINT, *, terminal: bool = False
) -> tuple[str, list[str]]:
    """Run ``omni-stream serve ARGS`` until healthy, list its models, stop it with ``sig``; (output, model ids).
    ``terminal``: its output goes to a pseudo-terminal, as in a user's shell (else a pipe, as in a log file)."""
    port = free_port()
    cmd = [sys.executable, "-m", "omni_stream.cli", "serve", "--port", str(port), "--log-level", "warning", *args]
    read: list[bytes] = []
    if terminal:
        leader, follower = pty.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # a terminal has a size
        proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=follower, stderr=follower)
        os.close(follower)

        def drain() -> None:  # until the server has exited and closed its side (EIO)
            with contextlib.suppress(OSError):
                while chunk := os.read(leader, 65536):
                    read.append(chunk)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
    else:
        proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc)
        assert httpx.get(f"{url}/v1/models").status_code == 401  # the key came from the environment
        models = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer k"}).json()
        proc.send_signal(sig)
        if terminal:
            proc.wait(timeout=30)
            reader.join(timeout=10)
            os.close(leader)
            out = b"".join(read).decode(errors="replace").replace("\r\n", "\n")  # the terminal's ONLCR undone
        else:
            out = proc.communicate(timeout=30)[0].decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert f"listening on http://127.0.0.1:{port}" in out
    return out, [m["id"] for m in models["data"]]


def test_serve_subcommand_stops_cleanly_on_sigterm(tmp_path):
    checkpoint = tts_checkpoint()
    args = ["--model", str(checkpoint), "--voices-dir", str(tmp_path / "voices"), "--threads", "2"]
    args += ["--tune", "step_ahead=off"]
    env = {"OMNI_STREAM_API_KEY": "k", "OMNI_STREAM_ADMISSION": "on"}
    out, models = serve(args, env, signal.SIGTERM)
    assert models == [checkpoint.name] and f"loaded {checkpoint.name}" in out, out
    assert (tmp_path / "voices").is_dir()
    assert "API key required on /v1 routes" in out and "; API key required;" in out  # the banner says auth is on
    assert "2 torch threads" in out  # --threads, as the device worker's thread reports it
    # the banner prints the tuning it runs with: the environment's switches, the flags over them, never the key
    tuning = next(line for line in out.splitlines() if line.startswith("omni-stream serve: tuning "))
    assert " threads=2 " in tuning and " admission=on " in tuning and " step_ahead=off " in tuning
    assert "api_key" not in tuning and "=k " not in tuning


def test_serve_without_model_uses_the_embedded_checkpoint_and_stops_on_sigint(tmp_path):
    env = {"OMNI_STREAM_API_KEY": "k", "OMNI_STREAM_CACHE": str(tmp_path / "cache")}
    out, models = serve([], env, signal.SIGINT)
    assert "no --model given: serving the embedded tiny model of every kind" in out
    assert re.search(r"pages http://127\.0\.0\.1:\d+/ \(speech\), http://127\.0\.0\.1:\d+/realtime", out), out
    assert not re.search(r"\d+%\|", out), out  # output to a pipe (a log file): no progress bars redrawn into it
    # Every kind with an embedded default: speech (Qwen3-TTS) first, text (a tiny Qwen3), transcription (Whisper), ...
    assert models[0].startswith("qwen3-tts-tiny") and "qwen3-tiny-chat-v3" in models
    assert any(m.startswith("whisper-tiny") for m in models)
    # the image default joins them where the [image] extra (diffusers) is installed
    assert ("stable-diffusion-tiny" in models) == bool(importlib.util.find_spec("diffusers"))  # both image routes
    assert ("helios-tiny-v1" in models) == bool(importlib.util.find_spec("diffusers"))
    assert len(models) == len([kind for kind in default_kinds() if default_available(kind)])
    # OMNI_STREAM_CACHE moves the voices dir too (beside the embedded checkpoint)
    assert f"voices dir {tmp_path / 'cache' / 'voices'}" in out and (tmp_path / "cache" / "voices").is_dir()
    assert (tmp_path / "cache" / "checkpoints").is_dir()


def test_banner_notes():
    from omni_stream.realtime.server import banner_notes
    from omni_stream.realtime.settings import Settings

    assert banner_notes(Settings(api_key="k"))[0].startswith("API key required")
    assert banner_notes(Settings())[0].startswith("no API key")
    assert any("raw audio bytes" in n for n in banner_notes(Settings(legacy_stream_raw=True)))


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
        "--threads",
        "--legacy-stream-raw",
        "--ws-deflate",
        "--http",
        "--loop",
    ):
        assert option in out.stdout
    assert "$OMNI_STREAM_CACHE" in out.stdout  # where uploaded voices go by default


def test_a_parser_or_loop_that_is_not_installed_is_named(monkeypatch):
    import importlib.util

    from omni_stream.realtime.server import missing_server_packages, uvicorn_config

    installed = {"httptools"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name in installed else None)
    assert missing_server_packages("auto", "auto") is None  # uvicorn falls back by itself
    assert missing_server_packages("httptools", "asyncio") is None
    message = missing_server_packages("h11", "uvloop")
    assert message is not None and message.startswith("--loop uvloop needs the uvloop package")
    assert "--http" not in message and "--loop auto" in message
    installed.clear()
    both = missing_server_packages("httptools", "uvloop")
    assert both is not None and "--http httptools needs the httptools package" in both and "--loop uvloop" in both
    assert uvicorn_config(object(), loop="asyncio").loop == "asyncio"
    assert uvicorn_config(object()).loop == "auto"


def test_serve_refuses_a_missing_parser_before_loading():
    import importlib.util

    absent = [name for name in ("httptools", "uvloop") if importlib.util.find_spec(name) is None]
    if not absent:
        pytest.skip("httptools and uvloop are both installed here")
    flag = {"httptools": "--http", "uvloop": "--loop"}[absent[0]]
    cmd = [sys.executable, "-m", "omni_stream.cli", "serve", flag, absent[0], "--port", "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"{flag} {absent[0]} needs the {absent[0]} package" in out.stderr
    assert "Traceback" not in out.stderr and "loading" not in out.stdout  # refused before any model loads


def test_bare_command_prints_the_commands():
    out = subprocess.run([sys.executable, "-m", "omni_stream.cli"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    for command in ("serve", "speak", "make-checkpoint", "Synthesize text to an audio file."):
        assert command in out.stderr, out.stderr


def test_hub_ids_resolve_from_the_local_cache_only(monkeypatch, tmp_path):
    import huggingface_hub

    from omni_stream.realtime.server import ModelNotFound, resolve_model

    calls = []

    def snapshot_download(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert resolve_model("Qwen/Qwen3-TTS-12Hz-0.6B-Base") == str(tmp_path)
    assert calls == [("Qwen/Qwen3-TTS-12Hz-0.6B-Base", {"local_files_only": True})]
    assert resolve_model(str(tmp_path)) == str(tmp_path) and len(calls) == 1  # directories are used as they are
    monkeypatch.undo()
    with pytest.raises(ModelNotFound) as info:
        resolve_model("omni-stream-tests/no-such-model")
    message = str(info.value)
    assert "'omni-stream-tests/no-such-model' is not a directory" in message
    assert "not in the local Hugging Face cache" in message and "never downloads" in message


def test_serve_reports_a_missing_model_without_downloading(tmp_path):
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "0"}
    cmd = [sys.executable, "-m", "omni_stream.cli", "serve", "--model", "omni-stream-tests/no-such-model"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "cannot find model: 'omni-stream-tests/no-such-model' is not a directory" in proc.stderr
    assert str(tmp_path / "hub") in proc.stderr and not (tmp_path / "hub" / "models--omni-stream-tests").exists()


def test_what_a_user_gets_wrong_is_said_in_one_line_and_before_any_model_loads(tmp_path):
    """A port in use is refused before loading (it was found after every model had loaded); a directory that is
    not a checkpoint, or a file, fails start-up with its one-line reason, not a traceback."""
    base = [sys.executable, "-m", "omni_stream.cli", "serve"]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([*base, "--port", str(port)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and f"cannot listen on http://127.0.0.1:{port}" in proc.stderr
    assert "loading" not in proc.stdout  # nothing loaded
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    for model, words in ((tmp_path / "empty", "config.json is missing"), (tmp_path / "file", "is a file")):
        cmd = [*base, "--port", str(free_port()), "--model", str(model)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 3 and f"omni-stream: cannot start: {model}" in out and words in out, out
        assert "Traceback" not in out
    proc = subprocess.run([*base, "--port", "70000"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "a port is 0-65535" in proc.stderr
    proc = subprocess.run([*base, "--port", "abc"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "a port is a whole number 0-65535, got 'abc'" in proc.stderr, proc.stderr
    assert "port_number" not in proc.stderr  # not the name of the function that parses it


def test_sigterm_with_an_http_stream_and_an_open_websocket(tmp_path):
    """Shutdown lets the in-flight HTTP stream finish, closes the WebSocket with 1001, and exits 0 promptly."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    frames = 60  # exactly this many (ignore_eos): several seconds of generation, so both are mid-stream
    port = free_port()
    cmd = [sys.executable, "-m", "omni_stream.cli", "serve", "--port", str(port), "--log-level", "warning"]
    cmd += ["--model", str(tts_checkpoint()), "--voices-dir", str(tmp_path / "voices"), "--enable-benchmark-fields"]
    env = {k: v for k, v in os.environ.items() if k != "OMNI_STREAM_API_KEY"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    text = "A long sentence that keeps the stream busy for a while."
    long = {"max_new_tokens": frames, "ignore_eos": True}
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc)
        body = {"input": text, "voice": "vivian", "response_format": "pcm", "stream_format": "audio", **long}
        with (
            httpx.Client(base_url=url, timeout=30) as http,
            http.stream("POST", "/v1/audio/speech", json=body) as stream,
            connect(f"ws://127.0.0.1:{port}/v1/audio/speech/stream", open_timeout=10) as ws,
        ):
            assert ws.protocol.extensions == []  # the offered deflate declined: serve's default
            chunks = stream.iter_bytes()
            received = len(next(chunks))  # the stream is in flight
            config = {"type": "session.config", "voice": "ryan", "response_format": "pcm", "stream_audio": True}
            ws.send(json.dumps({**config, **long}))
            ws.send(json.dumps({"type": "input.text", "text": text}))
            ws.send(json.dumps({"type": "input.done"}))
            while not isinstance(ws.recv(timeout=10), bytes):  # audio is flowing on the socket too
                pass
            stopped = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    ws.recv(timeout=15)
            assert closed.value.rcvd is not None and closed.value.rcvd.code in (1000, 1001)
            received += sum(len(c) for c in chunks)  # ends cleanly: a cut chunked body would raise here
        out, _ = proc.communicate(timeout=30)
        elapsed = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert elapsed < 15, elapsed  # well inside uvicorn's 10 s grace plus the session grace
    assert received == frames * FRAME * 2  # the whole utterance, 16-bit samples


LOG_RECORD = re.compile(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) omni_stream|\[transformers\]|\[diffusers\]")


def test_start_up_shows_one_progress_display_with_log_lines_on_their_own():
    """What a new user sees on ``omni-stream serve``: no notices from transformers about torchvision (the PIL
    image processors are the ones used), no progress bars of the libraries beside each model's own, and every log
    line on a line of its own (as a terminal shows it: the text after a line's last carriage return)."""
    out, models = serve(["--log-level", "info"], {"OMNI_STREAM_API_KEY": "k"}, signal.SIGINT, terminal=True)
    assert len(models) == len([kind for kind in default_kinds() if default_available(kind)])
    assert "torchvision" not in out, out
    shown = [line.rsplit("\r", 1)[-1] for line in out.split("\n")]
    bars = [line for line in out.replace("\r", "\n").split("\n") if re.search(r"\d+%\|", line)]
    assert bars and all(bar.startswith("loading ") for bar in bars), [b for b in bars if not b.startswith("loading")]
    records = [line for line in shown if LOG_RECORD.search(line)]
    assert records and all(LOG_RECORD.match(line) for line in records), [r for r in records if not LOG_RECORD.match(r)]


async def test_a_stop_asked_while_the_models_load_ends_the_start_up_between_models():
    """What SIGINT during loading does (GracefulServer.handle_exit sets the state's stopping event): the start-up
    is cancelled instead of serving once everything has loaded, and says so in one line."""
    import anyio

    from omni_stream.realtime.app import StartupStopped, create_app
    from omni_stream.realtime.settings import Settings

    started = anyio.Event()

    async def slow_load():
        started.set()
        await anyio.sleep_forever()  # a model that takes long to load

    app = create_app(slow_load, Settings(vad_factory=None, turn_model_factory=None))
    state = app.state.omni
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def stop_when_loading():
                await started.wait()
                assert state.stopping is not None
                state.stopping.set()

            tg.start_soon(stop_when_loading)
            with pytest.raises(StartupStopped):
                async with app.router.lifespan_context(app):
                    pytest.fail("the server started")
    assert isinstance(state.startup_error, StartupStopped) and not state.ready


def test_webrtcs_libraries_keep_their_info_lines_out_of_the_servers_log():
    """aioice wrote ~8 INFO lines a WebRTC connection into the server's log: above DEBUG they log warnings only."""
    import logging

    from omni_stream.realtime.server import CHATTY_LIBRARIES, quiet_libraries

    loggers = [logging.getLogger(name) for name in CHATTY_LIBRARIES]
    before = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.NOTSET)
        quiet_libraries("DEBUG")
        assert all(logger.level == logging.NOTSET for logger in loggers)  # --log-level debug shows them
        quiet_libraries("INFO")
        assert all(logger.level == logging.WARNING for logger in loggers)
        assert not logging.getLogger("aioice.ice").isEnabledFor(logging.INFO)
    finally:
        for logger, level in zip(loggers, before, strict=True):
            logger.setLevel(level)
