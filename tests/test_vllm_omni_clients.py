"""vLLM-Omni's own example and benchmark clients, unchanged, against ``omni-stream serve``.

The scripts come from vLLM-Omni's source distributions on PyPI (``tests/vllm_omni_clients.py fetch``, run by
``.ci/run``); they are never committed here. The server is the real CLI in a subprocess, serving a synthetic
checkpoint under the name and voices the clients default to, so each runs with nothing changed but where the
server is (and its inputs). Every byte the clients save is checked against the tone the model speaks.
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

import numpy as np
import pytest
import soundfile as sf
from serving_helpers import make_checkpoint
from test_serving_cli import free_port, wait_healthy
from vllm_omni_clients import client

from omni_stream.models.synthetic.config import SyntheticConfig, tone_samples

MODEL = "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"  # openai_speech_client.py's default model
VOICES = ["vivian", "ryan", "aiden", "serena"]  # the clients' default speaker is Vivian
TONES = {v: i + 1 for i, v in enumerate(VOICES)}
CONFIG = SyntheticConfig(voices=tuple(VOICES))


def script(name: str) -> Path:
    path = client(name)
    if path is None:
        pytest.skip(f"vLLM-Omni's {name} was not fetched: run `python tests/vllm_omni_clients.py fetch` (.ci/run does)")
    return path


def tone(voice: str, text: str) -> np.ndarray:
    n = max(1, round(len(text.strip()) * CONFIG.frames_per_char))
    return tone_samples(CONFIG, TONES[voice], 0, n)


@contextlib.contextmanager
def omni_stream_serve(tmp: Path, *extra: str) -> Iterator[int]:
    checkpoint = make_checkpoint(tmp / "ckpt", voices=VOICES)
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


def assert_wav_of(path: Path, voice: str, text: str) -> None:
    audio, rate = sf.read(path, dtype="float32")
    assert rate == CONFIG.sample_rate
    assert np.abs(audio - tone(voice, text)).max() < 1e-4, path


def test_openai_speech_client(server, tmp_path):
    path = script("openai_speech_client.py")
    text = "Hello, how are you?"
    out = run(path, "--api-base", f"http://127.0.0.1:{server}", "--text", text, "-o", "out.wav", cwd=tmp_path)
    assert "Audio saved to: out.wav" in out
    assert_wav_of(tmp_path / "out.wav", "vivian", text)
    # its other paths: a named speaker, pcm, a max_new_tokens bound
    args = ["--api-base", f"http://127.0.0.1:{server}", "--text", text, "--speaker", "ryan"]
    run(path, *args, "--response-format", "pcm", "--max-new-tokens", "5", "-o", "out.pcm", cwd=tmp_path)
    pcm = np.frombuffer((tmp_path / "out.pcm").read_bytes(), "<i2").astype(np.float32) / 32767
    assert pcm.size == 5 * 1920 and np.abs(pcm - tone("ryan", text)[: pcm.size]).max() < 1e-3
    # a request the server refuses: the client prints the error and saves nothing
    out = run(
        path, "--api-base", f"http://127.0.0.1:{server}", "--text", text, "-t", "Base", "-o", "bad.wav", cwd=tmp_path
    )
    assert "Error: 400" in out and "ref_audio" in out and not (tmp_path / "bad.wav").exists()


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
        assert np.abs(pcm - tone("vivian", text)).max() < 1e-3
    else:
        assert_wav_of(saved, "vivian", text)


def test_batch_speech_client(server, tmp_path):
    path = script("batch_speech_client.py")
    texts = ["Hello, how are you?", "Goodbye, see you later!", "A third line."]
    args = ["--api-base", f"http://127.0.0.1:{server}", "--texts", *texts, "--voice", "serena", "-o", "out"]
    out = run(path, *args, cwd=tmp_path)
    assert "Total: 3  Succeeded: 3  Failed: 0" in out
    for i, text in enumerate(texts):
        assert_wav_of(tmp_path / "out" / f"batch_{i}.wav", "serena", text)


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
            expected = tone("vivian", request["prompt"]).size / CONFIG.sample_rate
            assert request["audio_duration_s"] == pytest.approx(expected, abs=1e-9)
            from_bench[request["prompt"]] = request["audio_duration_s"]
    assert [level["concurrency"] for level in runs] == [1, 2] and from_bench


def test_without_the_setting_the_benchmark_would_misread_sse(server, tmp_path):
    """Why the setting exists: today's stream=true is SSE, whose bytes that client would count as audio."""
    import httpx

    body = {"input": "Hello, welcome to the voice synthesis benchmark test.", "voice": "vivian", "stream": True}
    body["response_format"] = "pcm"
    with httpx.stream("POST", f"http://127.0.0.1:{server}/v1/audio/speech", json=body, timeout=30) as r:
        raw = b"".join(r.iter_bytes())
    assert r.headers["content-type"].startswith("text/event-stream")
    assert len(raw) > 1.3 * tone("vivian", body["input"]).size * 2  # base64 and framing, not PCM
    assert io.BytesIO(raw).read(6) == b"event:"
