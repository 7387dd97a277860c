"""vLLM-Omni's own example and benchmark clients, unchanged, against ``omni-stream serve`` on the tiny Qwen3-TTS.

The scripts come from vLLM-Omni's source distributions on PyPI (``tests/vllm_omni_clients.py fetch``, run by
``.ci/run``); they are never committed here. The server is the real CLI in a subprocess, serving the tiny random
Qwen3-TTS CustomVoice checkpoint under the name the clients default to (its speakers are the real ones, Vivian
first), so each runs with nothing changed but where the server is (and its inputs). The checkpoint decodes
greedily and says ``max_new_tokens`` 10 in its ``generation_config.json`` (``tiny_models.tiny_tts``): a request
that names no bound speaks 9 frames, and the same text in the same voice gives the same audio, so every file the
clients save is checked against what the model says when asked directly (to one 16-bit step: a request batched
with others computes in other shapes).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
from test_serving_cli import free_port, wait_healthy
from tiny_models import tiny_tts
from vllm_omni_clients import client

MODEL = "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"  # openai_speech_client.py's default model
RATE = 24000
FRAME = 1920  # samples per 80 ms codec frame
FRAMES = 9  # what a request without max_new_tokens speaks (generation_config max_new_tokens 10, greedy)
CHECKPOINT_FRAMES = FRAMES + 1


def script(name: str) -> Path:
    path = client(name)
    if path is None:
        pytest.skip(f"vLLM-Omni's {name} was not fetched: run `python tests/vllm_omni_clients.py fetch` (.ci/run does)")
    return path


def direct(port: int, voice: str, text: str, **fields) -> np.ndarray:
    """What the server speaks for ``text`` in ``voice`` when asked itself (float32 from PCM16)."""
    body = {"input": text, "voice": voice, "response_format": "pcm", **fields}
    r = httpx.post(f"http://127.0.0.1:{port}/v1/audio/speech", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return np.frombuffer(r.content, "<i2").astype(np.float32) / 32767


def assert_same_audio(got: np.ndarray, want: np.ndarray) -> None:
    assert got.size == want.size and got.size > 0, (got.size, want.size)
    assert np.abs(got - want).max() <= 1.5 / 32767  # one 16-bit step


@contextlib.contextmanager
def omni_stream_serve(tmp: Path, *extra: str) -> Iterator[int]:
    checkpoint = tiny_tts("custom_voice", greedy_frames=CHECKPOINT_FRAMES)
    port = free_port()
    cmd = [sys.executable, "-m", "omni_stream.cli", "serve", "--port", str(port), "--log-level", "warning"]
    cmd += ["--model", str(checkpoint), "--served-model-name", MODEL, "--voices-dir", str(tmp / "voices"), *extra]
    env = {k: v for k, v in os.environ.items() if k != "OMNI_STREAM_API_KEY"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        yield port
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    with omni_stream_serve(tmp_path_factory.mktemp("serve")) as port:
        yield port


def run(path: Path, *args: str, cwd: Path) -> str:
    proc = subprocess.run([sys.executable, str(path), *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def assert_wav_of(path: Path, port: int, voice: str, text: str) -> None:
    audio, rate = sf.read(path, dtype="float32")
    assert rate == RATE and audio.size == FRAMES * FRAME, (rate, audio.size)
    assert_same_audio(audio, direct(port, voice, text))


def test_openai_speech_client(server, tmp_path):
    path = script("openai_speech_client.py")
    text = "Hello, how are you?"
    out = run(path, "--api-base", f"http://127.0.0.1:{server}", "--text", text, "-o", "out.wav", cwd=tmp_path)
    assert "Audio saved to: out.wav" in out
    assert_wav_of(tmp_path / "out.wav", server, "vivian", text)
    # its other paths: a named speaker, pcm, a max_new_tokens bound (5 code-0 samples: 4 frames)
    args = ["--api-base", f"http://127.0.0.1:{server}", "--text", text, "--speaker", "ryan"]
    run(path, *args, "--response-format", "pcm", "--max-new-tokens", "5", "-o", "out.pcm", cwd=tmp_path)
    pcm = np.frombuffer((tmp_path / "out.pcm").read_bytes(), "<i2").astype(np.float32) / 32767
    assert pcm.size == 4 * FRAME
    assert_same_audio(pcm, direct(server, "ryan", text, max_new_tokens=5))
    assert np.abs(pcm - direct(server, "vivian", text, max_new_tokens=5)).max() > 0.01  # the speaker was heard
    # a request the server refuses: the client prints the error and saves nothing
    out = run(
        path, "--api-base", f"http://127.0.0.1:{server}", "--text", text, "-t", "Base", "-o", "bad.wav", cwd=tmp_path
    )
    assert "Error: 400" in out and "task_type" in out and not (tmp_path / "bad.wav").exists()  # a CustomVoice model


@pytest.mark.parametrize("stream_audio", [False, True], ids=["wav-per-sentence", "pcm-chunks"])
def test_streaming_speech_client(server, tmp_path, stream_audio):
    path = script("streaming_speech_client.py")
    text = "Hello world. How are you? I am fine."
    args = ["--url", f"ws://127.0.0.1:{server}/v1/audio/speech/stream", "--text", text, "--output-dir", "out"]
    if stream_audio:
        args += ["--stream-audio", "--response-format", "pcm", "--simulate-stt", "--stt-delay", "0.01"]
    out = run(path, *args, cwd=tmp_path)
    assert "Session complete: 1 sentence(s) generated" in out and "ERROR" not in out
    saved = tmp_path / "out" / ("sentence_000.pcm" if stream_audio else "sentence_000.wav")
    if stream_audio:
        pcm = np.frombuffer(saved.read_bytes(), "<i2").astype(np.float32) / 32767
        assert_same_audio(pcm, direct(server, "vivian", text))
    else:
        assert_wav_of(saved, server, "vivian", text)


def test_batch_speech_client(server, tmp_path):
    path = script("batch_speech_client.py")
    texts = ["Hello, how are you?", "Goodbye, see you later!", "A third line."]
    args = ["--api-base", f"http://127.0.0.1:{server}", "--texts", *texts, "--voice", "serena", "-o", "out"]
    out = run(path, *args, cwd=tmp_path)
    assert "Total: 3  Succeeded: 3  Failed: 0" in out
    for i, text in enumerate(texts):
        assert_wav_of(tmp_path / "out" / f"batch_{i}.wav", server, "serena", text)


def _bench(port: int, tmp: Path) -> list[dict]:
    path = script("bench_tts_serve.py")
    args = ["--host", "127.0.0.1", "--port", str(port), "--num-prompts", "4", "--max-concurrency", "1", "2"]
    run(path, *args, "--num-warmups", "1", "--result-dir", "results", cwd=tmp)
    (result,) = (tmp / "results").glob("bench_*.json")
    return json.loads(result.read_text())


def test_tts_benchmark_client_with_the_raw_pcm_setting(tmp_path):
    pytest.importorskip("aiohttp")
    script("bench_tts_serve.py")
    from_bench = {}
    with omni_stream_serve(tmp_path, "--legacy-stream-raw") as port:
        runs = _bench(port, tmp_path)
        for level in runs:
            assert level["completed"] == 4 and level["failed"] == 0
            for request in level["per_request"]:
                # the benchmark counts every byte of stream=true as 24 kHz PCM16: exactly the audio the model spoke
                spoken = direct(port, "vivian", request["prompt"], language="English")
                assert request["audio_duration_s"] == pytest.approx(spoken.size / RATE, abs=1e-9)
                from_bench[request["prompt"]] = request["audio_duration_s"]
    assert [level["concurrency"] for level in runs] == [1, 2] and from_bench
    assert set(from_bench.values()) == {FRAMES * FRAME / RATE}


def test_without_the_setting_the_benchmark_would_misread_sse(server, tmp_path):
    """Why the setting exists: today's stream=true is SSE, whose bytes that client would count as audio."""
    body = {"input": "Hello, welcome to the voice synthesis benchmark test.", "voice": "vivian", "stream": True}
    body["response_format"] = "pcm"
    with httpx.stream("POST", f"http://127.0.0.1:{server}/v1/audio/speech", json=body, timeout=30) as r:
        raw = b"".join(r.iter_bytes())
    assert r.headers["content-type"].startswith("text/event-stream")
    assert len(raw) > 1.3 * direct(server, "vivian", body["input"]).size * 2  # base64 and framing, not PCM
    assert io.BytesIO(raw).read(6) == b"event:"
