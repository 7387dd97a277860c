"""POST /v1/audio/speech, /v1/models, /health, /metrics against a real server, with the openai SDK and httpx."""

from __future__ import annotations

import base64
import io
import json
import re

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from serving_helpers import MODEL, RATE, encoder_meets_first_step, expected_tone, pcm16

from omni_stream import codecs
from omni_stream.speech.limits import MAX_INPUT_CHARS

TEXT = "Hello world, this is a test."

pytest_plugins = ("serving_fixtures",)


@pytest.fixture(scope="module")
def client(live_server):
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def http(live_server):
    with httpx.Client(base_url=live_server.url, timeout=30) as c:
        yield c


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
def test_sdk_every_format_decodes(client, fmt, mime):
    response = client.audio.speech.create(model=MODEL, voice="alice", input=TEXT, response_format=fmt)
    raw = response.response
    assert raw.status_code == 200 and raw.headers["content-type"] == mime
    assert raw.headers["x-sample-rate"] == str(48000 if fmt == "opus" else RATE) and raw.headers["x-channels"] == "1"
    assert raw.headers["x-bit-depth"] == "16"
    want = expected_tone("alice", TEXT)
    if fmt == "pcm":
        assert response.content == pcm16(want)
        return
    samples, seconds = codecs.decode_audio(response.content, RATE)
    assert abs(seconds - want.size / RATE) < 0.1
    if fmt in ("wav", "flac"):
        np.testing.assert_allclose(samples, want, atol=1e-4)


def test_wav_body_is_a_complete_file(client):
    data = client.audio.speech.create(model=MODEL, voice="bob", input=TEXT, response_format="wav").content
    audio, rate = sf.read(io.BytesIO(data), dtype="float32")
    assert rate == RATE and audio.ndim == 1
    np.testing.assert_allclose(audio, expected_tone("bob", TEXT), atol=1e-4)


def test_usage_headers(http):
    r = http.post("/v1/audio/speech", json={"input": TEXT, "voice": "alice", "response_format": "pcm"})
    assert r.status_code == 200
    inp, out = int(r.headers["x-omni-stream-input-tokens"]), int(r.headers["x-omni-stream-output-tokens"])
    assert inp == len(TEXT.encode()) and out == expected_tone("alice", TEXT).size // 1920
    assert int(r.headers["x-omni-stream-total-tokens"]) == inp + out


def test_voice_id_object_and_case(client, http):
    a = client.audio.speech.create(model=MODEL, voice={"id": "CAROL"}, input=TEXT, response_format="pcm").content
    b = http.post("/v1/audio/speech", json={"input": TEXT, "voice": "carol", "response_format": "pcm"}).content
    assert a == b == pcm16(expected_tone("carol", TEXT))


def test_speed_changes_duration_not_format(http):
    body = {"input": TEXT * 3, "voice": "alice", "response_format": "wav"}
    normal = sf.info(io.BytesIO(http.post("/v1/audio/speech", json=body).content)).duration
    fast = sf.info(io.BytesIO(http.post("/v1/audio/speech", json={**body, "speed": 2.0}).content)).duration
    assert fast == pytest.approx(normal / 2, rel=0.05)


def test_sample_rate_resamples(http):
    r = http.post(
        "/v1/audio/speech", json={"input": TEXT, "voice": "alice", "response_format": "wav", "sample_rate": 16000}
    )
    audio, rate = sf.read(io.BytesIO(r.content))
    assert rate == 16000 and r.headers["x-sample-rate"] == "16000"
    assert audio.size == pytest.approx(expected_tone("alice", TEXT).size * 2 / 3, abs=4)


# --- streaming ---


def test_sdk_raw_pcm_stream(client):
    with client.audio.speech.with_streaming_response.create(
        model=MODEL, voice="dave", input=TEXT * 4, response_format="pcm", stream_format="audio"
    ) as r:
        assert r.headers["content-type"] == "audio/pcm" and r.headers["x-sample-rate"] == str(RATE)
        chunks = list(r.iter_bytes())
    assert b"".join(chunks) == pcm16(expected_tone("dave", TEXT * 4))


def test_sdk_raw_wav_stream(client):
    with client.audio.speech.with_streaming_response.create(
        model=MODEL, voice="carol", input=TEXT * 3, response_format="wav", stream_format="audio"
    ) as r:
        assert r.headers["content-type"] == "audio/wav" and r.headers["x-sample-rate"] == str(RATE)
        chunks = list(r.iter_bytes())
    data = b"".join(chunks)
    assert data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt " and data[36:40] == b"data"
    assert int.from_bytes(data[24:28], "little") == RATE and int.from_bytes(data[22:24], "little") == 1
    assert data[44:] == pcm16(expected_tone("carol", TEXT * 3))  # the samples after the streaming header


