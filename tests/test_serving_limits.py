"""Request body limits: refused with a 400 in the error shape while reading, chunked transfer included (servers on
the tiny Qwen3-TTS: CustomVoice for speech bodies, Base for voice uploads)."""

from __future__ import annotations

import httpx
import pytest
from serving_helpers import TTS_FRAMES, running_server, tts_checkpoint, wav_bytes
from starlette.requests import Request
from tiny_models import tiny_tts

from omni_stream.realtime.common.body_limit import BodyTooLarge, drain, read_body
from omni_stream.realtime.settings import Settings
from omni_stream.realtime.speech.voices import FORM_OVERHEAD

pytest_plugins = ("serving_fixtures",)

UPLOAD_LIMIT = 32 * 1024
BOUNDARY = "omnistreamtestboundary"


@pytest.fixture(scope="module")
def small():
    with running_server(tts_checkpoint(), Settings(max_upload_bytes=UPLOAD_LIMIT)) as live:
        with httpx.Client(base_url=live.url, timeout=30) as client:
            yield live, client


@pytest.fixture(scope="module")
def small_base():
    """A Base model (it takes uploads) with the same limit."""
    base = tiny_tts("base", greedy_frames=TTS_FRAMES + 1)
    with running_server(base, Settings(max_upload_bytes=UPLOAD_LIMIT)) as live:
        with httpx.Client(base_url=live.url, timeout=30) as client:
            yield live, client


def chunks(total: int, size: int = 16 * 1024):
    """A body generator: httpx sends it chunked, without Content-Length."""
    sent = 0
    while sent < total:
        piece = min(size, total - sent)
        sent += piece
        yield b" " * piece


def assert_too_large(response: httpx.Response, limit: int) -> None:
    assert response.status_code == 400, response.text
    assert response.json()["error"] == {
        "message": f"Request body exceeds the maximum of {limit} bytes",
        "type": "BadRequestError",
        "param": response.json()["error"]["param"],
        "code": 400,
    }


def test_speech_body_limit_follows_the_upload_limit():
    settings = Settings()
    assert settings.max_speech_body_bytes == -(-10 * 1024 * 1024 * 4 // 3) + 64 * 1024
    assert Settings(max_upload_bytes=UPLOAD_LIMIT).max_speech_body_bytes == 43691 + 65536


def test_speech_body_over_the_limit_with_content_length(small):
    live, client = small
    limit = live.state.settings.max_speech_body_bytes
    r = client.post("/v1/audio/speech", content=b" " * (limit + 1), headers={"content-type": "application/json"})
    assert_too_large(r, limit)


def test_speech_body_over_the_limit_chunked(small):
    live, client = small
    limit = live.state.settings.max_speech_body_bytes
    r = client.post("/v1/audio/speech", content=chunks(2 * limit), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers and r.request.headers["transfer-encoding"] == "chunked"
    assert_too_large(r, limit)
    # A body just under the limit is read (and then judged on its content).
    body = b'{"input": "Hi.", "voice": "vivian"}'
    r = client.post("/v1/audio/speech", content=iter([body + b" " * (limit - len(body))]))
    assert r.status_code == 200


def multipart(audio: bytes) -> bytes:
    parts = []
    for name, value in (("name", "big"), ("consent", "yes")):
        parts.append(f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="audio_sample"; filename="a.wav"\r\n'
    parts.append(head.encode() + b"Content-Type: audio/wav\r\n\r\n" + audio + b"\r\n")
    parts.append(f"--{BOUNDARY}--\r\n".encode())
    return b"".join(parts)


@pytest.mark.parametrize("chunked", [False, True])
def test_voice_upload_over_the_limit(small_base, chunked):
    live, client = small_base
    limit = UPLOAD_LIMIT + FORM_OVERHEAD
    body = multipart(b"\0" * (limit + 1024))
    content = (body[i : i + 8192] for i in range(0, len(body), 8192)) if chunked else body
    headers = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}
    r = client.post("/v1/audio/voices", content=content, headers=headers)
    assert ("content-length" in r.request.headers) is not chunked
    assert_too_large(r, limit)
    assert r.json()["error"]["param"] == "audio_sample"
    assert live.state.voices.get("big") is None
    # Within the multipart limit but over the audio limit: the audio check names the size.
    r = client.post("/v1/audio/voices", content=iter([multipart(wav_bytes(5.0))]), headers=headers)
    assert r.status_code == 400 and "exceeds maximum limit" in r.json()["error"]["message"]


class Feed:
    """An endless ASGI body: counts what the reader pulled."""

    def __init__(self, size: int = 64 * 1024, total: int | None = None):
        self.size, self.total, self.sent = size, total, 0

    async def __call__(self):
        self.sent += self.size
        more = self.total is None or self.sent < self.total
        return {"type": "http.request", "body": b"x" * self.size, "more_body": more}


def request_for(feed: Feed, headers: list | None = None) -> Request:
    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers or []}, feed)


async def test_read_body_stops_at_the_limit_without_buffering_more():
    feed = Feed()
    with pytest.raises(BodyTooLarge) as info:
        await read_body(request_for(feed), 1024 * 1024)
    assert info.value.status == 400 and info.value.more
    assert feed.sent <= 1024 * 1024 + feed.size  # one message past the limit, never the endless rest
    before = feed.sent
    await drain(feed, info.value)  # drops at most another limit's worth, then gives up
    assert before < feed.sent <= before + 1024 * 1024 + 2 * feed.size


async def test_declared_length_is_refused_unread():
    feed = Feed()
    with pytest.raises(BodyTooLarge):
        await read_body(request_for(feed, [(b"content-length", b"2000000")]), 1024 * 1024)
    assert feed.sent == 0


async def test_body_ending_exactly_past_the_limit_is_not_drained():
    feed = Feed(total=2 * 64 * 1024)
    with pytest.raises(BodyTooLarge) as info:
        await read_body(request_for(feed), 64 * 1024)
    assert not info.value.more
    sent = feed.sent
    await drain(feed, info.value)  # nothing left to read: waiting would hang on http.disconnect
    assert feed.sent == sent
