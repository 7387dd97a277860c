"""POST /v1/audio/speech, /v1/models, /health, /metrics against a real server on the tiny Qwen3-TTS, with the
openai SDK and httpx.

The server's checkpoint decodes greedily and speaks :data:`TTS_FRAMES` frames when a request names no bound
(``serving_helpers.tts_checkpoint``), so every way of asking for the same text in the same voice is compared with
the audio the model gives a plain PCM request for it. Faults mid-stream (which a random model cannot be made to
have) are in ``test_serving_faults.py``; cloning from a reference is in ``test_serving_voices.py`` (a Base model).
"""

from __future__ import annotations

import base64
import functools
import io
import json
import re
import threading

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from serving_helpers import FRAME, RATE, TTS_FRAMES, encoder_meets_first_step, pcm_to_float

from omni_stream import codecs
from omni_stream.speech.limits import MAX_INPUT_CHARS

TEXT = "Hello world, this is a test."

pytest_plugins = ("serving_fixtures",)


@pytest.fixture(scope="module")
def live(live_server):
    return live_server


@pytest.fixture(scope="module")
def model(live) -> str:
    return live.engine.speech_info.model_name


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def http(live):
    with httpx.Client(base_url=live.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def spoken(http):
    """``spoken(voice, text)``: the PCM16 bytes the model gives a plain whole-body PCM request (asked once)."""

    @functools.cache
    def pcm(voice: str, text: str) -> bytes:
        r = http.post("/v1/audio/speech", json={"input": text, "voice": voice, "response_format": "pcm"})
        assert r.status_code == 200, r.text
        assert len(r.content) == TTS_FRAMES * FRAME * 2
        return r.content

    return pcm


def sse_events(lines) -> list[tuple[str, dict]]:
    events, name = [], None
    for line in lines:
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            events.append((name, json.loads(line[len("data: ") :])))
            name = None
    return events


# --- whole bodies ---


@pytest.mark.parametrize(
    ("fmt", "mime"),
    [
        ("wav", "audio/wav"),
        ("pcm", "audio/pcm"),
        ("flac", "audio/flac"),
        ("mp3", "audio/mpeg"),
        ("opus", "audio/ogg"),
        ("aac", "audio/aac"),
    ],
)
def test_sdk_every_format_decodes(client, model, spoken, fmt, mime):
    response = client.audio.speech.create(model=model, voice="vivian", input=TEXT, response_format=fmt)
    raw = response.response
    assert raw.status_code == 200 and raw.headers["content-type"] == mime
    assert raw.headers["x-sample-rate"] == str(48000 if fmt == "opus" else RATE) and raw.headers["x-channels"] == "1"
    assert raw.headers["x-bit-depth"] == "16"
    want = spoken("vivian", TEXT)
    if fmt == "pcm":
        assert response.content == want
        return
    samples, seconds = codecs.decode_audio(response.content, RATE)
    assert abs(seconds - TTS_FRAMES * FRAME / RATE) < 0.1
    if fmt in ("wav", "flac"):
        np.testing.assert_allclose(samples, pcm_to_float(want), atol=1e-4)


def test_wav_body_is_a_complete_file(client, model, spoken):
    data = client.audio.speech.create(model=model, voice="ryan", input=TEXT, response_format="wav").content
    audio, rate = sf.read(io.BytesIO(data), dtype="float32")
    assert rate == RATE and audio.ndim == 1
    np.testing.assert_allclose(audio, pcm_to_float(spoken("ryan", TEXT)), atol=1e-4)


def test_the_voice_is_heard(spoken):
    a, b = pcm_to_float(spoken("vivian", TEXT)), pcm_to_float(spoken("ryan", TEXT))
    assert np.abs(a - b).max() > 0.01


def test_usage_headers(live, http):
    r = http.post("/v1/audio/speech", json={"input": TEXT, "voice": "vivian", "response_format": "pcm"})
    assert r.status_code == 200
    inp, out = int(r.headers["x-omni-stream-input-tokens"]), int(r.headers["x-omni-stream-output-tokens"])
    assert inp == live.family.count_text_tokens(TEXT) and out == TTS_FRAMES == len(r.content) // 2 // FRAME
    assert int(r.headers["x-omni-stream-total-tokens"]) == inp + out


def test_voice_id_object_and_case(client, model, http, spoken):
    a = client.audio.speech.create(model=model, voice={"id": "SERENA"}, input=TEXT, response_format="pcm").content
    b = http.post("/v1/audio/speech", json={"input": TEXT, "voice": "serena", "response_format": "pcm"}).content
    assert a == b == spoken("serena", TEXT)


def test_max_new_tokens_and_ignore_eos_give_exact_lengths(http):
    body = {"input": TEXT, "voice": "vivian", "response_format": "pcm"}
    assert len(http.post("/v1/audio/speech", json={**body, "max_new_tokens": 4}).content) == 3 * FRAME * 2
    exact = http.post("/v1/audio/speech", json={**body, "max_new_tokens": 4, "ignore_eos": True})
    assert len(exact.content) == 4 * FRAME * 2


def test_speed_changes_duration_not_format(http):
    body = {"input": TEXT * 3, "voice": "vivian", "response_format": "wav"}
    normal = sf.info(io.BytesIO(http.post("/v1/audio/speech", json=body).content)).duration
    fast = sf.info(io.BytesIO(http.post("/v1/audio/speech", json={**body, "speed": 2.0}).content)).duration
    assert fast == pytest.approx(normal / 2, rel=0.05)


def test_sample_rate_resamples(http):
    r = http.post(
        "/v1/audio/speech", json={"input": TEXT, "voice": "vivian", "response_format": "wav", "sample_rate": 16000}
    )
    audio, rate = sf.read(io.BytesIO(r.content))
    assert rate == 16000 and r.headers["x-sample-rate"] == "16000"
    assert audio.size == pytest.approx(TTS_FRAMES * FRAME * 2 / 3, abs=4)


# --- streaming ---


def test_sdk_raw_pcm_stream(client, model, spoken):
    with client.audio.speech.with_streaming_response.create(
        model=model, voice="aiden", input=TEXT * 4, response_format="pcm", stream_format="audio"
    ) as r:
        assert r.headers["content-type"] == "audio/pcm" and r.headers["x-sample-rate"] == str(RATE)
        chunks = list(r.iter_bytes())
    assert b"".join(chunks) == spoken("aiden", TEXT * 4)


def test_sdk_raw_wav_stream(client, model, spoken):
    with client.audio.speech.with_streaming_response.create(
        model=model, voice="serena", input=TEXT * 3, response_format="wav", stream_format="audio"
    ) as r:
        assert r.headers["content-type"] == "audio/wav" and r.headers["x-sample-rate"] == str(RATE)
        chunks = list(r.iter_bytes())
    data = b"".join(chunks)
    assert data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt " and data[36:40] == b"data"
    assert int.from_bytes(data[24:28], "little") == RATE and int.from_bytes(data[22:24], "little") == 1
    assert data[44:] == spoken("serena", TEXT * 3)  # the samples after the streaming header


def test_raw_wav_stream_header(http, spoken):
    body = {"input": TEXT, "voice": "vivian", "response_format": "wav", "stream_format": "audio"}
    with http.stream("POST", "/v1/audio/speech", json=body) as r:
        assert r.headers["content-type"] == "audio/wav"
        data = r.read()
    head = data[:44]
    assert head[:4] == b"RIFF" and head[8:16] == b"WAVEfmt " and head[36:40] == b"data"
    assert head[4:8] == b"\xff\xff\xff\xff" and head[40:44] == b"\xff\xff\xff\xff"
    channels, rate = int.from_bytes(head[22:24], "little"), int.from_bytes(head[24:28], "little")
    assert (channels, rate, int.from_bytes(head[34:36], "little")) == (1, RATE, 16)
    assert data[44:] == spoken("vivian", TEXT)


def test_the_encoder_opens_while_the_model_makes_the_first_chunk(live, http, spoken, monkeypatch):
    """A stream's encoder is opened (a thread hop) while its first chunk is made: not after the chunk, where it
    would stand between the chunk and the first byte, nor before the request reaches the model."""
    want = spoken("vivian", TEXT)
    with encoder_meets_first_step(live, monkeypatch) as met:
        body = {"input": TEXT, "voice": "vivian", "response_format": "pcm", "stream_format": "audio"}
        with http.stream("POST", "/v1/audio/speech", json=body) as r:
            data = r.read()
    assert sorted(met) == [("open", True), ("step", True)]
    assert data == want


def test_the_early_encoder_is_closed_when_the_stream_fails_or_the_client_leaves(monkeypatch):
    """The first chunk's error reaches the route as itself, and a client leaving (cancellation) before the first
    chunk leaves no encoder open: every AudioOut opened for the stream is closed."""
    import anyio

    from omni_stream.realtime.common.audio_out import AudioOut, first_chunk_and_output
    from omni_stream.realtime.common.errors import ApiError

    # Only this test's outputs count: the shared server's thread may still be closing an earlier request's.
    me, opened, closed = threading.get_ident(), [], []
    original_open, close = AudioOut.open.__func__, AudioOut.close  # type: ignore[attr-defined]

    async def recording_open(cls, *args, **kwargs):
        out = await original_open(cls, *args, **kwargs)
        if threading.get_ident() == me:
            opened.append(out)
        return out

    monkeypatch.setattr(AudioOut, "open", classmethod(recording_open))
    monkeypatch.setattr(
        AudioOut, "close", lambda self: (closed.append(self) if self in opened else None, close(self))[1]
    )

    async def failing():
        raise ApiError(400, "bad voice")
        yield  # an async generator

    async def silent():
        await anyio.sleep_forever()
        yield

    async def main() -> None:
        with pytest.raises(ApiError, match="bad voice"):
            await first_chunk_and_output(failing(), "mp3", RATE, None)
        assert len(closed) == len(opened) == 1
        with anyio.move_on_after(0.5):
            await first_chunk_and_output(silent(), "pcm", RATE, None)
        assert len(closed) == len(opened) == 2

    anyio.run(main)


def test_sdk_sse_stream(live, client, model, spoken):
    with client.audio.speech.with_streaming_response.create(
        model=model, voice="ryan", input=TEXT * 2, response_format="pcm", stream_format="sse"
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    names = [name for name, _ in events]
    assert names[-1] == "speech.audio.done" and names.count("speech.audio.done") == 1
    assert set(names[:-1]) == {"speech.audio.delta"} and len(names) >= 3
    assert all(data["type"] == name for name, data in events)
    audio = b"".join(base64.b64decode(data["audio"]) for _, data in events[:-1])
    assert audio == spoken("ryan", TEXT * 2)
    usage = events[-1][1]["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["output_tokens"] == len(audio) // 2 // FRAME == TTS_FRAMES
    text_tokens = live.family.count_text_tokens(TEXT * 2)
    assert usage["input_token_details"] == {"text_tokens": text_tokens, "audio_tokens": 0}
    assert all(data["response_format"] == "pcm" for _, data in events[:-1])


def test_sse_wav_deltas_concatenate_to_a_wav(http, spoken):
    body = {"input": TEXT, "voice": "serena", "response_format": "wav", "stream": True}
    with http.stream("POST", "/v1/audio/speech", json=body, headers={"Accept": "application/octet-stream"}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    data = b"".join(base64.b64decode(d["audio"]) for n, d in events if n == "speech.audio.delta")
    assert data[:4] == b"RIFF" and data[44:] == spoken("serena", TEXT)


@pytest.mark.parametrize(
    ("fields", "kind"),
    [
        ({}, "audio/pcm"),
        ({"stream": False}, "audio/pcm"),
        ({"stream": True}, "text/event-stream"),
        ({"stream_format": "sse"}, "text/event-stream"),
        ({"stream_format": "audio"}, "audio/pcm"),
        ({"stream": True, "stream_format": "audio"}, "audio/pcm"),
    ],
)
def test_mode_table_ignores_accept(http, fields, kind):
    body = {"input": TEXT, "voice": "vivian", "response_format": "pcm", **fields}
    for accept in ("application/octet-stream", "text/event-stream"):
        r = http.post("/v1/audio/speech", json=body, headers={"Accept": accept})
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind)


# --- errors ---


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    return error


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"input": TEXT, "response_format": "mp3", "stream": True}, "response_format", ["pcm", "wav"]),
        ({"input": TEXT, "response_format": "mp3", "stream_format": "audio"}, "response_format", ["pcm", "wav"]),
        ({"input": TEXT, "response_format": "pcm", "stream": True, "speed": 2.0}, "speed", ["speed"]),
        ({"input": ""}, "input", ["empty"]),
        ({"input": "   "}, "input", ["empty"]),
        ({"input": "x" * (MAX_INPUT_CHARS + 1)}, "input", ["too long", str(MAX_INPUT_CHARS)]),
        ({"input": TEXT, "max_new_tokens": 4097}, "max_new_tokens", ["cannot exceed 4096"]),
        ({"input": TEXT, "max_new_tokens": 0}, "max_new_tokens", ["at least 1"]),
        ({"input": TEXT, "instructions": "x" * 501}, "instructions", ["Instructions too long (max 500 characters)"]),
        ({"input": TEXT, "voice": "nope"}, "voice", ["nope", "vivian", "ryan"]),
        ({"input": TEXT, "response_format": "xyz"}, "response_format", ["wav", "pcm"]),
        ({"input": TEXT, "speed": 5}, "speed", ["0.25", "4.0"]),
        ({"input": TEXT, "stream_format": "bytes"}, "stream_format", ["sse", "audio"]),
        ({"input": TEXT, "task_type": "Base"}, "task_type", ["Base", "CustomVoice"]),
        ({"input": TEXT, "ref_audio": "%%%"}, "task_type", ["Base", "CustomVoice"]),  # cloning needs a Base model
        ({"input": TEXT, "language": "Klingon"}, "language", ["Klingon", "English"]),
    ],
)
def test_bad_requests_are_400_before_any_stream(http, body, param, words):
    error = error_of(http.post("/v1/audio/speech", json=body), 400)
    assert error["type"] == "BadRequestError" and error["param"] == param
    assert all(w.lower() in error["message"].lower() for w in words), error["message"]


