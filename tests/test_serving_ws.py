"""WS /v1/audio/speech/stream against a real server on the tiny Qwen3-TTS, with the websockets client.

Each unit's audio is compared with what the model says for the unit's text over HTTP (``serving_helpers.spoken``:
the tests' checkpoint decodes greedily, 9 frames a request unless it names a bound). A unit failing after its first
chunk, which a random model cannot be made to do, is in ``test_serving_faults.py``.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
import time

import numpy as np
import pytest
import soundfile as sf
from serving_helpers import (
    FRAME,
    RATE,
    TTS_FRAMES,
    Session,
    assert_same_pcm,
    encoder_meets_first_step,
    running_server,
    spoken,
    step_hook,
    tts_checkpoint,
    units_of,
)
from websockets.sync.client import connect

from omni_stream.realtime.settings import Settings

PATH = "/v1/audio/speech/stream"

pytest_plugins = ("serving_fixtures",)


_open = contextlib.ExitStack()


def raw_session(url: str, **kwargs) -> Session:
    """A connected client, closed at the end of the test module."""
    return Session(_open.enter_context(connect(url + PATH, open_timeout=10, **kwargs)))


def open_session(url: str, **config) -> Session:
    session = raw_session(url)
    session.send(type="session.config", **config)
    return session


@pytest.fixture(autouse=True)
def _close_clients():
    yield
    _open.close()


def test_happy_path_one_wav_per_utterance(live_server):
    s = open_session(live_server.ws_url, voice="vivian")
    s.send(type="input.text", text="Hello world. How are you? ")
    s.send(type="input.done")
    messages = s.until("session.done")
    assert [m[1]["type"] if m[0] == "json" else "binary" for m in messages] == [
        "audio.start",
        "binary",
        "audio.done",
        "session.done",
    ]
    start, frame, done, end = (m[1] for m in messages)
    assert start == {
        "type": "audio.start",
        "utterance_index": 0,
        "sentence_index": 0,
        "sentence_text": "Hello world. How are you?",
        "format": "wav",
        "sample_rate": RATE,
        "channels": 1,
    }
    audio, rate = sf.read(io.BytesIO(frame), dtype="float32")
    assert rate == RATE
    want = np.frombuffer(spoken(live_server, "vivian", "Hello world. How are you?"), "<i2") / 32767
    np.testing.assert_allclose(audio, want, atol=1e-4)
    assert done == {
        "type": "audio.done",
        "utterance_index": 0,
        "sentence_index": 0,
        "total_bytes": len(frame),
        "error": False,
    }
    assert end == {"type": "session.done", "utterance_index": 0, "total_sentences": 1}
    # The socket stays open: a second utterance, indices restart
    s.send(type="input.text", text="Second one.")
    s.send(type="input.done")
    units = units_of(s.until("session.done"))
    assert [(u["start"]["utterance_index"], u["start"]["sentence_index"]) for u in units] == [(1, 0)]
    s.send(type="session.close")
    assert s.closed_code() == 1000


def test_pcm_chunk_streaming(live_server):
    text = "A longer sentence that streams in several chunks of audio."
    s = open_session(live_server.ws_url, voice="ryan", response_format="pcm", stream_audio=True)
    s.send(type="input.text", text=text)
    s.send(type="input.done")
    (unit,) = units_of(s.until("session.done"))
    assert unit["start"]["format"] == "pcm" and unit["start"]["sample_rate"] == RATE and unit["start"]["channels"] == 1
    assert len(unit["frames"]) >= 2
    assert unit["done"]["total_bytes"] == sum(len(f) for f in unit["frames"])
    assert b"".join(unit["frames"]) == spoken(live_server, "ryan", text)


def test_per_message_deflate_is_declined_unless_the_server_enables_it(live_server):
    """The client offers deflate (websockets' default, as browsers do): the default server declines it, so audio
    frames are sent as they are; ``--ws-deflate`` servers accept it, and the audio is the same either way."""
    text = "A longer sentence that streams in several chunks of audio."

    def stream(url: str) -> tuple[list[str], bytes]:
        s = raw_session(url)  # compression="deflate": the offer
        s.send(type="session.config", voice="ryan", response_format="pcm", stream_audio=True)
        s.send(type="input.text", text=text)
        s.send(type="input.done")
        (unit,) = units_of(s.until("session.done"))
        return [e.name for e in s.ws.protocol.extensions], b"".join(unit["frames"])

    want = spoken(live_server, "ryan", text)
    assert stream(live_server.ws_url) == ([], want)
    with running_server(tts_checkpoint(), ws_deflate=True) as live:
        assert stream(live.ws_url) == (["permessage-deflate"], want)


def test_the_encoder_opens_while_the_model_makes_the_first_chunk(live_server, monkeypatch):
    """As over HTTP: a streamed unit's encoder is opened while its first chunk is made, not before the unit's
    request reaches the model."""
    want = spoken(live_server, "ryan", "Hello there.")
    with encoder_meets_first_step(live_server, monkeypatch) as met:
        s = open_session(live_server.ws_url, voice="ryan", response_format="pcm", stream_audio=True)
        s.send(type="input.text", text="Hello there.")
        s.send(type="input.done")
        (unit,) = units_of(s.until("session.done"))
    assert sorted(met) == [("open", True), ("step", True)]
    assert b"".join(unit["frames"]) == want


def test_sentence_splitting_with_decimals_and_cjk(live_server):
    s = open_session(live_server.ws_url, voice="serena", response_format="pcm", split_granularity="sentence")
    for piece in ["It costs 3", ".50 dollars. 你好", "。Next"]:
        s.send(type="input.text", text=piece)
    s.send(type="input.done")
    messages = s.until("session.done")
    units = units_of(messages)
    assert [u["start"]["sentence_text"] for u in units] == ["It costs 3.50 dollars.", "你好。", "Next"]
    assert [u["start"]["sentence_index"] for u in units] == [0, 1, 2]
    assert messages[-1][1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 3}
    for u in units:  # a unit is prefetched while the one before it streams: batched, to one 16-bit step
        (frame,) = u["frames"]
        assert_same_pcm(frame, spoken(live_server, "serena", u["start"]["sentence_text"]))


def test_units_are_sent_before_input_done(live_server):
    s = open_session(live_server.ws_url, voice="vivian", response_format="pcm", split_granularity="clause")
    s.send(type="input.text", text="Mr. Smith, e.g. a doctor; arrived. Then")
    units = units_of(s.until("audio.done") + s.until("audio.done") + s.until("audio.done"))
    assert [u["start"]["sentence_text"] for u in units] == ["Mr. Smith,", "e.g. a doctor;", "arrived."]
    s.send(type="input.done")
    rest = s.until("session.done")
    assert [u["start"]["sentence_text"] for u in units_of(rest)] == ["Then"]
    assert rest[-1][1]["total_sentences"] == 4


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("not json", "Invalid JSON message"),
        ("[1, 2]", "WebSocket messages must be JSON objects"),
        ('{"type": "foo"}', "Unknown message type: foo"),
        ('{"type": "input.text", "text": 123}', "input.text: 'text' must be a string, got integer"),
        (b"\x00\x01", "Binary messages are not supported"),
    ],
)
def test_malformed_messages_are_not_fatal(live_server, raw, message):
    s = open_session(live_server.ws_url, voice="vivian")
    s.ws.send(raw)
    _, payload = s.recv()
    assert payload["type"] == "error" and message in payload["message"]
    s.send(type="input.text", text="Still works.")
    s.send(type="input.done")
    assert s.until("session.done")[-1][1]["total_sentences"] == 1


def test_oversize_text_message_is_refused_and_session_continues(live_server):
    s = open_session(live_server.ws_url, voice="vivian")
    s.send(type="input.text", text="x" * (128 * 1024 + 1))
    assert s.recv()[1] == {"type": "error", "message": "input.text message too large"}
    s.send(type="input.text", text="Fine.")
    s.send(type="input.done")
    assert s.until("session.done")[-1][1]["total_sentences"] == 1


def test_empty_flush_and_config_while_open(live_server):
    s = open_session(live_server.ws_url, voice="vivian", response_format="pcm")
    s.send(type="input.done")
    assert s.recv()[1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 0}
    s.send(type="input.text", text="Kept with the old config.")
    s.send(type="session.config", voice="ryan")
    assert "utterance is in progress" in s.recv()[1]["message"]
    s.send(type="input.done")
    (unit,) = units_of(s.until("session.done"))
    assert unit["frames"] == [spoken(live_server, "vivian", "Kept with the old config.")]
    s.send(type="session.config", voice="aiden", response_format="pcm")  # between utterances: applies
    s.send(type="input.text", text="New voice.")
    s.send(type="input.done")
    (unit,) = units_of(s.until("session.done"))
    assert unit["frames"] == [spoken(live_server, "aiden", "New voice.")]
    s.send(type="session.config", voice="nope")
    assert s.recv()[1]["message"].startswith("Invalid session config: Invalid voice 'nope'")


@pytest.mark.parametrize(
    ("first", "message"),
    [
        ({"type": "input.text", "text": "hi"}, "Expected session.config, got: input.text"),
        ({"type": "session.config", "stream_audio": True, "response_format": "wav"}, "response_format='pcm'"),
        ({"type": "session.config", "voice": "nope"}, "Invalid voice 'nope'"),
        ({"type": "session.config", "model": "other"}, "does not exist"),
        ("garbage", "Invalid JSON message"),
    ],
)
def test_bad_first_message_closes_1008(live_server, first, message):
    s = raw_session(live_server.ws_url)
    s.ws.send(first if isinstance(first, str) else json.dumps(first))
    _, payload = s.recv()
    assert payload["type"] == "error" and message in payload["message"]
    assert s.closed_code() == 1008


def test_config_timeout_and_idle_timeout():
    with running_server(tts_checkpoint(), Settings(ws_config_timeout=0.3, ws_idle_timeout=0.5)) as live:
        s = raw_session(live.ws_url)
        assert s.recv()[1] == {"type": "error", "message": "Timeout waiting for session.config"}
        assert s.closed_code() == 1008
        s = open_session(live.ws_url, voice="vivian")
        s.send(type="input.text", text="Hi.")
        s.send(type="input.done")
        s.until("session.done")
        assert s.recv(timeout=5)[1] == {"type": "error", "message": "Idle timeout: no message received"}
        assert s.closed_code() == 1000


def test_input_cancel_stops_the_current_utterance(live_server):
    frames = 60  # ignore_eos: exactly this many, seconds of generation, so the cancel lands part way
    audio_arrived, release = threading.Event(), threading.Event()

    def hold_once_audio_arrived(batch):
        # Once the client holds the first audio chunk, the worker stops until the cancel has been handled.
        if audio_arrived.is_set():
            release.wait(10)

    s = open_session(
        live_server.ws_url,
        voice="vivian",
        response_format="pcm",
        stream_audio=True,
        split_granularity="sentence",
        max_new_tokens=frames,
        ignore_eos=True,
    )
    with step_hook(live_server, hold_once_audio_arrived):
        try:
            s.send(type="input.text", text="The first sentence is the one being spoken. " + "Then another. " * 3)
            _, start = s.recv()
            assert start["type"] == "audio.start" and start["sentence_index"] == 0
            assert s.recv()[0] == "binary"
            audio_arrived.set()
            s.send(type="input.cancel")
            messages = s.until("session.done")  # all of it while the worker is still held
        finally:
            release.set()
    done = [m[1] for m in messages if m[0] == "json" and m[1]["type"] == "audio.done"]
    assert len(done) == 1  # the prefetched and queued units never start
    assert done[0]["sentence_index"] == 0 and done[0]["cancelled"] is True and done[0]["error"] is False
    assert 0 < done[0]["total_bytes"] < frames * FRAME * 2  # stopped part way
    assert messages[-1][1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 1, "cancelled": True}
    assert not any(live_server.wait_idle().values())
    # The session goes on with the next utterance index
    s.send(type="input.text", text="After.")
    s.send(type="input.done")
    units = units_of(s.until("session.done"))
    assert [(u["start"]["utterance_index"], u["start"]["sentence_text"]) for u in units] == [(1, "After.")]
    assert len(b"".join(units[0]["frames"])) == frames * FRAME * 2  # the session's config still holds
    s.send(type="input.cancel")
    assert s.recv()[1] == {"type": "error", "message": "No utterance in progress to cancel"}


def test_subprotocol_is_echoed(live_server):
    assert raw_session(live_server.ws_url, subprotocols=["realtime"]).ws.subprotocol == "realtime"


def test_next_unit_synthesizes_while_the_current_one_streams(live_server):
    scheduler = live_server.family.scheduler
    both_open: list[bool] = []
    batch_sizes: list[int] = []

    def hold_first_step(batch):
        # The first unit's first step waits until the second unit's request has joined the scheduler.
        if not both_open:
            deadline = time.monotonic() + 10
            while scheduler.live()["sessions"] < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
            both_open.append(scheduler.live()["sessions"] >= 2)
        batch_sizes.append(len(batch.prefill) + len(batch.decode))

    with step_hook(live_server, hold_first_step):
        s = open_session(live_server.ws_url, voice="ryan", response_format="pcm", split_granularity="sentence")
        s.send(type="input.text", text="The first sentence is the longer one of the two. Second one. ")
        s.send(type="input.done")
        units = units_of(s.until("session.done"))
    texts = [u["start"]["sentence_text"] for u in units]
    assert texts == ["The first sentence is the longer one of the two.", "Second one."]
    assert both_open == [True]
    assert 2 in batch_sizes, batch_sizes  # one batch held both units
    assert len(units[1]["frames"][0]) == TTS_FRAMES * FRAME * 2


def test_buffered_text_is_bounded():
    with running_server(tts_checkpoint(), Settings(max_ws_pending_chars=50)) as live:
        s = open_session(live.ws_url, voice="vivian", response_format="pcm")
        s.send(type="input.text", text="x" * 30)
        s.send(type="input.text", text="y" * 30)
        assert "exceed 50 characters" in s.recv()[1]["message"]
        s.send(type="input.done")
        (unit,) = units_of(s.until("session.done"))
        assert unit["start"]["sentence_text"] == "x" * 30  # the refused text was dropped, the rest kept
