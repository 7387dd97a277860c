"""POST /v1/chat/completions through the unchanged openai SDK and httpx: text, audio output, errors, disconnects, on
the tiny Qwen3 chat model and the tiny Qwen3-TTS.

Both decode greedily here (``temperature=0``; the TTS checkpoint's own generation config, 9 frames a spoken unit),
so a reply is the same each time it is asked and a spoken unit's audio is what the TTS says for its transcript over
the speech route. Random weights babble: the checks are on the shape of the stream, on text and transcripts that
join, on lengths and on audio compared with the speech route, never on words. One test needs a reply of two given
sentences, which no random model says: it runs the synthetic echo LM (``tests/synthetic``) before the same TTS.
"""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from serving_helpers import FRAME, TTS_FRAMES, assert_same_pcm, running_server, spoken, tts_checkpoint
from synthetic.lm_family import write_lm_checkpoint
from tiny_models import tiny_lm

from omni_stream.realtime.settings import Settings

GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def server():
    with running_server(tts_checkpoint(), Settings(enable_benchmark_fields=True), llm=tiny_lm()) as live:
        yield live


@pytest.fixture(scope="module")
def lm(server) -> str:
    return server.engine.models.text().info.model_name


@pytest.fixture(scope="module")
def text_only_server():
    with running_server(None, Settings(), llm=tiny_lm()) as live:
        yield live


def client(live) -> openai.OpenAI:
    return openai.OpenAI(api_key="none", base_url=f"{live.url}/v1", max_retries=0)


def user(text: str) -> list[dict]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]


def exactly(n: int) -> dict:
    """``n`` tokens, never fewer (benchmark field ``ignore_eos``), greedy."""
    return {"max_tokens": n, "extra_body": {"ignore_eos": True}, **GREEDY}


def spoken_units(stream) -> tuple[str, list[tuple[str, bytes]]]:
    """The reply's text and its spoken units: (transcript, PCM16) in order (a unit's transcript comes first)."""
    text, units = "", []
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text += delta.content or ""
        audio = getattr(delta, "audio", None)
        if audio:
            if audio.transcript:
                units.append((audio.transcript, b""))
            if audio.data:
                transcript, pcm = units[-1]
                units[-1] = (transcript, pcm + base64.b64decode(audio.data))
    return text, units