def test_raw_wav_stream_header(http):
    body = {"input": TEXT, "voice": "alice", "response_format": "wav", "stream_format": "audio"}
    with http.stream("POST", "/v1/audio/speech", json=body) as r:
        assert r.headers["content-type"] == "audio/wav"
        data = r.read()
    head = data[:44]
    assert head[:4] == b"RIFF" and head[8:16] == b"WAVEfmt " and head[36:40] == b"data"
    assert head[4:8] == b"\xff\xff\xff\xff" and head[40:44] == b"\xff\xff\xff\xff"
    channels, rate = int.from_bytes(head[22:24], "little"), int.from_bytes(head[24:28], "little")
    assert (channels, rate, int.from_bytes(head[34:36], "little")) == (1, RATE, 16)
    assert data[44:] == pcm16(expected_tone("alice", TEXT))


def test_the_encoder_opens_while_the_model_makes_the_first_chunk(live_server, http, monkeypatch):
    """A stream's encoder is opened (a thread hop) while its first chunk is made: not after the chunk, where it
    would stand between the chunk and the first byte, nor before the request reaches the model."""
    with encoder_meets_first_step(live_server, monkeypatch) as met:
        body = {"input": TEXT, "voice": "alice", "response_format": "pcm", "stream_format": "audio"}
        with http.stream("POST", "/v1/audio/speech", json=body) as r:
            data = r.read()
    assert sorted(met) == [("open", True), ("step", True)]
    assert data == pcm16(expected_tone("alice", TEXT))


def test_the_early_encoder_is_closed_when_the_stream_fails_or_the_client_leaves(monkeypatch):
    """The first chunk's error reaches the route as itself, and a client leaving (cancellation) before the first
    chunk leaves no encoder open: every AudioOut opened for the stream is closed."""
    import anyio

    from omni_stream.realtime.common.audio_out import AudioOut, first_chunk_and_output
    from omni_stream.realtime.common.errors import ApiError

    closed: list[AudioOut] = []
    close = AudioOut.close
    monkeypatch.setattr(AudioOut, "close", lambda self: (closed.append(self), close(self))[1])

    async def failing():
        raise ApiError(400, "bad voice")
        yield  # an async generator

    async def silent():
        await anyio.sleep_forever()
        yield

    async def main() -> None:
        with pytest.raises(ApiError, match="bad voice"):
            await first_chunk_and_output(failing(), "mp3", RATE, None)
        assert len(closed) == 1
        with anyio.move_on_after(0.5):
            await first_chunk_and_output(silent(), "pcm", RATE, None)
        assert len(closed) == 2

    anyio.run(main)