def test_malformed_bodies_are_400(http):
    assert error_of(http.post("/v1/audio/speech", content=b"{not json"), 400)["type"] == "BadRequestError"
    assert error_of(http.post("/v1/audio/speech", content=b""), 400)
    assert error_of(http.post("/v1/audio/speech", json=[1]), 400)
    unknown = error_of(http.post("/v1/audio/speech", json={"input": TEXT, "language": "klingon"}), 400)
    assert unknown["message"].startswith("Unsupported language 'klingon'")  # named as the user wrote it
    form = error_of(http.post("/v1/audio/speech", files={"input": (None, TEXT)}), 400)  # curl -F where JSON belongs
    assert form["message"] == "This route takes a JSON body (Content-Type: application/json), not multipart/form-data"


def test_sdk_raises_typed_errors(client, model):
    with pytest.raises(openai.BadRequestError):
        client.audio.speech.create(model=model, voice="nope", input=TEXT)
    with pytest.raises(openai.NotFoundError) as info:
        client.audio.speech.create(model="other", voice="vivian", input=TEXT)
    assert info.value.body["param"] == "model" and info.value.body["type"] == "NotFoundError"
    assert f"(served: `{model}`)" in info.value.body["message"]  # what to ask for instead


def test_unknown_route_and_method_use_the_error_shape(http):
    error_of(http.get("/v1/nothing"), 404)
    error_of(http.get("/v1/audio/speech"), 405)


