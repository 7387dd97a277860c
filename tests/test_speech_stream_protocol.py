"""WS /v1/audio/speech/stream's protocol as a pure state machine: messages in, actions out, time passed in by hand.

No socket, no engine: the shell's parts (resolving a config, synthesizing a unit) are reported back by hand, as the
shell in realtime/speech/stream.py reports them; the wire is PROTOCOLS.md's.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from omni_stream.errors import UnknownVoiceError
from omni_stream.realtime.common.close_codes import CloseCode
from omni_stream.realtime.settings import Settings
from omni_stream.realtime.speech.params import TextInputMode
from omni_stream.realtime.speech.stream_protocol import (
    CancelUnits,
    Close,
    Dispatch,
    Phase,
    ResolveConfig,
    SendBinary,
    SendText,
    SpeechStreamProtocol,
    UnitSpec,
    UtteranceEnd,
)
from omni_stream.requests import SpeechRequest
from omni_stream.speech.limits import MAX_INPUT_CHARS

SETTINGS = Settings(ws_config_timeout=10.0, ws_idle_timeout=30.0, max_ws_queued_units=3, max_ws_pending_chars=200)


def msg(**body) -> str:
    return json.dumps(body)


def texts(actions) -> list[dict]:
    return [json.loads(a.text) for a in actions if isinstance(a, SendText)]


def new(settings: Settings = SETTINGS, now: float = 0.0) -> SpeechStreamProtocol:
    return SpeechStreamProtocol(settings, models=("tiny",), sample_rate=24000, now=now)


def configured(now: float = 0.0, settings: Settings = SETTINGS, **config) -> SpeechStreamProtocol:
    """A session whose first config the shell resolved (its template is what the engine would have made)."""
    p = new(settings, now)
    (action,) = p.receive_text(msg(type="session.config", voice="alice", **config), now)
    assert isinstance(action, ResolveConfig)
    assert p.config_resolved(action.opts, SpeechRequest("-", voice="alice")) == []
    assert p.phase is Phase.OPEN
    return p


def drain(p: SpeechStreamProtocol) -> list[UnitSpec | UtteranceEnd]:
    items = []
    while (item := p.take()) is not None:
        items.append(item)
    return items


# --- the first message ---


def test_the_first_message_must_be_a_session_config():
    for raw in (msg(type="input.text", text="hi"), "not json", "[1]"):
        p = new()
        actions = p.receive_text(raw, 1.0)
        assert isinstance(actions[0], CancelUnits) and actions[-1] == Close(CloseCode.POLICY)
        (error,) = texts(actions)
        assert error["type"] == "error" and p.phase is Phase.CLOSED
    assert (
        texts(new().receive_text(msg(type="input.text"), 0.0))[0]["message"]
        == "Expected session.config, got: input.text"
    )
    binary = new().receive_binary(0.0)
    assert texts(binary)[0]["message"].startswith("Binary messages are not supported") and binary[-1].code == 1008


def test_a_session_config_must_come_within_the_config_timeout():
    p = new(now=100.0)
    assert p.deadline() == 110.0 and p.timeout(109.9) == []
    actions = p.timeout(110.0)
    assert texts(actions) == [{"type": "error", "message": "Timeout waiting for session.config"}]
    assert actions[-1] == Close(CloseCode.POLICY) and p.deadline() is None


def test_a_config_is_parsed_here_and_resolved_by_the_shell():
    p = new()
    (action,) = p.receive_text(msg(type="session.config", voice="ALICE", response_format="pcm", stream_audio=True), 0)
    assert isinstance(action, ResolveConfig) and action.opts.voice == "alice" and action.opts.stream_audio
    assert p.phase is Phase.CONFIG  # not open until the engine accepted it
    # a field the wire refuses never reaches the shell; the first config refused closes with 1008
    actions = new().receive_text(msg(type="session.config", word_timestamps=True), 0)
    assert "Invalid session config: word_timestamps=true is not supported" in texts(actions)[0]["message"]
    assert actions[-1] == Close(CloseCode.POLICY)
    actions = new().receive_text(msg(type="session.config", model="other"), 0)
    assert texts(actions)[0]["message"] == "Invalid session config: The model `other` does not exist (served: `tiny`)."
    # what the engine refuses, the shell reports back: the same words, and a 1008 close for the first config
    refused = p.config_refused(UnknownVoiceError("Invalid voice 'alice'. Supported: bob", "voice"))
    assert texts(refused) == [
        {"type": "error", "message": "Invalid session config: Invalid voice 'alice'. Supported: bob"}
    ]
    assert refused[-1] == Close(CloseCode.POLICY)


def test_a_later_config_refused_keeps_the_one_before_and_the_session_open():
    p = configured(split_granularity="sentence")
    (action,) = p.receive_text(msg(type="session.config", voice="bob"), 1.0)
    assert isinstance(action, ResolveConfig)
    assert texts(p.config_refused(UnknownVoiceError("Invalid voice 'bob'. Supported: alice", "voice"))) == [
        {"type": "error", "message": "Invalid session config: Invalid voice 'bob'. Supported: alice"}
    ]
    assert p.phase is Phase.OPEN and p.opts is not None and p.opts.voice == "alice"
    # a new config that resolves applies to later units
    template = SpeechRequest("-", voice="bob")
    p.config_resolved(replace(action.opts, split_granularity=p.opts.split_granularity), template)
    p.receive_text(msg(type="input.text", text="One. Two. "), 2.0)
    assert {unit.template.voice for unit in drain(p)} == {"bob"}


# --- text into units ---


def test_units_are_cut_by_sentence_and_queued_in_order_with_their_indices():
    p = configured(split_granularity="sentence")
    assert p.receive_text(msg(type="input.text", text="Hello there. How are"), 1.0) == [Dispatch()]
    assert p.receive_text(msg(type="input.text", text=" you? I am"), 2.0) == [Dispatch()]
    assert p.receive_text(msg(type="input.done"), 3.0) == [Dispatch()]
    items = drain(p)
    assert [(u.utterance, u.sentence, u.text) for u in items[:-1]] == [
        (0, 0, "Hello there."),
        (0, 1, "How are you?"),
        (0, 2, "I am"),
    ]
    assert items[-1] == UtteranceEnd(0, 0) and p.outstanding == 3 and p.utterance == 1 and p.sentence == 0
    for _ in range(3):
        p.unit_finished(3.5)  # the shell spoke them
    assert p.receive_text(msg(type="input.text", text="Next. "), 4.0) == [Dispatch()]
    assert drain(p)[0].utterance == 1


def test_buffered_text_is_one_unit_per_input_done_by_default():
    p = configured()
    assert p.receive_text(msg(type="input.text", text="Hello there. How are you?"), 1.0) == []
    p.receive_text(msg(type="input.done"), 2.0)
    (unit, end) = drain(p)
    assert unit.text == "Hello there. How are you?" and end == UtteranceEnd(0, 0)


def test_commitment_mode_speaks_each_committed_span_as_it_arrives():
    p = configured(text_input_mode="commitment", language="English")
    assert p.opts is not None and p.opts.text_input_mode is TextInputMode.COMMITMENT
    p.receive_text(msg(type="input.text", text="Well, the price is 3"), 1.0)
    assert [u.text for u in drain(p)] == ["Well,"]  # "3" may still become 3.50: held back
    p.receive_text(msg(type="input.text", text=".50 today."), 2.0)
    p.receive_text(msg(type="input.done"), 3.0)
    assert [getattr(i, "text", None) for i in drain(p)] == ["the price is 3.50 today.", None]


def test_more_units_than_the_limit_are_refused_and_the_buffer_is_kept():
    p = configured(split_granularity="sentence")  # max_ws_queued_units=3
    p.receive_text(msg(type="input.text", text="One. Two. Three. "), 1.0)
    assert p.outstanding == 3
    before = p.splitter.pending
    (error,) = texts(p.receive_text(msg(type="input.text", text="Four. "), 2.0))
    assert error["message"].startswith("Too many queued units: 3 waiting and 1 more would pass the limit of 3")
    assert p.splitter.pending == before and p.outstanding == 3 and p.phase is Phase.OPEN
    for unit in drain(p):  # the dispatcher takes them; as each unit ends, room comes back
        assert isinstance(unit, UnitSpec)
        p.unit_finished(3.0)
    assert p.receive_text(msg(type="input.text", text="Four. "), 4.0) == [Dispatch()]


def test_buffered_text_past_its_limit_and_bad_messages_are_errors_that_keep_the_session():
    p = configured()  # max_ws_pending_chars=200
    (error,) = texts(p.receive_text(msg(type="input.text", text="x" * 201), 1.0))
    assert error["message"] == "Buffered text would exceed 200 characters: send input.done first"
    assert texts(p.receive_text(msg(type="nope"), 1.0)) == [{"type": "error", "message": "Unknown message type: nope"}]
    (error,) = texts(p.receive_text(msg(type="input.text", text=5), 1.0))
    assert error["message"] == "input.text: 'text' must be a string, got integer"
    assert texts(p.receive_binary(1.0))[0]["message"].startswith("Binary messages are not supported")
    assert p.phase is Phase.OPEN


def test_a_config_is_refused_while_an_utterance_is_open():
    p = configured()
    p.receive_text(msg(type="input.text", text="Half a"), 1.0)
    (error,) = texts(p.receive_text(msg(type="session.config", voice="bob"), 2.0))
    assert error["message"].startswith("session.config cannot be applied while an utterance is in progress")


# --- what the client reads of each unit ---


def test_each_unit_is_announced_sent_and_done_then_its_utterance():
    p = configured(response_format="pcm", stream_audio=True, sample_rate=16000)
    p.receive_text(msg(type="input.text", text="Hi."), 1.0)
    p.receive_text(msg(type="input.done"), 1.0)
    unit, end = drain(p)
    (start,) = texts(p.unit_started(unit))
    assert start == {
        "type": "audio.start", "utterance_index": 0, "sentence_index": 0, "sentence_text": "Hi.",
        "format": "pcm", "sample_rate": 16000, "channels": 1,
    }  # fmt: skip
    assert p.unit_audio(b"\x01\x02") == [SendBinary(b"\x01\x02")]
    assert texts(p.unit_done(unit, 2, None, cancelled=False)) == [
        {"type": "audio.done", "utterance_index": 0, "sentence_index": 0, "total_bytes": 2, "error": False}
    ]
    p.unit_finished(2.0)
    assert texts(p.utterance_done(end)) == [{"type": "session.done", "utterance_index": 0, "total_sentences": 1}]
    assert not p.in_utterance


def test_a_failed_unit_says_so_and_what_to_do_with_audio_already_sent():
    p = configured()
    p.receive_text(msg(type="input.text", text="Hi."), 1.0)
    p.receive_text(msg(type="input.done"), 1.0)
    unit, _ = drain(p)
    error, done = texts(p.unit_done(unit, 100, "Internal server error: boom", cancelled=False))
    assert error == {
        "type": "error",
        "message": "Generation failed for utterance 0, sentence 0: Internal server error: boom",
        "partial_audio": True,
        "action": "discard",
    }
    assert done["error"] is True and done["total_bytes"] == 100
    (error, _) = texts(p.unit_done(unit, 0, "x", cancelled=False))
    assert "partial_audio" not in error  # nothing was sent: nothing to discard


# --- input.cancel ---


def test_cancel_drops_queued_units_stops_those_in_flight_and_ends_the_utterance():
    p = configured(split_granularity="sentence")
    p.receive_text(msg(type="input.text", text="One. Two. Three"), 1.0)
    first = p.take()
    assert isinstance(first, UnitSpec)
    p.unit_started(first)  # the first unit is streaming; "Two." waits in the queue
    actions = p.receive_text(msg(type="input.cancel"), 2.0)
    assert actions == [CancelUnits(), Dispatch()]
    queued, end = drain(p)
    assert isinstance(queued, UnitSpec) and not p.current(queued) and not p.current(first)
    assert end == UtteranceEnd(0, 1, cancelled=True) and p.splitter.pending == ""
    assert texts(p.unit_done(first, 10, None, cancelled=True))[0]["cancelled"] is True
    (done,) = texts(p.utterance_done(end))
    assert done == {"type": "session.done", "utterance_index": 0, "total_sentences": 1, "cancelled": True}
    # the next utterance is a new one, spoken as usual
    p.receive_text(msg(type="input.text", text="Again. "), 3.0)
    unit = p.take()
    assert isinstance(unit, UnitSpec) and unit.utterance == 1 and p.current(unit)


def test_cancel_with_nothing_in_progress_is_an_error():
    p = configured()
    assert texts(p.receive_text(msg(type="input.cancel"), 1.0)) == [
        {"type": "error", "message": "No utterance in progress to cancel"}
    ]


def test_an_utterance_ended_before_a_cancel_is_not_called_cancelled():
    p = configured()
    p.receive_text(msg(type="input.text", text="Hi."), 1.0)
    p.receive_text(msg(type="input.done"), 1.0)
    _, end = drain(p)
    assert p.receive_text(msg(type="input.cancel"), 2.0) == [CancelUnits()]  # its unit is still outstanding
    assert texts(p.utterance_done(end))[0]["cancelled"] is True  # queued before the cancel: the epoch says so


# --- how a session ends ---


def test_idle_sessions_close_but_synthesizing_counts_as_activity():
    p = configured(now=0.0)
    assert p.deadline() == 30.0 and p.timeout(29.0) == []
    p.receive_text(msg(type="input.text", text="Hi."), 10.0)
    p.receive_text(msg(type="input.done"), 10.0)
    drain(p)
    assert p.deadline() == 40.0
    assert p.timeout(40.0) == [] and p.deadline() == 70.0  # a unit is still synthesizing: not idle
    p.unit_finished(50.0)
    assert p.deadline() == 80.0 and p.timeout(79.0) == []
    actions = p.timeout(80.0)
    assert texts(actions) == [{"type": "error", "message": "Idle timeout: no message received"}]
    assert actions[-1] == Close(CloseCode.NORMAL) and p.phase is Phase.CLOSED


def test_session_close_drains_the_queue_then_closes_normally():
    p = configured(split_granularity="sentence")
    p.receive_text(msg(type="input.text", text="One. Two. "), 1.0)
    assert p.receive_text(msg(type="session.close"), 2.0) == [Dispatch()]
    assert p.phase is Phase.DRAINING and p.deadline() is None and not p.drained
    assert p.receive_text(msg(type="input.text", text="Ignored. "), 3.0) == []  # nothing is read any more
    assert len(drain(p)) == 2 and p.drained
    assert p.drained_close() == [CancelUnits(), Close(CloseCode.NORMAL)]


def test_shutdown_failure_and_disconnect():
    p = configured()
    actions = p.shutdown()
    assert actions[0] == CancelUnits() and actions[-1] == Close(CloseCode.GOING_AWAY)
    assert texts(actions) == [{"type": "error", "message": "Server shutting down"}]
    assert p.shutdown() == [] and p.failed(RuntimeError("x")) == []  # closed once
    actions = configured().failed(RuntimeError("sender broke"))
    assert texts(actions) == [{"type": "error", "message": "Internal error: sender broke"}]
    assert actions[-1] == Close(CloseCode.INTERNAL)
    p = configured()
    p.receive_text(msg(type="input.text", text="half"), 1.0)
    assert p.disconnected() == [CancelUnits()] and p.in_utterance  # left mid-utterance: counted by the shell
    assert p.receive_text(msg(type="input.done"), 2.0) == [] and p.unit_audio(b"x") == []


@pytest.mark.parametrize("granularity", ["sentence", "clause"])
def test_every_unit_of_a_long_text_fits_the_speech_models_input(granularity):
    p = configured(split_granularity=granularity, settings=replace(SETTINGS, max_ws_pending_chars=10_000))
    p.receive_text(msg(type="input.text", text="word " * 600), 1.0)
    p.receive_text(msg(type="input.done"), 1.0)
    units = [i for i in drain(p) if isinstance(i, UnitSpec)]
    assert len(units) >= 3 and all(0 < len(u.text) <= MAX_INPUT_CHARS for u in units)