def test_sdk_sse_stream(client):
    with client.audio.speech.with_streaming_response.create(
        model=MODEL, voice="bob", input=TEXT * 2, response_format="pcm", stream_format="sse"
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    names = [name for name, _ in events]
    assert names[-1] == "speech.audio.done" and names.count("speech.audio.done") == 1
    assert set(names[:-1]) == {"speech.audio.delta"} and len(names) >= 3
    assert all(data["type"] == name for name, data in events)
    audio = b"".join(base64.b64decode(data["audio"]) for _, data in events[:-1])
    assert audio == pcm16(expected_tone("bob", TEXT * 2))
    usage = events[-1][1]["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["output_tokens"] == len(audio) // 2 // 1920
    assert usage["input_token_details"] == {"text_tokens": len((TEXT * 2).encode()), "audio_tokens": 0}
    assert all(data["response_format"] == "pcm" for _, data in events[:-1])


def test_sse_wav_deltas_concatenate_to_a_wav(http):
    body = {"input": TEXT, "voice": "carol", "response_format": "wav", "stream": True}
    with http.stream("POST", "/v1/audio/speech", json=body, headers={"Accept": "application/octet-stream"}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    data = b"".join(base64.b64decode(d["audio"]) for n, d in events if n == "speech.audio.delta")
    assert data[:4] == b"RIFF" and data[44:] == pcm16(expected_tone("carol", TEXT))


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
    body = {"input": TEXT, "voice": "alice", "response_format": "pcm", **fields}
    for accept in ("application/octet-stream", "text/event-stream"):
        r = http.post("/v1/audio/speech", json=body, headers={"Accept": accept})
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind)


def test_sse_error_after_start_is_in_band(http):
    body = {
        "input": "Fails later [[fail:stage@1]] in the codec.",
        "voice": "alice",
        "response_format": "pcm",
        "stream": True,
    }
    with http.stream("POST", "/v1/audio/speech", json=body) as r:
        assert r.status_code == 200
        events = sse_events(r.iter_lines())
    names = [n for n, _ in events]
    assert names[-1] == "speech.audio.error" and "speech.audio.done" not in names and names[0] == "speech.audio.delta"
    error = events[-1][1]["error"]
    assert error["type"] == "server_error" and error["code"] == 500 and error["param"] is None and error["message"]


def test_failure_before_first_chunk_is_a_plain_5xx(http):
    body = {"input": "Fails at once [[fail:stage@0]].", "voice": "alice", "response_format": "pcm", "stream": True}
    r = http.post("/v1/audio/speech", json=body)
    assert r.status_code == 500 and r.headers["content-type"] == "application/json"
    assert r.json()["error"]["type"] == "InternalServerError"


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
        ({"input": TEXT, "voice": "nope"}, "voice", ["nope", "alice", "bob"]),
        ({"input": TEXT, "response_format": "xyz"}, "response_format", ["wav", "pcm"]),
        ({"input": TEXT, "speed": 5}, "speed", ["0.25", "4.0"]),
        ({"input": TEXT, "stream_format": "bytes"}, "stream_format", ["sse", "audio"]),
        ({"input": TEXT, "task_type": "Base"}, "ref_audio", ["ref_audio"]),
        ({"input": TEXT, "language": "Klingon"}, "language", ["Klingon", "English"]),
        ({"input": TEXT, "ref_audio": "file:///etc/passwd"}, "ref_audio", ["allowed"]),
        ({"input": TEXT, "ref_audio": "https://example.com/a.wav"}, "ref_audio", ["disabled"]),
        ({"input": TEXT, "ref_audio": "%%%"}, "ref_audio", ["base64"]),
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


def test_sdk_raises_typed_errors(client):
    with pytest.raises(openai.BadRequestError):
        client.audio.speech.create(model=MODEL, voice="nope", input=TEXT)
    with pytest.raises(openai.NotFoundError) as info:
        client.audio.speech.create(model="other", voice="alice", input=TEXT)
    assert info.value.body["param"] == "model" and info.value.body["type"] == "NotFoundError"


def test_unknown_route_and_method_use_the_error_shape(http):
    error_of(http.get("/v1/nothing"), 404)
    error_of(http.get("/v1/audio/speech"), 405)


def test_ref_audio_data_url_clones(http):
    from serving_helpers import wav_bytes

    url = "data:audio/wav;base64," + base64.b64encode(wav_bytes(2.0)).decode()
    r = http.post(
        "/v1/audio/speech", json={"input": TEXT, "ref_audio": url, "ref_text": "hi", "response_format": "pcm"}
    )
    assert r.status_code == 200 and len(r.content) == expected_tone("alice", TEXT).size * 2
    short = "data:audio/wav;base64," + base64.b64encode(wav_bytes(0.5)).decode()
    error = error_of(http.post("/v1/audio/speech", json={"input": TEXT, "ref_audio": short}), 400)
    assert error["param"] == "ref_audio" and "Reference audio too short (0.5s)" in error["message"]


# --- models, health, metrics ---


def test_models_health_metrics(http, client):
    assert [m.id for m in client.models.list()] == [MODEL]
    assert http.get("/health").json() == {"status": "ok", "model": MODEL}
    r = http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert "omni_stream_requests_running" in r.text and "omni_stream_http_requests_total" in r.text


@pytest.mark.parametrize("page", ["/", "/realtime", "/video"])
def test_every_demo_page_and_each_file_it_links_is_served(http, page):
    r = http.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    linked = re.findall(r'(?:href|src)="(static/[^"]+)"', r.text)
    assert "static/page.css" in linked  # the stylesheet the pages share
    for path in linked:
        assert http.get(f"/{path}").status_code == 200, path


def test_raw_stream_failure_after_start_cuts_the_body(http):
    body = {"input": "Fails later [[fail:stage@1]] in the codec.", "voice": "alice", "response_format": "pcm"}
    with http.stream("POST", "/v1/audio/speech", json={**body, "stream_format": "audio"}) as r:
        assert r.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            r.read()  # never a clean end: the client can tell the audio is incomplete