def test_streamed_text_deltas_join_to_the_reply_and_usage_comes_last(server, lm):
    whole = client(server).chat.completions.create(model=lm, messages=user("one two three"), **exactly(8))
    stream = client(server).chat.completions.create(
        model=lm, messages=user("one two three"), stream=True, stream_options={"include_usage": True}, **exactly(8)
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens > len(user("one two three"))


def test_a_whole_reply_is_one_chat_completion(server, lm):
    reply = client(server).chat.completions.create(model=lm, messages=user("a b c d"), **exactly(2))
    assert reply.object == "chat.completion" and isinstance(reply.choices[0].message.content, str)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 2


def test_audio_output_streams_pcm16_deltas_whose_transcripts_join_to_the_text(server, lm):
    stream = client(server).chat.completions.create(
        model=lm,
        messages=user("Hello there friend. How are you today?"),
        modalities=["text", "audio"],
        audio={"voice": "serena", "format": "pcm16"},
        stream=True,
        **exactly(24),
    )
    text, units = spoken_units(stream)
    assert text and "".join(t for t, _ in units) == text
    for transcript, pcm in units:  # 24 kHz PCM16, every frame of each unit: what the TTS says for its transcript
        assert len(pcm) == TTS_FRAMES * FRAME * 2
        assert_same_pcm(pcm, spoken(server, "serena", transcript.strip()))


def test_max_sentence_chars_cuts_long_sentences_into_shorter_spoken_units(server, lm):
    stream = client(server).chat.completions.create(
        model=lm,
        messages=user("one two three four five six seven eight nine ten"),
        modalities=["text", "audio"],
        audio={"voice": "serena", "format": "pcm16", "max_sentence_chars": 12},
        stream=True,
        **exactly(24),
    )
    text, units = spoken_units(stream)
    pieces = [t for t, _ in units]
    assert "".join(pieces) == text and len(pieces) >= 2
    assert all(len(p.strip()) <= 12 for p in pieces)


def test_audio_output_without_streaming_is_a_whole_wav_with_its_transcript(server, lm):
    reply = client(server).chat.completions.create(
        model=lm,
        messages=user("Just this."),
        modalities=["text", "audio"],
        audio={"voice": "ryan", "format": "wav"},
        **exactly(6),
    )
    message = reply.choices[0].message
    assert message.content and message.audio.transcript == message.content
    data, rate = sf.read(io.BytesIO(base64.b64decode(message.audio.data)), dtype="float32")
    assert rate == 24000 and data.size and data.size % (TTS_FRAMES * FRAME) == 0  # whole units of 9 frames


def bad_bodies(lm: str) -> list[tuple[dict, str]]:
    return [
        ({"model": lm}, "messages"),
        ({"model": lm, "messages": []}, "messages"),
        ({"model": lm, "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"model": lm, "messages": user("hi"), "max_tokens": 0}, "max_tokens"),
        ({"model": lm, "messages": user("hi"), "max_tokens": 10_000}, "max_tokens"),  # beyond the 1024 positions
        ({"model": lm, "messages": user("hi"), "modalities": ["text", "video"]}, "modalities"),
        ({"model": lm, "messages": user("hi"), "modalities": ["text", "audio"]}, "audio"),
        (
            {"model": lm, "messages": user("hi"), "modalities": ["text", "audio"], "audio": {"voice": "nobody"}},
            "voice",
        ),
        (
            {"messages": user("hi"), "stream": True, "modalities": ["text", "audio"], "audio": {"format": "mp3"}},
            "audio.format",
        ),
        ({"model": lm, "messages": user("hi"), "temperature": 5}, "temperature"),
        ({"model": lm, "messages": user("hi"), "top_k": -5}, "top_k"),  # vLLM's extras are read, not ignored
        ({"model": lm, "messages": user("hi"), "top_k": "a"}, "top_k"),
        ({"model": lm, "messages": user("hi"), "repetition_penalty": 0}, "repetition_penalty"),
        ({"model": lm, "messages": user("hi"), "min_tokens": 5}, "min_tokens"),  # not implemented: refused
        ({"model": lm, "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"model": lm, "messages": [{"role": "user", "content": []}]}, "messages[0].content"),
        (
            {
                "messages": user("hi"),
                "modalities": ["text", "audio"],
                "audio": {"voice": "ryan", "max_sentence_chars": 2},
            },
            "audio.max_sentence_chars",
        ),
        ({"model": lm, "messages": user("hi"), "n": 2}, "n"),
        ({"model": lm, "messages": user("hi"), "tools": [{"type": "function"}]}, "tools[0].function"),
        ({"model": lm, "messages": user("hi"), "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"model": lm, "messages": user("word " * 2500)}, "messages"),  # the prompt alone is over the context
    ]


def test_bad_input_is_a_400_naming_the_field(server, lm):
    for body, param in bad_bodies(lm):
        response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
        assert response.status_code == 400, (param, response.text)
        error = response.json()["error"]
        assert error["type"] == "BadRequestError" and error["param"] == param and error["code"] == 400, param


def test_audio_without_a_speech_model_is_a_400(text_only_server):
    body = {"messages": user("hi"), "modalities": ["text", "audio"], "audio": {"voice": "x", "format": "pcm16"}}
    response = httpx.post(f"{text_only_server.url}/v1/chat/completions", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "modalities"
    assert "speech model" in response.json()["error"]["message"]


def test_an_unknown_model_is_a_404(server):
    response = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "gpt-9", "messages": user("hi")})
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"


def test_a_client_that_leaves_mid_reply_frees_both_models(server, lm):
    body = {
        "model": lm,
        "messages": user("Keep on talking now."),
        "stream": True,
        "modalities": ["text", "audio"],
        "audio": {"voice": "vivian", "format": "pcm16", "max_sentence_chars": 12},
        "max_tokens": 400,
        "ignore_eos": True,
    }
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as response:
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


def test_the_models_route_lists_both_models(server, lm):
    data = httpx.get(f"{server.url}/v1/models").json()["data"]
    tts = server.engine.speech_info.model_name
    assert {(m["id"], m["kind"]) for m in data} == {(tts, "speech"), (lm, "text")}
    (text,) = [m for m in data if m["kind"] == "text"]
    assert text["max_context"] == text["max_model_len"] == server.engine.models.text().info.max_context


# --- a reply of given sentences: the synthetic echo LM before the same TTS ---


@pytest.fixture(scope="module")
def echo_server(tmp_path_factory):
    lm = write_lm_checkpoint(tmp_path_factory.mktemp("echo") / "lm")
    with running_server(tts_checkpoint(), Settings(), llm=lm) as live:
        yield live


def test_each_sentence_of_a_reply_is_spoken_whole_in_order(echo_server):
    """Why the echo LM: the reply must be two known sentences. Each becomes one spoken unit, in order, whose audio
    is what the TTS says for that sentence."""
    said = "Hello there friend. How are you today?"
    stream = client(echo_server).chat.completions.create(
        model="synthetic-lm",
        messages=user(said),
        modalities=["text", "audio"],
        audio={"voice": "aiden", "format": "pcm16"},
        stream=True,
    )
    text, units = spoken_units(stream)
    assert text == said and [t.strip() for t, _ in units] == ["Hello there friend.", "How are you today?"]
    for transcript, pcm in units:
        assert_same_pcm(pcm, spoken(echo_server, "aiden", transcript.strip()))
    assert np.frombuffer(units[0][1], "<i2").std() > 0  # audio, not silence
