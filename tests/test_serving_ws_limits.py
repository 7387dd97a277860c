"""WS /v1/audio/speech/stream on the tiny Qwen3-TTS: bad text, the queued-unit bound, and how failures end (or do
not end) a session. A failed generation (which a random model cannot be made to have) is in
``test_serving_faults.py``."""

from __future__ import annotations

import contextlib
import json
import threading

import pytest
from serving_helpers import Session, running_server, step_hook, tts_checkpoint, units_of
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from omni_stream.realtime.settings import Settings
from omni_stream.realtime.speech import stream as speech_ws

pytest_plugins = ("serving_fixtures",)

PATH = "/v1/audio/speech/stream"


@pytest.fixture
def open_ws():
    """``open_ws(url, **config)``: a configured session (no config when ``config`` is None), closed after the test."""
    with contextlib.ExitStack() as stack:

        def opener(url: str, config: dict | None) -> Session:
            session = Session(stack.enter_context(connect(url + PATH, open_timeout=10)))
            if config is not None:
                session.send(type="session.config", **config)
            return session

        yield opener


def drain_until_closed(session: Session) -> tuple[list[dict], int | None]:
    """Every JSON message until the server closes, and its close code."""
    messages = []
    try:
        while True:
            kind, message = session.recv()
            if kind == "json":
                messages.append(message)
    except ConnectionClosed as exc:
        return messages, exc.rcvd.code if exc.rcvd else None


def errors_in(messages: list) -> list[str]:
    return [m[1]["message"] for m in messages if m[0] == "json" and m[1]["type"] == "error"]


def test_lone_surrogate_text_is_a_non_fatal_error(live_server, open_ws):
    s = open_ws(live_server.ws_url, {"voice": "vivian", "response_format": "pcm"})
    s.ws.send(json.dumps({"type": "input.text", "text": "hi \ud800"}))  # ASCII-escaped on the wire
    message = s.recv()[1]
    assert message["type"] == "error" and "'text'" in message["message"] and "surrogate" in message["message"]
    s.send(type="input.text", text="Still here.")
    s.send(type="input.done")
    (unit,) = units_of(s.until("session.done"))
    assert unit["start"]["sentence_text"] == "Still here." and unit["done"]["error"] is False


@pytest.mark.parametrize("field", ["instructions", "ref_text", "voice", "language"])
def test_lone_surrogate_in_config_is_refused_as_policy(live_server, open_ws, field):
    s = open_ws(live_server.ws_url, None)
    s.ws.send(json.dumps({"type": "session.config", "voice": "vivian", field: "x\udc00"}))
    message = s.recv()[1]
    assert message["type"] == "error" and f"'{field}'" in message["message"] and "surrogate" in message["message"]
    assert s.closed_code() == 1008


def test_odd_config_values_never_close_with_an_internal_error(live_server, open_ws):
    for field in ("voice", "speed", "sample_rate", "seed", "split_granularity", "stream_audio", "ref_audio"):
        for value in (True, -1, 0, 10**30, float("nan"), [], {"a": {"b": [1]}}, "\x00", "sentence"):
            s = open_ws(live_server.ws_url, None)
            s.ws.send(json.dumps({"type": "session.config", "voice": "vivian", field: value}))
            with contextlib.suppress(ConnectionClosed):  # a refused config closes at once, maybe before this
                s.send(type="session.close")
            messages, code = drain_until_closed(s)
            refused = any(m["type"] == "error" for m in messages)
            assert code == (1008 if refused else 1000), (field, value, messages)


def test_deeply_nested_message_is_a_non_fatal_error(live_server, open_ws):
    s = open_ws(live_server.ws_url, {"voice": "vivian"})
    s.ws.send('{"type": "input.text", "text": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert s.recv()[1] == {"type": "error", "message": "Invalid JSON message"}
    s.send(type="session.close")
    assert s.closed_code() == 1000


def test_queued_units_are_bounded(open_ws):
    gate = threading.Event()  # the model steps nothing until the bound has been met: every unit stays queued
    with (
        running_server(tts_checkpoint(), Settings(max_ws_queued_units=3)) as live,
        step_hook(live, lambda batch: gate.wait()),
    ):
        try:
            config = {"voice": "vivian", "response_format": "pcm", "split_granularity": "sentence"}
            s = open_ws(live.ws_url, config)
            s.send(type="input.text", text="One. Two. Three. Four. Five. ")  # five units at once: over the bound
            message = s.recv()[1]
            assert message["type"] == "error" and "limit of 3" in message["message"]
            s.send(type="input.text", text="One. Two. ")
            s.send(type="input.text", text="Three. Four. ")  # two queued, two more would pass the bound
            seen = s.until("error")
            assert "2 waiting" in seen[-1][1]["message"] and not units_of(seen)
        finally:
            gate.set()
        s.send(type="input.done")
        messages = seen[:-1] + s.until("session.done", timeout=30)
        assert [u["start"]["sentence_text"] for u in units_of(messages)] == ["One.", "Two."]
        assert not errors_in(messages) and messages[-1][1]["total_sentences"] == 2


def test_internal_error_closes_with_1011(live_server, open_ws, monkeypatch):
    async def broken(self, job):
        raise RuntimeError("sender broke")

    monkeypatch.setattr(speech_ws.SpeechSession, "_send_unit", broken)
    s = open_ws(live_server.ws_url, {"voice": "vivian", "response_format": "pcm"})
    s.send(type="input.text", text="Anything.")
    s.send(type="input.done")
    message = s.recv()[1]
    assert message == {"type": "error", "message": "Internal error: sender broke"}
    assert s.closed_code() == 1011
