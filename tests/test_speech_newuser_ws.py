"""WS /v1/audio/speech/stream as a product builds on it: what a new user tripped over.

- A ``session.config`` may carry the same reference audio as a POST /v1/audio/speech body: a clip the HTTP route
  clones from (1-30 s, up to the upload limit) is not refused on the socket as "Message too large".
- ``session.close`` with text not yet ended by ``input.done`` says that text was not spoken, instead of dropping it
  without a word (the socket still drains and closes with 1000).
- Text that alone makes more units than a session may queue is not answered "wait for audio.done" (none is
  coming: the session would wait forever, its input.done refused each time), but told how out.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json

import httpx
import numpy as np
import pytest
import soundfile as sf
from serving_helpers import TTS_FRAMES, Session, running_server
from tiny_models import tiny_tts
from websockets.sync.client import connect

from omni_stream.realtime.settings import Settings
from omni_stream.realtime.speech.stream_protocol import Dispatch, Phase, ResolveConfig, SendText, SpeechStreamProtocol

pytest_plugins = ("serving_fixtures",)

PATH = "/v1/audio/speech/stream"


def wav_of(seconds: float, rate: int, channels: int) -> bytes:
    """A 16-bit WAV of quiet noise: 25 s of 48 kHz stereo is 4.8 MB, over the socket's old 4 MiB message limit."""
    noise = 0.1 * np.random.default_rng(0).standard_normal((int(seconds * rate), channels))
    buf = io.BytesIO()
    sf.write(buf, noise.astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def texts(actions) -> list[dict]:
    return [json.loads(a.text) for a in actions if isinstance(a, SendText)]


def protocol(settings: Settings) -> SpeechStreamProtocol:
    return SpeechStreamProtocol(settings, models=("tiny",), sample_rate=24000, now=0.0)


def test_a_config_as_large_as_a_speech_body_is_parsed_not_refused():
    settings = Settings()
    reference = "A" * (settings.max_speech_body_bytes - 64 * 1024)  # base64 at the HTTP route's own limit
    assert len(reference) > settings.max_ws_config_bytes
    p = protocol(settings)
    (action,) = p.receive_text(json.dumps({"type": "session.config", "ref_audio": reference}), 0.0)
    assert isinstance(action, ResolveConfig) and action.opts.ref_audio == reference
    # past the speech body's limit it is still refused, by size, before any parsing
    p = protocol(settings)
    too_big = json.dumps({"type": "session.config", "ref_audio": "A" * (settings.max_speech_body_bytes + 1)})
    assert texts(p.receive_text(too_big, 0.0))[0]["message"].startswith("Message too large")
    assert p.phase is Phase.CLOSED


def test_session_close_says_which_text_it_did_not_speak():
    p = protocol(Settings())
    (action,) = p.receive_text(json.dumps({"type": "session.config", "split_granularity": "sentence"}), 0.0)
    p.config_resolved(action.opts, object())  # type: ignore[arg-type]  # the template is the shell's
    p.receive_text(json.dumps({"type": "input.text", "text": "Spoken. Never flushed"}), 1.0)
    actions = p.receive_text(json.dumps({"type": "session.close"}), 2.0)
    (warning,) = texts(actions)
    assert warning["type"] == "error" and "input.done" in warning["message"]
    assert "13 characters" in warning["message"]  # "Never flushed"
    assert actions[-1] == Dispatch() and p.phase is Phase.DRAINING  # the queued unit is still spoken
    # nothing pending: session.close says nothing
    p = protocol(Settings())
    (action,) = p.receive_text(json.dumps({"type": "session.config"}), 0.0)
    p.config_resolved(action.opts, object())  # type: ignore[arg-type]
    assert p.receive_text(json.dumps({"type": "session.close"}), 1.0) == [Dispatch()]


@pytest.fixture(scope="module")
def base_server():
    with running_server(tiny_tts("base", greedy_frames=TTS_FRAMES + 1), Settings(ws_idle_timeout=10.0)) as live:
        yield live


def test_the_socket_clones_from_the_reference_the_http_route_clones_from(base_server):
    reference = base64.b64encode(wav_of(25.0, 48000, 2)).decode()
    config = {"ref_audio": reference, "x_vector_only_mode": True, "response_format": "pcm"}
    with httpx.Client(base_url=base_server.url, timeout=120) as c:
        http = c.post("/v1/audio/speech", json={"input": "Hello there.", **config})
    assert http.status_code == 200, http.text
    with contextlib.closing(connect(base_server.ws_url + PATH, open_timeout=10, max_size=None)) as ws:
        s = Session(ws)
        s.send(type="session.config", **config)
        s.send(type="input.text", text="Hello there.")
        s.send(type="input.done")
        messages = s.until("session.done", timeout=120)
    errors = [m for kind, m in messages if kind == "json" and m["type"] == "error"]
    assert errors == []
    audio = b"".join(m for kind, m in messages if kind == "binary")
    assert audio == http.content  # greedy: the same reference speaks the same audio both ways


def test_session_close_reports_unflushed_text_and_still_closes_normally(live_server):
    with contextlib.closing(connect(live_server.ws_url + PATH, open_timeout=10)) as ws:
        s = Session(ws)
        s.send(type="session.config", voice="vivian", response_format="pcm")
        s.send(type="input.text", text="Text with no input.done after it")
        s.send(type="session.close")
        kind, message = s.recv()
        assert kind == "json" and message["type"] == "error" and "not spoken" in message["message"]
        assert s.closed_code() == 1000


def configured(settings: Settings, **config) -> SpeechStreamProtocol:
    p = protocol(settings)
    (action,) = p.receive_text(json.dumps({"type": "session.config", **config}), 0.0)
    p.config_resolved(action.opts, object())  # type: ignore[arg-type]  # the template is the shell's
    return p


def test_text_that_alone_makes_too_many_units_is_not_told_to_wait_for_audio():
    settings = Settings(max_ws_queued_units=3)
    # one input.text of more sentences than a session may queue: nothing is queued, so no audio.done will come
    p = configured(settings, split_granularity="sentence")
    (refused,) = texts(p.receive_text(json.dumps({"type": "input.text", "text": "One. Two. Three. Four. "}), 1.0))
    assert "wait for audio.done" not in refused["message"] and "smaller parts" in refused["message"]
    assert p.splitter.pending == "" and p.outstanding == 0  # the message is dropped whole; the session goes on
    # buffered text that input.done would cut into too many units: input.done can never take it
    p = configured(settings)
    p.receive_text(json.dumps({"type": "input.text", "text": "One more sentence here. " * 50}), 1.0)
    for _ in range(2):  # the same answer each time: the client is told how out, not to wait
        (refused,) = texts(p.receive_text(json.dumps({"type": "input.done"}), 2.0))
        assert "wait for audio.done" not in refused["message"] and "input.cancel" in refused["message"]
    # units already waiting: then waiting is the advice
    p = configured(settings, split_granularity="sentence")
    p.receive_text(json.dumps({"type": "input.text", "text": "One. Two. "}), 1.0)
    (refused,) = texts(p.receive_text(json.dumps({"type": "input.text", "text": "Three. Four. "}), 1.0))
    assert "wait for audio.done" in refused["message"]