# --- models, health, metrics ---


def test_models_health_metrics(http, client, model):
    assert [m.id for m in client.models.list()] == [model]
    assert http.get("/health").json() == {"status": "ok", "model": model}
    r = http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert "omni_stream_requests_running" in r.text and "omni_stream_http_requests_total" in r.text


@pytest.mark.parametrize("page", ["/", "/realtime", "/transcribe", "/video"])
def test_every_demo_page_and_each_file_it_links_is_served(http, page):
    r = http.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    linked = re.findall(r'(?:href|src)="(static/[^"]+)"', r.text)
    assert "static/page.css" in linked  # the stylesheet the pages share
    for path in linked:
        assert http.get(f"/{path}").status_code == 200, path
    # every page links to the others, relative to the root it is served under, and marks itself
    nav = re.search(r'<nav class="pages"[^>]*>(.*?)</nav>', r.text, re.S)
    assert nav is not None, "no page navigation"
    hrefs = re.findall(r'<a href="([^"]+)"', nav[1])
    assert sorted(hrefs) == ["./", "realtime", "transcribe", "video"], hrefs
    for href in hrefs:
        assert http.get("/" + href.removeprefix("./")).status_code == 200, href
    current = re.findall(r'<a href="([^"]+)" aria-current="page">', nav[1])
    assert current == [{"/": "./"}.get(page, page.lstrip("/"))], current


def test_a_language_code_names_the_models_language(http):
    # "en" is English to a model that lists language names (Qwen3-TTS's); before, a 400 'Unsupported language En'
    response = http.post("/v1/audio/speech", json={"input": TEXT, "language": "en", "max_new_tokens": 3})
    assert response.status_code == 200, response.text
    assert response.content[:4] == b"RIFF"
