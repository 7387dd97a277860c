"""Odd client input never gives a 5xx: undecodable data URLs, lone surrogates, bad file paths, wrong types. On the
tiny Qwen3-TTS: CustomVoice for the fields of a plain request, Base (a cloning model) where the input is a
reference or an upload."""

from __future__ import annotations

import base64
import json
import os
from urllib.parse import quote

import httpx
import pytest
from serving_helpers import TTS_FRAMES, running_server, wav_bytes
from tiny_models import tiny_tts

from omni_stream.realtime.settings import Settings

pytest_plugins = ("serving_fixtures",)

SPEECH = "/v1/audio/speech"
FIELDS = (
    "model",
    "input",
    "voice",
    "speaker",
    "response_format",
    "speed",
    "stream",
    "stream_format",
    "instructions",
    "task_type",
    "language",
    "ref_audio",
    "ref_text",
    "x_vector_only_mode",
    "max_new_tokens",
    "seed",
    "initial_codec_chunk_frames",
    "sample_rate",
)
ODD_VALUES = (
    True,
    0,
    -1,
    10**30,
    -(10**30),
    1.5,
    1e308,
    float("nan"),
    float("inf"),
    "",
    "\x00",
    "x" * 10_000,
    [],
    [1, "a"],
    {},
    {"id": {"nested": [1, {"deep": None}]}},
)


@pytest.fixture(scope="module")
def http(live_server):
    with httpx.Client(base_url=live_server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def base_checkpoint():
    return tiny_tts("base", greedy_frames=TTS_FRAMES + 1)


@pytest.fixture(scope="module")
def base_http(base_checkpoint, tmp_path_factory):
    with (
        running_server(base_checkpoint, Settings(voices_dir=tmp_path_factory.mktemp("voices"))) as live,
        httpx.Client(base_url=live.url, timeout=60) as c,
    ):
        yield c


def error_400(response: httpx.Response, param: str | None = None) -> dict:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400 and error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error


def post_raw(http: httpx.Client, raw: str) -> httpx.Response:
    return http.post(SPEECH, content=raw.encode(), headers={"content-type": "application/json"})


def test_percent_encoded_data_url_is_decoded_as_bytes(base_http):
    error_400(base_http.post(SPEECH, json={"input": "Hi.", "ref_audio": "data:audio/wav,%E2%82%AC"}), "ref_audio")
    url = "data:audio/wav," + quote(wav_bytes(1.5))  # every byte percent-encoded: must survive as is
    r = base_http.post(SPEECH, json={"input": "Hi.", "ref_audio": url, "ref_text": "hi", "response_format": "pcm"})
    assert r.status_code == 200 and r.content


@pytest.mark.parametrize("field", ["input", "instructions", "ref_text", "voice", "language", "model"])
def test_lone_surrogates_are_400_naming_the_field(http, field):
    body = {"input": "Hi.", field: "hi \ud800"}
    raw = json.dumps(body)  # ASCII-escaped: the server's JSON parser makes the lone surrogate
    assert "\\ud800" in raw
    error = error_400(post_raw(http, raw), field)
    assert "surrogate" in error["message"]


def test_lone_surrogate_voice_object(http):
    error_400(post_raw(http, json.dumps({"input": "Hi.", "voice": {"id": "\udfff"}})), "voice.id")  # by its path


def test_file_url_path_problems_are_400(base_checkpoint, tmp_path):
    media = tmp_path / "media"
    media.mkdir()
    (media / "ok.wav").write_bytes(wav_bytes(1.5))
    os.symlink(media / "loop", media / "loop")  # resolving it loops
    settings = Settings(allowed_local_media_path=media)
    with running_server(base_checkpoint, settings) as live, httpx.Client(base_url=live.url, timeout=60) as c:
        for ref in (
            f"file://{media}/a%00b.wav",
            f"file://{media}/%00",
            f"file://{media}/loop",
            f"file://{media}/missing.wav",
            f"file://{media}/..%2F..%2Fetc%2Fpasswd",
            f"file://{media}/{'x' * 5000}.wav",
            "file://[::1",
        ):
            error_400(c.post(SPEECH, json={"input": "Hi.", "ref_audio": ref}), "ref_audio")
        ok = {"input": "Hi.", "ref_audio": f"file://{media}/ok.wav", "ref_text": "hi", "response_format": "pcm"}
        assert c.post(SPEECH, json=ok).status_code == 200


@pytest.mark.parametrize("field", FIELDS)
def test_odd_values_in_every_field_never_5xx(http, field):
    for value in ODD_VALUES:
        body = {"input": "Hi.", "voice": "vivian", "response_format": "pcm", field: value}
        r = http.post(SPEECH, content=json.dumps(body).encode(), headers={"content-type": "application/json"})
        assert r.status_code < 500, (field, value, r.text)
        if r.status_code != 200:
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    "raw",
    [
        b"null",
        b"1",
        b'"text"',
        b"NaN",
        b"[" * 100_000 + b"]" * 100_000,  # deeper than the JSON parser recurses
        b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b"\xff\xfe{}",
        b'{"input": "Hi."',
    ],
)
def test_odd_bodies_are_400(http, raw):
    error_400(http.post(SPEECH, content=raw, headers={"content-type": "application/json"}))


