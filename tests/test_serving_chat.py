"""POST /v1/chat/completions through the unchanged openai SDK and httpx: text, audio output, errors, disconnects."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest
from serving_helpers import running_server
from synthetic import SyntheticConfig, tone_samples, write_checkpoint
from synthetic.lm_family import write_lm_checkpoint

from omni_stream.realtime.settings import Settings

CONFIG = SyntheticConfig()
LM = "synthetic-lm"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    tts, lm = write_checkpoint(root / "tts"), write_lm_checkpoint(root / "lm", max_context=64)
    with running_server(tts, Settings(), llm=lm) as live:
        yield live


@pytest.fixture(scope="module")
def text_only_server(tmp_path_factory):
    lm = write_lm_checkpoint(tmp_path_factory.mktemp("lm-only") / "lm")
    with running_server(None, Settings(), llm=lm) as live:
        yield live


def client(live) -> openai.OpenAI:
    return openai.OpenAI(api_key="none", base_url=f"{live.url}/v1", max_retries=0)


def user(text: str) -> list[dict]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]


def test_streamed_text_deltas_join_to_the_reply_and_usage_comes_last(server):
    stream = client(server).chat.completions.create(
        model=LM, messages=user("one two three"), stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "one two three"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert chunks[-1].usage.prompt_tokens == (2 + 2) + (3 + 2)


def test_a_whole_reply_is_one_chat_completion(server):
    reply = client(server).chat.completions.create(model=LM, messages=user("a b c d"), max_tokens=2)
    assert reply.object == "chat.completion" and reply.choices[0].message.content == "a b"
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 2


def test_audio_output_streams_pcm16_deltas_whose_transcripts_join_to_the_text(server):
    said = "Hello there friend. How are you today?"
    stream = client(server).chat.completions.create(
        model=LM,
        messages=user(said),
        modalities=["text", "audio"],
        audio={"voice": "carol", "format": "pcm16"},
        stream=True,
    )
    text, transcript, pcm = "", "", bytearray()
    for chunk in stream:
        delta = chunk.choices[0].delta
        text += delta.content or ""
        audio = getattr(delta, "audio", None)
        if audio:
            transcript += audio.transcript or ""
            pcm += base64.b64decode(audio.data or "")
    assert text == said and transcript == said
    samples = np.frombuffer(bytes(pcm), "<i2").astype(np.float32) / 32767.0
    sentences = ["Hello there friend.", "How are you today?"]
    expected = np.concatenate([tone_samples(CONFIG, 3, 0, round(len(s) * 0.5)) for s in sentences])
    assert samples.size == expected.size  # 24 kHz PCM16, every frame of both sentences
    assert np.max(np.abs(samples - expected)) < 1e-3


def test_max_sentence_chars_cuts_long_sentences_into_shorter_spoken_units(server):
    said = "one two three four five six seven eight nine ten"
    stream = client(server).chat.completions.create(
        model=LM,
        messages=user(said),
        modalities=["text", "audio"],
        audio={"voice": "carol", "format": "pcm16", "max_sentence_chars": 12},
        stream=True,
    )
    pieces = [c.choices[0].delta.audio.transcript for c in stream if getattr(c.choices[0].delta, "audio", None)]
    pieces = [p for p in pieces if p]
    assert "".join(pieces) == said and len(pieces) > 3
    assert all(len(p.strip()) <= 12 for p in pieces)


def test_audio_output_without_streaming_is_a_whole_wav_with_its_transcript(server):
    import io

    import soundfile as sf

    reply = client(server).chat.completions.create(
        model=LM, messages=user("Just this."), modalities=["text", "audio"], audio={"voice": "bob", "format": "wav"}
    )
    message = reply.choices[0].message
    assert message.content == "Just this." and message.audio.transcript == "Just this."
    data, rate = sf.read(io.BytesIO(base64.b64decode(message.audio.data)), dtype="float32")
    assert rate == 24000 and data.size == round(len("Just this.") * 0.5) * CONFIG.samples_per_frame


BAD = [
    ({"model": LM}, "messages"),
    ({"model": LM, "messages": []}, "messages"),
    ({"model": LM, "messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
    ({"model": LM, "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ({"model": LM, "messages": user("hi"), "max_tokens": 0}, "max_tokens"),
    ({"model": LM, "messages": user("hi"), "max_tokens": 10_000}, "max_tokens"),  # beyond the 64-token context
    ({"model": LM, "messages": user("hi"), "modalities": ["text", "video"]}, "modalities"),
    ({"model": LM, "messages": user("hi"), "modalities": ["text", "audio"]}, "audio"),
    (
        {"model": LM, "messages": user("hi"), "modalities": ["text", "audio"], "audio": {"voice": "nobody"}},
        "voice",
    ),
    (
        {"messages": user("hi"), "stream": True, "modalities": ["text", "audio"], "audio": {"format": "mp3"}},
        "audio.format",
    ),
    ({"model": LM, "messages": user("hi"), "temperature": 5}, "temperature"),
    (
        {"messages": user("hi"), "modalities": ["text", "audio"], "audio": {"voice": "bob", "max_sentence_chars": 2}},
        "audio.max_sentence_chars",
    ),
    ({"model": LM, "messages": user("hi"), "n": 2}, "n"),
    ({"model": LM, "messages": user("hi"), "tools": [{"type": "function"}]}, "tools[0].function"),
    ({"model": LM, "messages": user("hi"), "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"model": LM, "messages": user("word " * 100)}, "messages"),  # the prompt alone is over the context
]


@pytest.mark.parametrize(("body", "param"), BAD, ids=[p for _, p in BAD])
def test_bad_input_is_a_400_naming_the_field(server, body, param):
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "BadRequestError" and error["param"] == param and error["code"] == 400


def test_audio_without_a_speech_model_is_a_400(text_only_server):
    body = {"messages": user("hi"), "modalities": ["text", "audio"], "audio": {"voice": "x", "format": "pcm16"}}
    response = httpx.post(f"{text_only_server.url}/v1/chat/completions", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "modalities"
    assert "speech model" in response.json()["error"]["message"]


def test_an_unknown_model_is_a_404(server):
    response = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "gpt-9", "messages": user("hi")})
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"


def test_a_client_that_leaves_mid_reply_frees_both_models(server):
    body = {
        "model": LM,
        "messages": user(" ".join(["Keep on talking now."] * 12)),
        "stream": True,
        "modalities": ["text", "audio"],
        "audio": {"voice": "alice", "format": "pcm16"},
    }
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        seen = 0
        for line in response.iter_lines():
            if line.startswith("data: {") and '"audio"' in line:
                seen += 1
            if seen >= 2:
                break
    for kind in ("text", "speech"):
        live = server.wait_idle(kind=kind)
        assert not any(live.values()), (kind, live)


def test_the_models_route_lists_both_models(server):
    data = httpx.get(f"{server.url}/v1/models").json()["data"]
    assert {(m["id"], m["kind"]) for m in data} == {("synthetic-tts", "speech"), (LM, "text")}
    (text,) = [m for m in data if m["kind"] == "text"]
    assert text["max_context"] == text["max_model_len"] == 64
