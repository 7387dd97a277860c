"""The realtime session's state machine, without a server: client events and engine results in, events out."""

from __future__ import annotations

import base64
import functools
import itertools
import json
from dataclasses import replace

import numpy as np
import pytest
from realtime_doubles import EnergyVad, energy_vad, spoken_words
from turn_driver import SyncTurns

from omni_stream.codecs.g711 import ulaw_encode
from omni_stream.family import SpeechInfo
from omni_stream.models.smart_turn import load_smart_turn
from omni_stream.realtime.agent.events import RealtimeError, SessionType, parse_client_event
from omni_stream.realtime.agent.outputs import (
    AdoptResponse,
    CancelResponse,
    CancelTranscription,
    Capabilities,
    Close,
    ConfigureTurns,
    DetectTurns,
    Limits,
    Outputs,
    ResponseUsage,
    StartResponse,
    Transcribe,
)
from omni_stream.realtime.agent.protocol import RealtimeProtocol
from omni_stream.requests import Role
from omni_stream.turns.detector import TurnEvent, TurnEventKind
from omni_stream.turns.rules import EAGERNESS, Eagerness
from omni_stream.validation.language import resolve_language
from omni_stream.validation.voices import voice_name

# The engine's voice lookup (AsyncEngine.voice) for a speech model with two voices.
VOICES = functools.partial(voice_name, SpeechInfo("m", "synthetic_tts", "speech", voices=("alice", "bob")), None)
CAPS = Capabilities(
    model="m", voice=VOICES, default_voice="alice", speech=True, text=True, transcription=True, vad=True
)


def make(caps: Capabilities = CAPS, limits: Limits | None = None, vad: bool = True, **kw) -> RealtimeProtocol:
    counter = itertools.count(1)
    caps = replace(caps, vad=caps.vad and vad)
    proto = RealtimeProtocol(caps, limits, ids=lambda p: f"{p}_{next(counter)}", **kw)
    # the driver lives on the protocol (a cycle the collector frees with it: no detector outlives its test)
    proto.turns = SyncTurns(proto, energy_vad, load_smart_turn() if caps.semantic else None)  # type: ignore[attr-defined]
    driver(proto).run(proto.start())
    return proto


def driver(proto: RealtimeProtocol) -> SyncTurns:
    return proto.turns  # type: ignore[attr-defined]


def send(proto: RealtimeProtocol, **event) -> Outputs:
    """Parse ``event`` as the wire would carry it and apply it (parse errors become error events); the turn
    detector's part runs as the session driver would run it."""
    try:
        parsed = parse_client_event(json.dumps(event))
    except RealtimeError as exc:
        return proto.refuse(exc)
    return driver(proto).run(proto.receive(parsed))


def types(out: Outputs) -> list[str]:
    return [e.type for e in out.events]


def error_of(out: Outputs) -> dict:
    assert types(out) == ["error"], types(out)
    return out.events[0].body["error"]


def b64(samples: np.ndarray) -> str:
    return base64.b64encode(samples.astype("<i2").tobytes()).decode()