def test_oversized_base64_reference_is_refused_before_decoding(base_checkpoint):
    settings = Settings(max_upload_bytes=32 * 1024)
    with running_server(base_checkpoint, settings) as live, httpx.Client(base_url=live.url, timeout=30) as c:
        payload = base64.b64encode(b"\0" * (40 * 1024)).decode()  # fits the body limit, not the audio limit
        for ref in (payload, "data:audio/wav;base64," + payload, "data:audio/wav," + "%00" * (33 * 1024)):
            error = error_400(c.post(SPEECH, json={"input": "Hi.", "ref_audio": ref}), "ref_audio")
            assert "larger than 32768 bytes" in error["message"]


@pytest.mark.parametrize(
    ("fields", "files"),
    [
        ({"name": "a\x00b", "consent": "yes"}, {"audio_sample": ("a.wav", b"RIFF", "audio/wav")}),
        ({"name": "../../etc", "consent": "yes"}, {"audio_sample": ("a.wav", wav_bytes(1.5), "audio/wav")}),
        ({"name": "x" * 10_000, "consent": "yes"}, {"audio_sample": ("a.wav", wav_bytes(1.5), "audio/wav")}),
        ({"name": "ok", "consent": "yes", "audio_sample": "not a file"}, {}),
        ({"name": "ok", "consent": "yes"}, {"audio_sample": ("a.wav", b"\xff" * 1000, "audio/wav")}),
        ({"name": "ok", "consent": "yes"}, {"audio_sample": ("a.bin", b"\x00" * 1000, "application/x-foo")}),
        ({"name": "ok", "consent": "yes"}, {"name": ("n.txt", b"file as name", "text/plain")}),
    ],
)
def test_odd_voice_uploads_are_400(base_http, fields, files):
    error_400(base_http.post("/v1/audio/voices", data=fields, files=files or None))


@pytest.mark.parametrize("name", ["%00", "..", "x" * 5000, "%ED%A0%80", "%FF"])
def test_odd_voice_deletes_are_404(http, name):
    r = http.delete(f"/v1/audio/voices/{name}")
    assert r.status_code == 404 and r.json()["error"]["code"] == 404


@pytest.mark.parametrize(
    "data",
    [
        b"\xff" * 1000,
        b"RIFF\xff\xff\xff\xffWAVEfmt " + b"\x00" * 200,
        b"OggS" + bytes(range(256)) * 4,
        b"fLaC" + b"\x00" * 500,
        b"ID3\x04\x00\x00\x00\x00\x00\x00" + b"\xff\xfb" * 300,
        b"\x1aE\xdf\xa3" + b"\x00" * 300,
        wav_bytes(40.0, rate=8000),
    ],
)
def test_undecodable_or_out_of_range_references_are_400(base_http, data):
    ref = "data:audio/wav;base64," + base64.b64encode(data).decode()
    error_400(base_http.post(SPEECH, json={"input": "Hi.", "ref_audio": ref}), "ref_audio")
