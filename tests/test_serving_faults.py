"""Speech when generation fails: over HTTP before the first chunk (a plain 5xx), after it (an in-band SSE error
event, a raw body cut short so the client can tell); on the speech WebSocket a failed unit is reported and the
session goes on.

Why the synthetic TTS (``tests/synthetic``): these tests need a request that fails at a chosen point of its stream
(its ``[[fail:stage@K]]`` marker fails the codec stage after K chunks); a real model fails only when something is
broken, at no point a test can choose.
"""

from __future__ import annotations

import json

import httpx
import pytest
from serving_helpers import Session, units_of
from websockets.sync.client import connect

pytest_plugins = ("serving_fixtures",)


@pytest.fixture(scope="module")
def http(synthetic_server):
    with httpx.Client(base_url=synthetic_server.url, timeout=30) as c:
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


def test_raw_stream_failure_after_start_cuts_the_body(http):
    body = {"input": "Fails later [[fail:stage@1]] in the codec.", "voice": "alice", "response_format": "pcm"}
    with http.stream("POST", "/v1/audio/speech", json={**body, "stream_format": "audio"}) as r:
        assert r.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            r.read()  # never a clean end: the client can tell the audio is incomplete


def test_a_websocket_unit_failure_is_reported_and_the_session_continues(synthetic_server):
    with connect(synthetic_server.ws_url + "/v1/audio/speech/stream", open_timeout=10) as ws:
        s = Session(ws)
        s.send(type="session.config", voice="alice", response_format="pcm", stream_audio=True)
        s.send(type="input.text", text="This unit fails [[fail:stage@1]] after its first chunk.")
        s.send(type="input.done")
        messages = s.until("session.done")
        errors = [m[1] for m in messages if m[0] == "json" and m[1]["type"] == "error"]
        assert len(errors) == 1 and errors[0]["message"].startswith("Generation failed for utterance 0, sentence 0")
        assert errors[0]["partial_audio"] is True and errors[0]["action"] == "discard"
        (unit,) = units_of(messages)
        assert unit["done"]["error"] is True
        assert unit["done"]["total_bytes"] == sum(len(f) for f in unit["frames"]) > 0
        s.send(type="input.text", text="Fine again.")
        s.send(type="input.done")
        (unit,) = units_of(s.until("session.done"))
        assert unit["done"]["error"] is False


def test_a_model_step_fault_is_a_non_fatal_unit_error(synthetic_server):
    """PROTOCOLS.md: errors after a valid config are non-fatal; a failed generation is one unit's error."""
    with connect(synthetic_server.ws_url + "/v1/audio/speech/stream", open_timeout=10) as ws:
        s = Session(ws)
        s.send(type="session.config", voice="alice", response_format="wav")
        s.send(type="input.text", text="A step fails [[fail:step@1]] here.")
        s.send(type="input.done")
        messages = s.until("session.done")
        (unit,) = units_of(messages)
        errors = [m for m in messages if m[0] == "json" and m[1]["type"] == "error"]
        assert unit["done"]["error"] is True and len(errors) == 1
        s.send(type="input.text", text="And the session goes on.")
        s.send(type="input.done")
        (unit,) = units_of(s.until("session.done"))
        assert unit["done"]["error"] is False and unit["frames"]