def manual(proto: RealtimeProtocol) -> None:
    out = send(proto, type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
    assert types(out) == ["session.updated"]


def one_second(value: int = 1000) -> np.ndarray:
    return np.full(24000, value, np.int16)


def test_a_new_session_starts_with_session_and_conversation_created():
    proto = RealtimeProtocol(CAPS)
    out = proto.start()
    assert types(out) == ["session.created", "conversation.created"]
    session = out.events[0].body["session"]
    assert session["object"] == "realtime.session" and session["id"].startswith("sess_")
    assert session["type"] == "realtime" and session["audio"]["output"]["voice"] == "alice"
    assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    ids = [e.event_id for e in out.events]
    assert len(set(ids)) == 2


def test_without_a_detector_turn_detection_defaults_to_manual_and_server_vad_is_refused():
    proto = make(vad=False)
    assert proto.session_wire()["audio"]["input"]["turn_detection"] is None
    out = send(proto, type="session.update", session={"audio": {"input": {"turn_detection": {"type": "server_vad"}}}})
    err = error_of(out)
    assert err["code"] == "invalid_value" and err["param"] == "session.audio.input.turn_detection"


@pytest.mark.parametrize(
    ("fmt", "param"),
    [
        ({"type": "audio/pcm", "rate": 16000}, "session.audio.input.format.rate"),
        ({"type": "audio/opus"}, "session.audio.input.format.type"),
    ],
)
def test_unsupported_audio_formats_are_refused_with_their_param(fmt, param):
    proto = make()
    err = error_of(send(proto, type="session.update", event_id="e1", session={"audio": {"input": {"format": fmt}}}))
    assert err["code"] == "unsupported_audio_format" and err["param"] == param and err["event_id"] == "e1"
    assert proto.config.input_format.value == "audio/pcm"  # nothing changed


def test_session_update_merges_fields_and_validates_the_voice():
    proto = make()
    out = send(
        proto,
        type="session.update",
        session={"instructions": "Be brief.", "audio": {"output": {"voice": "BOB", "format": {"type": "audio/pcmu"}}}},
    )
    session = out.events[0].body["session"]
    assert session["instructions"] == "Be brief." and session["audio"]["output"]["voice"] == "bob"
    assert session["audio"]["output"]["format"] == {"type": "audio/pcmu"}
    assert session["audio"]["input"]["turn_detection"] is not None  # untouched
    err = error_of(send(proto, type="session.update", session={"audio": {"output": {"voice": "zed"}}}))
    assert err["param"] == "session.audio.output.voice" and "alice" in err["message"]
    # OpenAI's own voice names (the Agents SDK sends "ash" unless told otherwise): the model's default voice, so the
    # update's instructions and tools are not refused with it
    out = send(proto, type="session.update", session={"instructions": "Hi.", "audio": {"output": {"voice": "ash"}}})
    assert types(out) == ["session.updated"] and out.events[0].body["session"]["audio"]["output"]["voice"] == "alice"
    assert proto.config.instructions == "Hi."
    err = error_of(
        send(proto, type="session.update", session={"audio": {"input": {"turn_detection": {"threshold": 2}}}})
    )
    assert err["param"] == "session.audio.input.turn_detection.threshold"


def test_unknown_session_fields_are_refused_and_a_session_sent_back_as_it_came_is_taken():
    proto = make()
    for session, param in (
        ({"temperature": "hot"}, "session.temperature"),  # the beta session's field: not in the GA session
        ({"bogus": 1}, "session.bogus"),
        ({"audio": {"output": {"volume": 3}}}, "session.audio.output.volume"),
        ({"audio": {"input": {"vad": {}}}}, "session.audio.input.vad"),
    ):
        err = error_of(send(proto, type="session.update", session=session))
        assert err["code"] == "unknown_parameter" and err["param"] == param, err
        beta = " (the GA API has no such field)" if param == "session.temperature" else ""
        assert err["message"] == f"Unknown parameter: '{param}'{beta}."
    created = proto.session_wire()  # what session.created showed, every field of it
    out = send(proto, type="session.update", session=created)
    assert types(out) == ["session.updated"] and out.events[0].body["session"] == created


def test_a_transcription_language_the_model_does_not_know_is_refused_at_the_update():
    def knows(language: str | None) -> None:  # the ASR model's check (WhisperFamily.check_language's contract)
        resolve_language(language, ("en", "fr"))

    proto = make(caps=replace(CAPS, language=knows))
    err = error_of(send(proto, type="session.update", session={"audio": {"input": {"transcription": {
        "model": "whisper", "language": "xx"}}}}))  # fmt: skip
    assert err["code"] == "invalid_value" and err["param"] == "session.audio.input.transcription.language"
    assert "'xx'" in err["message"] and "fr" in err["message"]
    assert proto.config.transcription is None  # the refused update changed nothing
    out = send(proto, type="session.update", session={"audio": {"input": {"transcription": {"language": "FR"}}}})
    assert out.events[0].type == "session.updated" and proto.config.transcription.language == "FR"


@pytest.mark.parametrize(
    ("raw", "code", "param"),
    [
        ("{not json", "invalid_json", None),
        ("[1, 2]", "invalid_json", None),
        ('{"type": "foo"}', "unknown_event", "type"),
        ('{"type": "input_audio_buffer.append", "audio": "@@@@"}', "invalid_value", "audio"),
        ('{"type": "input_audio_buffer.append", "audio": 5}', "invalid_value", "audio"),
        ('{"type": "conversation.item.truncate", "item_id": "x", "audio_end_ms": -1}', "invalid_value", "audio_end_ms"),
        ('{"type": "response.create", "response": {"conversation": "x"}}', "invalid_value", "response.conversation"),
    ],
)
def test_bad_messages_get_an_error_with_a_code(raw, code, param):
    proto = make()
    with pytest.raises(RealtimeError) as info:
        parse_client_event(raw)
    err = error_of(proto.refuse(info.value))
    assert (err["code"], err["param"]) == (code, param)
    assert err["message"]


def test_an_append_over_the_size_limit_is_refused():
    with pytest.raises(RealtimeError) as info:
        parse_client_event(json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 40}), max_append_bytes=16)
    assert info.value.code == "invalid_value" and info.value.param == "audio" and "MiB" in info.value.message


def test_odd_pcm_byte_counts_and_empty_commits_are_errors_and_the_session_stays_usable():
    proto = make()
    manual(proto)
    err = error_of(send(proto, type="input_audio_buffer.append", audio=base64.b64encode(b"abc").decode()))
    assert err["code"] == "invalid_value" and "16-bit" in err["message"]
    assert error_of(send(proto, type="input_audio_buffer.commit"))["code"] == "input_audio_buffer_commit_empty"
    assert error_of(send(proto, type="response.cancel"))["code"] == "response_cancel_not_active"
    assert types(send(proto, type="input_audio_buffer.append", audio=b64(one_second()))) == []
    out = send(proto, type="input_audio_buffer.commit")
    assert types(out) == ["input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"]


