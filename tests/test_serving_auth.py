"""API-key auth: Bearer header on /v1 HTTP and WebSocket and the WebRTC offer, the browser subprotocol, open /health,
/metrics and /rtc/config (servers on the tiny Qwen3-TTS)."""

from __future__ import annotations

import importlib.util
import json

import httpx
import openai
import pytest
from serving_helpers import running_server, tts_checkpoint
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from omni_stream.realtime.settings import Settings

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def live():
    with running_server(tts_checkpoint(), Settings(api_key=KEY)) as server:
        yield server


def test_http_needs_the_key(live):
    body = {"input": "Hi.", "voice": "vivian", "response_format": "pcm"}
    with httpx.Client(base_url=live.url) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}):
            r = c.post("/v1/audio/speech", json=body, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["type"] == "AuthenticationError"
            assert c.get("/v1/models", headers=headers).status_code == 401
            assert c.get("/v1/audio/voices", headers=headers).status_code == 401
        assert c.post("/v1/audio/speech", json=body, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert c.get("/health").status_code == 200 and c.get("/metrics").status_code == 200
        assert c.get("/rtc/config").status_code == 200  # open: a page asks it before it has a key
        # the WebRTC offer needs the key, with or without fastrtc installed (then a 501 saying what to install)
        assert c.post("/rtc/webrtc/offer", json={}).status_code == 401
        past = c.post("/rtc/webrtc/offer", json={}, headers={"Authorization": f"Bearer {KEY}"})
        assert past.status_code != 401
        if importlib.util.find_spec("fastrtc") is None:
            assert past.status_code == 501 and "omni-stream[webrtc]" in past.json()["error"]["message"]


def test_sdk_with_and_without_key(live):
    model = live.engine.speech_info.model_name
    ok = openai.OpenAI(base_url=f"{live.url}/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in ok.models.list()] == [model]
    assert ok.audio.speech.create(model=model, voice="vivian", input="Hi.", response_format="pcm").content
    bad = openai.OpenAI(base_url=f"{live.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.audio.speech.create(model=model, voice="vivian", input="Hi.")


def say_hi(ws) -> dict:
    ws.send(json.dumps({"type": "session.config", "voice": "vivian", "response_format": "pcm"}))
    ws.send(json.dumps({"type": "input.text", "text": "Hi."}))
    ws.send(json.dumps({"type": "input.done"}))
    return json.loads(ws.recv(timeout=10))


def test_websocket_auth(live):
    url = f"{live.ws_url}/v1/audio/speech/stream"
    for kwargs in (
        {},
        {"additional_headers": {"Authorization": "Bearer wrong"}},
        {"subprotocols": ["openai-insecure-api-key.x"]},
    ):
        with pytest.raises(InvalidStatus) as info:
            connect(url, **kwargs)
        assert info.value.response.status_code == 403
    with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        assert say_hi(ws)["type"] == "audio.start"
    with connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"]) as ws:
        assert ws.subprotocol == "realtime"
        assert KEY not in str(ws.response.headers)
        assert say_hi(ws)["type"] == "audio.start"
    with connect(url, subprotocols=[f"openai-insecure-api-key.{KEY}"]) as ws:
        # the key alone is accepted, and never echoed back in the response headers
        assert ws.subprotocol is None and KEY not in str(ws.response.headers)
        assert say_hi(ws)["type"] == "audio.start"


def test_demo_page_is_served_at_root_without_a_key(tmp_path):
    (tmp_path / "index.html").write_text("<html>demo</html>")
    with running_server(tts_checkpoint(), Settings(api_key=KEY, static_dir=tmp_path)) as server:
        r = httpx.get(f"{server.url}/")
        assert (
            r.status_code == 200 and r.text == "<html>demo</html>" and r.headers["content-type"].startswith("text/html")
        )
        assert httpx.get(f"{server.url}/static/index.html").status_code == 200
