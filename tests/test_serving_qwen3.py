"""The serving layer on the tiny random-weight Qwen3-TTS checkpoints (CustomVoice and Base): real model paths."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from serving_helpers import running_server, wav_bytes
from websockets.sync.client import connect

from omni_stream import codecs
from omni_stream.models.qwen3_tts.checkpoint import write_tiny_checkpoint
from omni_stream.realtime.settings import Settings

FRAMES = 6  # random weights rarely stop on their own: bound every request
SAMPLES_PER_FRAME = 1920


@pytest.fixture(scope="module")
def custom(tmp_path_factory):
    path = write_tiny_checkpoint(tmp_path_factory.mktemp("qwen3-custom"), "custom_voice")
    with running_server(path, Settings()) as server:
        yield server


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = write_tiny_checkpoint(tmp_path_factory.mktemp("qwen3-base"), "base")
    with running_server(path, Settings(voices_dir=tmp_path_factory.mktemp("voices"))) as server:
        yield server


def test_custom_voice_formats_and_sse(custom):
    info = custom.engine.speech_info
    voice = info.voices[0]
    client = openai.OpenAI(base_url=f"{custom.url}/v1", api_key="x", max_retries=0)
    extra = {"max_new_tokens": FRAMES, "seed": 0}
    wav = client.audio.speech.create(model=info.model_name, voice=voice, input="Hello.", extra_body=extra)
    audio, rate = sf.read(io.BytesIO(wav.content))
    assert rate == info.sample_rate and 0 < audio.size <= FRAMES * SAMPLES_PER_FRAME
    with client.audio.speech.with_streaming_response.create(
        model=info.model_name, voice=voice, input="Hello.", response_format="pcm", stream_format="sse", extra_body=extra
    ) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["output_tokens"] <= FRAMES
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert len(pcm) == 2 * audio.size  # same seed, same audio length as the whole body
    r = httpx.post(f"{custom.url}/v1/audio/speech", json={"input": "Hi.", "voice": "nobody"})
    assert r.status_code == 400 and voice in r.json()["error"]["message"]


def test_custom_voice_websocket_pcm_stream(custom):
    voice = custom.engine.speech_info.voices[1]
    with connect(f"{custom.ws_url}/v1/audio/speech/stream") as ws:
        config = {"voice": voice, "response_format": "pcm", "stream_audio": True, "max_new_tokens": FRAMES}
        ws.send(json.dumps({"type": "session.config", **config}))
        ws.send(json.dumps({"type": "input.text", "text": "One. Two."}))
        ws.send(json.dumps({"type": "input.done"}))
        frames, done = [], None
        while True:
            message = ws.recv(timeout=60)
            if isinstance(message, bytes):
                frames.append(message)
                continue
            event = json.loads(message)
            if event["type"] == "audio.done":
                done = event
            if event["type"] == "session.done":
                break
    assert done["error"] is False and done["total_bytes"] == sum(map(len, frames)) > 0


def test_base_voice_upload_clones(base):
    with httpx.Client(base_url=base.url, timeout=120) as c:
        files = {"audio_sample": ("me.wav", wav_bytes(2.0), "audio/wav")}
        r = c.post("/v1/audio/voices", data={"name": "Me", "consent": "yes", "ref_text": "Hello."}, files=files)
        assert r.status_code == 200, r.text
        stored = base.state.voices.get("me")
        assert stored.prompt is not None and stored.prompt.x_vector.ndim == 1  # the engine's own prompt
        body = {"input": "Hi there.", "voice": "me", "response_format": "pcm", "max_new_tokens": FRAMES, "seed": 1}
        r = c.post("/v1/audio/speech", json=body)
        assert r.status_code == 200, r.text
        assert 0 < len(r.content) <= FRAMES * SAMPLES_PER_FRAME * 2


@pytest.mark.parametrize("fmt", ["mp3", "aac", "opus", "flac", "wav"])
def test_no_frames_is_still_a_valid_file(custom, fmt):
    # max_new_tokens=1 allows one code-0 sample and no frame: the body is a decodable (silent) file, never empty
    body = {"input": "Hi.", "voice": custom.engine.speech_info.voices[0], "response_format": fmt, "max_new_tokens": 1}
    r = httpx.post(f"{custom.url}/v1/audio/speech", json=body, timeout=60)
    assert r.status_code == 200 and len(r.content) > 0
    assert r.headers["x-omni-stream-output-tokens"] == "0"
    if fmt == "wav":
        samples, _ = sf.read(io.BytesIO(r.content), dtype="float32")  # a valid file of no samples
        assert samples.size == 0
    else:  # these formats need one packet: a codec frame of silence
        samples, _ = codecs.decode_audio(r.content, 24000)
        assert 0 < samples.size <= 4096 and np.abs(samples).max() < 1e-3


def test_cloning_usage_splits_text_and_reference_audio_tokens(base):
    ref = "data:audio/wav;base64," + base64.b64encode(wav_bytes(2.0)).decode()
    body = {"input": "Hi there.", "ref_audio": ref, "ref_text": "Hello.", "max_new_tokens": FRAMES, "seed": 0}
    r = httpx.post(f"{base.url}/v1/audio/speech", json=body, timeout=120)  # no task_type: Base is inferred
    assert r.status_code == 200, r.text
    h = r.headers
    audio_tokens = int(h["x-vllm-omni-input-audio-tokens"])
    assert audio_tokens == 25  # 2 s of reference at 12.5 codec frames a second, in the prompt
    assert int(h["x-vllm-omni-input-text-tokens"]) > 0
    assert int(h["x-vllm-omni-input-tokens"]) == audio_tokens + int(h["x-vllm-omni-input-text-tokens"])
    x_vector_only = {**body, "x_vector_only_mode": True}
    r = httpx.post(f"{base.url}/v1/audio/speech", json=x_vector_only, timeout=120)
    assert r.status_code == 200 and r.headers["x-vllm-omni-input-audio-tokens"] == "0"  # no codes in its prompt


def test_speaker_embedding_and_non_streaming_mode_reach_the_model(base):
    hidden = base.family.config.talker.decoder.hidden_size
    body = {"input": "Hi there.", "speaker_embedding": [0.01] * hidden, "max_new_tokens": FRAMES, "seed": 0}
    for mode in (None, True, False):
        extra = {} if mode is None else {"non_streaming_mode": mode}
        r = httpx.post(f"{base.url}/v1/audio/speech", json={**body, **extra, "response_format": "pcm"}, timeout=120)
        assert r.status_code == 200, r.text
    r = httpx.post(f"{base.url}/v1/audio/speech", json={**body, "speaker_embedding": [0.01] * 7}, timeout=60)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "speaker_embedding" and f"has {hidden}" in error["message"]


def test_custom_voice_checkpoint_names_the_task_and_refuses_uploads(custom):
    r = httpx.post(f"{custom.url}/v1/audio/speech", json={"input": "Hi.", "task_type": "Base"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "task_type"
    assert r.json()["error"]["message"] == (
        "Qwen3-TTS CustomVoice checkpoint does not support task_type='Base'. "
        "Use task_type='CustomVoice' or load the matching Base checkpoint."
    )
    files = {"audio_sample": ("me.wav", wav_bytes(2.0), "audio/wav")}
    r = httpx.post(f"{custom.url}/v1/audio/voices", data={"name": "Me", "consent": "yes"}, files=files)
    assert r.status_code == 400 and "cannot clone voices" in r.json()["error"]["message"]
    r = httpx.post(f"{custom.url}/v1/audio/speech", json={"input": "Hi.", "max_new_tokens": FRAMES}, timeout=60)
    assert r.status_code == 200  # no voice: the checkpoint's default voice