def test_the_input_buffer_is_bounded_and_an_overflow_appends_nothing():
    proto = make(limits=Limits(max_buffer_seconds=1.5))
    manual(proto)
    assert types(send(proto, type="input_audio_buffer.append", audio=b64(one_second()))) == []
    err = error_of(send(proto, type="input_audio_buffer.append", audio=b64(one_second())))
    assert err["code"] == "input_audio_buffer_overflow"
    assert proto.buffer.length == 24000
    assert types(send(proto, type="input_audio_buffer.clear")) == ["input_audio_buffer.cleared"]
    assert proto.buffer.length == 0


def run_manual_turn(proto: RealtimeProtocol) -> tuple[str, str]:
    """Commit one second of audio, ask for a response, finish the transcription; (item id, response id)."""
    send(proto, type="input_audio_buffer.append", audio=b64(one_second()))
    out = send(proto, type="input_audio_buffer.commit")
    item_id = out.events[0].body["item_id"]
    [transcribe] = out.commands
    assert isinstance(transcribe, Transcribe) and transcribe.samples.size == 24000 and not transcribe.speculative
    out = send(proto, type="response.create")
    assert types(out) == ["response.created"]  # its message item comes with its first content (as OpenAI's does)
    assert out.commands == []  # the transcript is not in yet
    rid = out.events[0].body["response"]["id"]
    proto.transcription_delta(item_id, 0, "three")
    out = proto.transcription_done(item_id, 0, 50, 1)
    assert types(out) == ["conversation.item.input_audio_transcription.completed"]
    [start] = out.commands
    assert isinstance(start, StartResponse) and start.response_id == rid and start.speak and start.voice == "alice"
    assert [(m.role, m.content) for m in start.messages][-1] == (Role.USER, "three")
    assert start.messages[0].role is Role.SYSTEM
    return item_id, rid


def test_a_manual_turn_runs_the_full_response_event_sequence():
    proto = make()
    manual(proto)
    _, rid = run_manual_turn(proto)
    assert types(proto.response_transcript(rid, "Three.")) == [
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
        "response.output_audio_transcript.delta",
    ]
    audio = proto.response_audio(rid, np.full(2400, 0.5, np.float32))
    assert types(audio) == ["response.output_audio.delta"] and len(audio.events[0].audio) == 4800
    assert types(proto.response_transcript(rid, "Again.")) == ["response.output_audio_transcript.delta"]
    out = proto.response_done(rid, ResponseUsage(10, 2, 5))
    assert types(out) == [
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    assert out.events[1].body["transcript"] == "Three. Again."
    response = out.events[-1].body["response"]
    assert response["status"] == "completed" and response["usage"]["total_tokens"] == 17
    assert response["output"][0]["content"][0] == {"type": "output_audio", "transcript": "Three. Again."}
    assert proto.response is None
    assert proto.response_audio(rid, np.ones(10, np.float32)).events == []  # nothing after response.done


def test_a_second_response_while_one_is_active_is_refused():
    proto = make()
    manual(proto)
    _, rid = run_manual_turn(proto)
    assert error_of(send(proto, type="response.create"))["code"] == "conversation_already_has_active_response"
    wrong = error_of(send(proto, type="response.cancel", response_id="resp_other"))  # one runs: not "no response"
    assert wrong["code"] == "response_cancel_not_active" and wrong["param"] == "response_id", wrong
    assert "'resp_other' is not in progress" in wrong["message"] and rid in wrong["message"]
    out = send(proto, type="response.cancel", response_id=rid)
    assert out.commands == [CancelResponse(rid)]
    done = out.events[-1].body["response"]
    assert done["status"] == "cancelled" and done["status_details"] == {
        "type": "cancelled",
        "reason": "client_cancelled",
    }


def test_item_content_types_by_role_and_metadata_bounds():
    proto = make()
    # the beta API's assistant text ("text") is an assistant's output text
    out = send(proto, type="conversation.item.create",
               item={"role": "assistant", "content": [{"type": "text", "text": "Hello."}]})  # fmt: skip
    assert types(out) == ["conversation.item.added", "conversation.item.done"]
    assert out.events[0].body["item"]["content"][0]["type"] == "output_text"
    err = error_of(send(proto, type="conversation.item.create",
                        item={"role": "assistant", "content": [{"type": "input_audio", "audio": ""}]}))  # fmt: skip
    assert "an assistant item cannot hold 'input_audio' content (it takes output_text, output_audio)" in err["message"]
    assert err["param"] == "item.content[0].type"
    for metadata in ({"k": "v" * 513}, {"k" * 65: "v"}):  # OpenAI's bounds: keys of 64, values of 512 characters
        err = error_of(send(proto, type="response.create", response={"metadata": metadata}))
        assert err["param"] == "response.metadata" and "512" in err["message"], err


def test_text_only_output_streams_text_deltas():
    proto = make()
    manual(proto)
    send(proto, type="session.update", session={"output_modalities": ["text"]})
    send(
        proto, type="conversation.item.create", item={"role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    )
    out = send(proto, type="response.create")
    [start] = out.commands
    assert not start.speak and start.messages[-1].content == "hi"
    first = proto.response_text(start.response_id, "hi")
    assert types(first)[-1] == "response.output_text.delta" and types(first).count("response.output_item.added") == 1
    assert first.events[2].body["part"] == {"type": "text", "text": ""}  # the item and its part, then the delta
    assert types(proto.response_text(start.response_id, "!")) == ["response.output_text.delta"]
    out = proto.response_done(start.response_id, ResponseUsage(3, 1))
    assert types(out)[0] == "response.output_text.done" and out.events[0].body["text"] == "hi!"


def test_max_output_tokens_reached_ends_the_response_incomplete():
    proto = make()
    send(
        proto,
        type="conversation.item.create",
        item={"role": "user", "content": [{"type": "input_text", "text": "a b"}]},
    )
    out = send(proto, type="response.create", response={"max_output_tokens": 1})
    [start] = out.commands
    assert start.max_tokens == 1
    done = proto.response_done(start.response_id, ResponseUsage(3, 1)).events[-1].body["response"]
    assert done["status"] == "incomplete" and done["status_details"]["reason"] == "max_output_tokens"


def feed(proto: RealtimeProtocol, samples: np.ndarray, chunk: int = 2400) -> Outputs:
    out = Outputs()
    for i in range(0, samples.size, chunk):
        out.extend(send(proto, type="input_audio_buffer.append", audio=b64(samples[i : i + chunk])))
    return out


def test_server_vad_detects_a_turn_commits_it_and_answers_once_transcribed():
    proto = make()
    out = feed(proto, spoken_words(["three", "five"]))
    assert types(out) == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
        "response.created",
    ]
    started, stopped = out.events[0].body, out.events[1].body
    assert started["audio_start_ms"] == 300 and stopped["audio_end_ms"] == 300 + 1000
    assert started["item_id"] == stopped["item_id"] == out.events[2].body["item_id"]
    item_id = out.events[2].body["item_id"]
    # a speculative transcription at each pause: the one at the gap between the words was cancelled when speech
    # resumed; the one at the last pause transcribed exactly the committed audio and became the item's
    first, cancel, last = out.commands
    assert isinstance(first, Transcribe) and isinstance(last, Transcribe)
    assert cancel == CancelTranscription(first.item_id) and item_id not in (first.item_id, last.item_id)
    # the turn's audio: from the start less prefix_padding_ms (300) to the stop
    assert last.samples.size == 24000 * 1300 // 1000 and first.samples.size < last.samples.size
    assert proto.transcription_delta(first.item_id, 0, "stale") == Outputs()  # a dropped speculation says nothing
    delta = proto.transcription_delta(last.item_id, 0, "three five")
    assert types(delta) == ["conversation.item.input_audio_transcription.delta"]
    assert delta.events[0].body["item_id"] == item_id
    done = proto.transcription_done(last.item_id, 0, 1, 1)
    assert done.events[0].body["transcript"] == "three five" and done.events[0].body["item_id"] == item_id
    assert isinstance(done.commands[0], StartResponse)


def test_while_nobody_speaks_the_buffer_keeps_only_the_lookback():
    proto = make(limits=Limits(vad_lookback_ms=200))
    feed(proto, np.zeros(24000 * 5, np.int16))
    assert proto.buffer.length <= 24000 * (300 + 200) // 1000 + 2400


def test_barge_in_cancels_the_running_response_and_truncates_it_to_the_audio_sent():
    proto = make()
    out = feed(proto, spoken_words(["three"]))
    [transcribe] = out.commands
    [start] = proto.transcription_done(transcribe.item_id, 0, 1, 1).commands
    rid = start.response_id
    proto.response_transcript(rid, "Three.")
    proto.response_audio(rid, np.zeros(12000, np.float32))  # 500 ms sent
    proto.response_transcript(rid, "Never heard.")
    out = feed(proto, spoken_words(["four"], tail_ms=0)[: 24000 * 500 // 1000])
    assert types(out)[0] == "input_audio_buffer.speech_started"
    assert CancelResponse(rid) in out.commands
    done = out.events[-1].body["response"]
    assert types(out)[-1] == "response.done" and done["status"] == "cancelled"
    assert done["status_details"]["reason"] == "turn_detected"
    item = proto.conversation.get(done["output"][0]["id"])
    assert item.content[0].audio_ms == 500 and item.status.value == "incomplete"
    assert proto.response_audio(rid, np.ones(100, np.float32)).events == []
    assert proto.response_done(rid, ResponseUsage()).events == []


def test_truncate_cuts_the_transcript_to_the_units_heard():
    proto = make()
    manual(proto)
    _, rid = run_manual_turn(proto)
    proto.response_transcript(rid, "One.")
    proto.response_audio(rid, np.zeros(24000, np.float32))
    proto.response_transcript(rid, "Two.")
    proto.response_audio(rid, np.zeros(24000, np.float32))
    done = proto.response_done(rid, ResponseUsage()).events[-1].body["response"]
    item_id = done["output"][0]["id"]
    err = error_of(send(proto, type="conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=2500))
    assert err["param"] == "audio_end_ms"
    out = send(proto, type="conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=800)
    assert types(out) == ["conversation.item.truncated"] and out.events[0].body["audio_end_ms"] == 800
    retrieved = send(proto, type="conversation.item.retrieve", item_id=item_id).events[0].body["item"]
    assert retrieved["content"][0]["transcript"] == "One."
    err = error_of(send(proto, type="conversation.item.truncate", item_id="nope", content_index=0, audio_end_ms=1))
    assert err["param"] == "item_id"


def test_a_refused_truncate_of_the_running_response_leaves_it_running():
    proto = make()
    manual(proto)
    _, rid = run_manual_turn(proto)
    proto.response_transcript(rid, "One.")
    proto.response_audio(rid, np.zeros(2400, np.float32))  # 100 ms so far
    item_id = proto.response.item.id
    out = send(proto, type="conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=99999)
    assert types(out) == ["error"] and out.commands == [] and out.events[0].body["error"]["param"] == "audio_end_ms"
    assert proto.response is not None and proto.response.id == rid  # still running: its response.done will come
    assert types(proto.response_done(rid, ResponseUsage()))[-1] == "response.done"
    # a truncate within the audio cancels it, then truncates
    _, rid = run_manual_turn(proto)
    proto.response_audio(rid, np.zeros(2400, np.float32))
    item_id = proto.response.item.id
    out = send(proto, type="conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=50)
    assert CancelResponse(rid) in out.commands and types(out)[-1] == "conversation.item.truncated"
    assert proto.response is None


def test_items_can_be_created_inserted_retrieved_and_deleted():
    proto = make()
    text = {"role": "user", "content": [{"type": "input_text", "text": "first"}]}
    out = send(proto, type="conversation.item.create", item={**text, "id": "a"})
    assert types(out) == ["conversation.item.added", "conversation.item.done"]
    send(proto, type="conversation.item.create", item={**text, "id": "b"}, previous_item_id="root")
    assert [i.id for i in proto.conversation.items] == ["b", "a"]
    err = error_of(send(proto, type="conversation.item.create", item=text, previous_item_id="zz"))
    assert err["param"] == "previous_item_id"
    err = error_of(send(proto, type="conversation.item.create", item={**text, "id": "a"}))
    assert err["param"] == "item.id"
    bad = {"role": "assistant", "content": [{"type": "input_audio", "audio": ""}]}
    assert error_of(send(proto, type="conversation.item.create", item=bad))["code"] == "invalid_value"
    assert types(send(proto, type="conversation.item.delete", item_id="b")) == ["conversation.item.deleted"]
    assert error_of(send(proto, type="conversation.item.delete", item_id="b"))["param"] == "item_id"


def test_a_user_audio_item_is_decoded_in_the_session_format_and_transcribed():
    proto = make()
    send(proto, type="session.update", session={"audio": {"input": {"format": {"type": "audio/pcmu"}}}})
    mu = ulaw_encode(np.full(8000, 2000, np.int16)).tobytes()  # 1 s at 8 kHz
    item = {"role": "user", "content": [{"type": "input_audio", "audio": base64.b64encode(mu).decode()}]}
    out = send(proto, type="conversation.item.create", item=item)
    [transcribe] = out.commands
    assert abs(transcribe.samples.size - 24000) <= 3
    assert abs(int(np.median(transcribe.samples)) - 2000) < 64


def test_g711_input_is_resampled_to_24_khz_and_output_encoded_at_8_khz():
    proto = make()
    fmt = {"type": "audio/pcmu"}
    send(proto, type="session.update", session={"audio": {"input": {"format": fmt, "turn_detection": None}}})
    send(proto, type="session.update", session={"audio": {"output": {"format": fmt}}})
    mu = ulaw_encode(np.zeros(8000, np.int16)).tobytes()
    send(proto, type="input_audio_buffer.append", audio=base64.b64encode(mu).decode())
    assert 24000 - proto.buffer.length <= 200  # the resampler holds its look-ahead back
    send(
        proto, type="conversation.item.create", item={"role": "user", "content": [{"type": "input_text", "text": "x"}]}
    )
    [start] = send(proto, type="response.create").commands
    out = proto.response_audio(start.response_id, np.zeros(2400, np.float32))
    assert 700 <= len(out.events[-1].audio) <= 800  # 100 ms at 8 kHz, one byte a sample (after the item's opening)


@pytest.mark.parametrize("ms", [100, 104])
def test_a_manual_commit_of_g711_audio_holds_all_of_it(ms):
    """The resampler's held-back look-ahead is the committed turn's (it was refused as 95.5 ms of 100 ms)."""
    proto = make()
    fmt = {"type": "audio/pcmu"}
    send(proto, type="session.update", session={"audio": {"input": {"format": fmt, "turn_detection": None}}})
    mu = ulaw_encode(np.full(8 * ms, 1000, np.int16)).tobytes()
    send(proto, type="input_audio_buffer.append", audio=base64.b64encode(mu).decode())
    out = send(proto, type="input_audio_buffer.commit")
    assert types(out)[0] == "input_audio_buffer.committed"
    [transcribe] = out.commands
    assert abs(transcribe.samples.size - 24 * ms) <= 3 and proto.buffer.length == 0
    # a commit refused as too short changes nothing: the audio goes on as one stream into the next commit
    half = ulaw_encode(np.full(8 * 40, 1000, np.int16)).tobytes()  # 40 ms
    send(proto, type="input_audio_buffer.append", audio=base64.b64encode(half).decode())
    assert error_of(send(proto, type="input_audio_buffer.commit"))["code"] == "input_audio_buffer_commit_empty"
    send(proto, type="input_audio_buffer.append", audio=base64.b64encode(mu).decode())
    [joined] = send(proto, type="input_audio_buffer.commit").commands
    assert abs(joined.samples.size - 24 * (40 + ms)) <= 3
    assert np.abs(joined.samples[240:-240].astype(int) - 1000).max() < 64  # no seam where the refusal was
    # the next turn starts afresh: a clear drops what was appended, look-ahead included
    send(proto, type="input_audio_buffer.append", audio=base64.b64encode(mu).decode())
    send(proto, type="input_audio_buffer.clear")
    send(proto, type="input_audio_buffer.append", audio=base64.b64encode(mu).decode())
    [transcribe] = send(proto, type="input_audio_buffer.commit").commands
    assert abs(transcribe.samples.size - 24 * ms) <= 3


def test_the_item_limit_drops_the_oldest_items_visibly():
    proto = make(limits=Limits(max_items=2))
    for i in range(3):
        item = {"id": f"i{i}", "role": "user", "content": [{"type": "input_text", "text": str(i)}]}
        out = send(proto, type="conversation.item.create", item=item)
    assert types(out)[0] == "conversation.item.deleted" and out.events[0].body["item_id"] == "i0"
    assert [i.id for i in proto.conversation.items] == ["i1", "i2"]


def test_a_transcription_session_transcribes_turns_and_makes_no_responses():
    proto = make(session_type=SessionType.TRANSCRIPTION)
    assert proto.session_wire()["type"] == "transcription"
    out = feed(proto, spoken_words(["two"]))
    assert "response.created" not in types(out)
    [transcribe] = out.commands
    assert types(proto.transcription_delta(transcribe.item_id, 0, "two")) == [
        "conversation.item.input_audio_transcription.delta"
    ]
    done = proto.transcription_done(transcribe.item_id, 0, 1, 1)
    assert done.events[0].body["transcript"] == "two" and done.commands == []
    assert error_of(send(proto, type="response.create"))["param"] == "session.type"


def test_without_an_asr_model_a_committed_turn_reports_a_failed_transcription():
    proto = make(caps=Capabilities(speech=True, text=True, voice=VOICES, default_voice="alice"), vad=False)
    send(proto, type="input_audio_buffer.append", audio=b64(one_second()))
    out = send(proto, type="input_audio_buffer.commit")
    assert types(out)[-1] == "conversation.item.input_audio_transcription.failed"
    assert out.events[-1].body["error"]["code"] == "transcription_unavailable"


def test_expiry_sends_session_expired_closes_and_ignores_later_events():
    proto = make(limits=Limits(session_seconds=5))
    out = proto.expire()
    assert error_of(Outputs(out.events))["code"] == "session_expired"
    assert out.commands == [Close(1000, "session expired")]
    assert send(proto, type="input_audio_buffer.clear").events == []
    assert proto.buffer.length == 0


def test_close_forgets_the_buffer_and_later_turn_events():
    proto = make()
    feed(proto, spoken_words(["three"], tail_ms=0)[:12000])
    detector = driver(proto).detector
    assert detector is not None and isinstance(detector.vad, EnergyVad) and detector.vad.held()
    assert proto.buffer.length
    proto.close()
    assert proto.buffer.length == 0
    assert proto.turn_event(proto.turn_epoch, driver(proto).events[0]) == Outputs()


def test_semantic_vad_is_configured_reported_and_handed_to_the_driver():
    proto = make(caps=replace(CAPS, semantic=True))
    semantic = {"type": "semantic_vad", "eagerness": "high"}
    out = proto.receive(
        parse_client_event(
            json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": semantic}}}})
        )
    )
    assert types(out) == ["session.updated"]
    td = out.events[0].body["session"]["audio"]["input"]["turn_detection"]
    assert td == {"type": "semantic_vad", "eagerness": "high", "create_response": True, "interrupt_response": True}
    [configure] = out.commands
    assert isinstance(configure, ConfigureTurns) and configure.epoch == proto.turn_epoch
    rule = configure.turn_detection.rule
    assert rule.semantic and rule.threshold == EAGERNESS[Eagerness.HIGH].threshold
    append = {"type": "input_audio_buffer.append", "audio": b64(one_second())}
    appended = proto.receive(parse_client_event(json.dumps(append)))
    [detect] = appended.commands
    assert isinstance(detect, DetectTurns) and detect.samples.size == 24000 and detect.epoch == proto.turn_epoch
    # a stale detector's events (before a clear restarted it) change nothing
    old = proto.turn_epoch
    cleared = send(proto, type="input_audio_buffer.clear")
    assert types(cleared) == ["input_audio_buffer.cleared"] and proto.turn_epoch == old + 1
    assert proto.turn_event(old, TurnEvent(TurnEventKind.STARTED, 0)) == Outputs()


@pytest.mark.parametrize(
    ("turn_detection", "param"),
    [
        ({"type": "semantic_vad", "eagerness": "eager"}, "session.audio.input.turn_detection.eagerness"),
        ({"type": "semantic_vad", "eagerness": 3}, "session.audio.input.turn_detection.eagerness"),
        ({"type": "semantic_vad", "silence_duration_ms": 3}, "session.audio.input.turn_detection.silence_duration_ms"),
        ({"type": "smart_vad"}, "session.audio.input.turn_detection.type"),
    ],
)
def test_bad_semantic_vad_values_are_errors_naming_the_field(turn_detection, param):
    proto = make(caps=replace(CAPS, semantic=True))
    before = proto.config
    err = error_of(send(proto, type="session.update", session={"audio": {"input": {"turn_detection": turn_detection}}}))
    unknown = param.endswith("silence_duration_ms")  # a key semantic_vad does not take, as at the session's top
    assert err["code"] == ("unknown_parameter" if unknown else "invalid_value") and err["param"] == param
    assert "eagerness" not in param or "low, medium, high, auto" in err["message"]
    assert proto.config == before


@pytest.mark.parametrize(
    ("event", "param"),
    [
        ({"type": "session.update", "session": {"audio": {"input": {"turn_detection": {
            "type": "server_vad", "silence_duraton_ms": 2000}}}}},
         "session.audio.input.turn_detection.silence_duraton_ms"),
        ({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rat": 24000}}}}},
         "session.audio.input.format.rat"),
        ({"type": "session.update", "session": {"audio": {"input": {"transcription": {"langauge": "en"}}}}},
         "session.audio.input.transcription.langauge"),
        ({"type": "session.update", "session": {"tools": [{"type": "function", "name": "f", "descripton": "x"}]}},
         "session.tools[0].descripton"),
        ({"type": "response.create", "response": {"modalities": ["text"]}}, "response.modalities"),
        ({"type": "response.create", "response": {"temperature": 0.2}}, "response.temperature"),
        ({"type": "session.update", "session": {"modalities": ["text"]}}, "session.modalities"),
        ({"type": "session.update", "session": {"turn_detection": None}}, "session.turn_detection"),
        ({"type": "session.update", "session": {"input_audio_transcription": {"model": "whisper-1"}}},
         "session.input_audio_transcription"),
        ({"type": "response.create", "response": {"foo": 1}}, "response.foo"),
        ({"type": "response.create", "response": {"audio": {"output": {"voise": "x"}}}}, "response.audio.output.voise"),
        ({"type": "response.create", "response": {"tools": [{"type": "function", "name": "f", "parms": {}}]}},
         "response.tools[0].parms"),
    ],
)  # fmt: skip
def test_a_misspelt_or_beta_key_anywhere_is_refused_naming_it(event, param):
    """Unknown keys are refused at every level of a session or a response, not only at the session's top (a
    misspelt VAD field or a beta response.create asking for text with "modalities" did nothing, silently)."""
    proto = make(caps=replace(CAPS, semantic=True))
    before = proto.config
    err = error_of(send(proto, **event))
    assert (err["code"], err["param"]) == ("unknown_parameter", param), err
    ga = {"response.modalities": "response.output_modalities", "session.modalities": "session.output_modalities",
          "session.turn_detection": "session.audio.input.turn_detection",
          "session.input_audio_transcription": "session.audio.input.transcription"}  # fmt: skip
    if param in ga:
        assert f"the GA API's is {ga[param]}" in err["message"], err  # the GA name to use instead
    assert proto.config == before and proto.response is None


def test_openais_other_known_keys_are_taken_and_a_tool_of_another_type_is_named_by_its_type():
    proto = make()
    transcription = {"model": "whisper-1", "language": "en", "delay": "low", "keywords": ["x"], "languages": ["en"]}
    out = send(proto, type="session.update", session={"audio": {"input": {"transcription": transcription}}})
    assert types(out) == ["session.updated"]
    mcp = {"type": "mcp", "server_label": "x", "server_url": "https://example.com"}
    err = error_of(send(proto, type="session.update", session={"tools": [mcp]}))
    assert err["param"] == "session.tools[0].type", err  # its type, not its keys
    err = error_of(send(proto, type="session.update", session={"prompt": {"id": "pmpt_1"}}))
    assert err["param"] == "session.prompt" and "not supported" in err["message"]
    assert types(send(proto, type="session.update", session={"prompt": None})) == ["session.updated"]


def test_semantic_vad_without_an_end_of_turn_model_is_refused():
    proto = make()  # a detector, no end-of-turn model
    session = {"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}
    err = error_of(send(proto, type="session.update", session=session))
    assert err["param"] == "session.audio.input.turn_detection.type" and "semantic_vad" in err["message"]


def pause_then(proto: RealtimeProtocol, words: list[str]) -> Outputs:
    """``words`` then 300 ms of silence: a pause (200 ms) that does not end the turn (server_vad: 500 ms)."""
    return feed(proto, spoken_words(words, lead_ms=0, tail_ms=300))


def test_a_preemptive_response_starts_on_the_speculation_and_is_dropped_unseen_when_the_turn_goes_on():
    proto = make()
    out = feed(proto, np.zeros(2400 * 3, np.int16)).extend(pause_then(proto, ["three"]))
    assert types(out) == ["input_audio_buffer.speech_started"]
    [spec] = out.commands
    assert isinstance(spec, Transcribe) and spec.speculative
    assert proto.transcription_delta(spec.item_id, 0, "three") == Outputs()
    started = proto.transcription_done(spec.item_id, 0, 1, 1)
    [pre] = started.commands
    assert started.events == [] and isinstance(pre, StartResponse) and pre.preemptive
    assert pre.messages[-1].content == "three" and pre.messages[0].role is Role.SYSTEM and pre.speak
    # the user goes on: the held response is cancelled, and nothing of it was ever sent
    resumed = pause_then(proto, ["five"])
    assert CancelResponse(pre.response_id) in resumed.commands and types(resumed) == []
    spec2 = next(c for c in resumed.commands if isinstance(c, Transcribe))
    proto.transcription_delta(spec2.item_id, 0, "three five")
    [pre2] = proto.transcription_done(spec2.item_id, 0, 2, 2).commands
    assert pre2.preemptive and pre2.messages[-1].content == "three five"
    # the turn ends at that pause: the response it gets is the held one, adopted (no new StartResponse)
    end = feed(proto, np.zeros(2400 * 4, np.int16))
    assert types(end)[:3] == [
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
    ]
    assert "conversation.item.input_audio_transcription.completed" in types(end)
    created = next(e for e in end.events if e.type == "response.created")
    rid = created.body["response"]["id"]
    assert end.commands == [AdoptResponse(pre2.response_id, rid)] and rid != pre2.response_id
    assert all(pre.response_id not in json.dumps(e.body) for e in end.events)
    assert types(proto.response_transcript(rid, "Hello."))[-1] == "response.output_audio_transcript.delta"
    assert proto.response_transcript(pre2.response_id, "x") == Outputs()  # only the adopted id speaks


def test_a_held_response_for_other_messages_is_cancelled_and_the_response_starts_anew():
    proto = make()
    feed(proto, np.zeros(2400 * 3, np.int16))
    [spec] = pause_then(proto, ["three"]).commands
    proto.transcription_delta(spec.item_id, 0, "three")
    [pre] = proto.transcription_done(spec.item_id, 0, 1, 1).commands
    # the client adds an item meanwhile: the held answer no longer answers this conversation
    send(
        proto, type="conversation.item.create", item={"role": "user", "content": [{"type": "input_text", "text": "x"}]}
    )
    end = feed(proto, np.zeros(2400 * 4, np.int16))
    cancel, start = end.commands
    assert cancel == CancelResponse(pre.response_id)
    assert isinstance(start, StartResponse) and not start.preemptive and start.messages[-1].content == "three"


def test_preemptive_response_false_turns_it_off():
    proto = make()
    out = send(proto, type="session.update", session={"preemptive_response": False})
    assert out.events[0].body["session"]["preemptive_response"] is False
    feed(proto, np.zeros(2400 * 3, np.int16))
    [spec] = pause_then(proto, ["three"]).commands
    proto.transcription_delta(spec.item_id, 0, "three")
    assert proto.transcription_done(spec.item_id, 0, 1, 1) == Outputs()
    err = error_of(send(proto, type="session.update", session={"preemptive_response": "no"}))
    assert err["param"] == "session.preemptive_response"
