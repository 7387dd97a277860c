"""Speech field validation (HTTP body and WebSocket session.config), auth helpers and SSE framing: pure code."""

from __future__ import annotations

import json

import pytest
from starlette.datastructures import Headers

from omni_stream.realtime.common.auth import key_matches, presented_keys, select_subprotocol
from omni_stream.realtime.common.errors import ApiError, from_exception
from omni_stream.realtime.common.json_fields import FieldError
from omni_stream.realtime.common.sse import sse_event
from omni_stream.realtime.settings import Settings
from omni_stream.realtime.speech.params import StreamMode, check_model, parse_input, parse_options
from omni_stream.requests import TaskType
from omni_stream.speech.text_split import Granularity

S = Settings()


def refused(body, *, websocket=False) -> ApiError:
    """The error the client gets for ``body`` (a wire rule's, or a field reader's: the same 400)."""
    with pytest.raises((ApiError, FieldError)) as info:
        parse_options(body, S, websocket=websocket)
    error = from_exception(info.value)
    assert error.status == 400 and error.type == "BadRequestError"
    return error


@pytest.mark.parametrize(
    ("stream", "stream_format", "mode"),
    [
        (None, None, StreamMode.NONE),
        (False, None, StreamMode.NONE),
        (True, None, StreamMode.SSE),
        (None, "sse", StreamMode.SSE),
        (False, "sse", StreamMode.SSE),
        (None, "audio", StreamMode.AUDIO),
        (True, "audio", StreamMode.AUDIO),
    ],
)
def test_stream_mode_table(stream, stream_format, mode):
    body = {"response_format": "pcm", "stream": stream, "stream_format": stream_format}
    assert parse_options(body, S).stream_mode is mode


def test_defaults():
    opts = parse_options({}, S)
    assert opts.response_format == "wav" and opts.speed == 1.0 and opts.stream_mode is StreamMode.NONE
    assert opts.voice is None and opts.language == "Auto" and opts.task_type is None


@pytest.mark.parametrize("fmt", ["mp3", "flac", "opus", "aac"])
@pytest.mark.parametrize("mode", [{"stream": True}, {"stream_format": "sse"}, {"stream_format": "audio"}])
def test_streaming_needs_pcm_or_wav(fmt, mode):
    error = refused({"response_format": fmt, **mode})
    assert "pcm" in error.message and "wav" in error.message and error.param == "response_format"


def test_streaming_needs_speed_one():
    assert refused({"response_format": "pcm", "stream": True, "speed": 2.0}).param == "speed"
    assert parse_options({"response_format": "mp3", "speed": 2.0}, S).speed == 2.0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"response_format": "xyz"}, "response_format"),
        ({"response_format": 3}, "response_format"),
        ({"speed": 5}, "speed"),
        ({"speed": 0.1}, "speed"),
        ({"speed": "fast"}, "speed"),
        ({"speed": True}, "speed"),
        ({"stream": "yes"}, "stream"),
        ({"stream_format": "mp3"}, "stream_format"),
        ({"task_type": "Clone"}, "task_type"),
        ({"voice": 3}, "voice"),
        ({"voice": {"name": "x"}}, "voice"),
        ({"max_new_tokens": 1.5}, "max_new_tokens"),
        ({"max_new_tokens": "10"}, "max_new_tokens"),
        ({"seed": -1}, "seed"),
        ({"sample_rate": 100}, "sample_rate"),
        ({"x_vector_only_mode": 1}, "x_vector_only_mode"),
        ({"vioce": "vivian"}, "vioce"),  # a field not read is named, not dropped
        ({"stream_audio": True}, "stream_audio"),  # the socket's session.config field
    ],
)
def test_bad_fields_name_the_field(body, param):
    error = refused(body)
    assert error.param == param and param in error.message.lower()


def test_bad_enum_lists_allowed_values():
    assert "'wav', 'pcm', 'flac', 'mp3', 'opus', 'aac'" in refused({"response_format": "xyz"}).message


def test_voice_forms_and_case():
    assert parse_options({"voice": "Alice"}, S).voice == "alice"
    assert parse_options({"voice": {"id": "Bob"}}, S).voice == "bob"
    assert parse_options({"speaker": "carol"}, S).voice == "carol"


def test_field_normalisation():
    opts = parse_options(
        {"language": "english", "task_type": "Base", "initial_codec_chunk_frames": 0, "instructions": "  "}, S
    )
    # the language as sent: the engine resolves it case-insensitively to the model's spelling (and an unknown one is
    # named as the user wrote it: test_serving_http)
    assert opts.language == "english" and opts.task_type is TaskType.BASE
    assert opts.initial_codec_chunk_frames is None and opts.instructions is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "'input' is required"),
        ({"input": None}, "'input' is required"),
        ({"input": 5}, "'input' must be a string"),
        ({"input": ["a"]}, "'input' must be a string"),
    ],
)
def test_input_wire_rules(body, message):
    with pytest.raises((ApiError, FieldError)) as info:
        parse_input(body, S)
    error = from_exception(info.value)
    assert error.status == 400 and message in error.message and error.param == "input"


def test_input_is_stripped_and_limit_counts_after_strip():
    assert parse_input({"input": "  hi  "}, S) == "hi"
    assert parse_input({"input": " " + "x" * 4096 + " "}, S) == "x" * 4096


def test_body_must_be_an_object():
    refused([1, 2])


def test_other_model_is_404():
    check_model(None, ("m",))
    check_model("m", ("m",))
    with pytest.raises(ApiError) as info:
        check_model("other", ("m",))
    assert (info.value.status, info.value.type, info.value.param) == (404, "NotFoundError", "model")


def test_websocket_config_rules():
    opts = parse_options(
        {"stream_audio": True, "response_format": "pcm", "split_granularity": "clause"}, S, websocket=True
    )
    assert opts.stream_audio and opts.split_granularity is Granularity.CLAUSE
    assert "response_format='pcm'" in refused({"stream_audio": True, "response_format": "wav"}, websocket=True).message
    assert refused({"stream_audio": True, "response_format": "pcm", "speed": 2}, websocket=True).param == "speed"
    assert refused({"split_granularity": "word"}, websocket=True).param == "split_granularity"
    for key in ("input", "stream", "stream_format"):
        assert refused({key: "x"}, websocket=True).param == key
    # Not streaming audio: any format and speed, one file per unit
    assert parse_options({"response_format": "mp3", "speed": 1.5}, S, websocket=True).speed == 1.5


def test_engine_errors_map_to_statuses():
    from omni_stream.errors import DeadlineExceeded, EngineClosed, InvalidRequestError, UnknownVoiceError, UpstreamError

    assert from_exception(InvalidRequestError("bad", "voice")).status == 400
    assert from_exception(UnknownVoiceError("nope", "voice")).param == "voice"
    assert from_exception(EngineClosed("x")).status == 503
    assert from_exception(DeadlineExceeded("x")).status == 504
    upstream = from_exception(UpstreamError("the upstream server answered 500: boom", status=500))
    assert (upstream.status, upstream.type, upstream.body()["error"]["code"]) == (502, "BadGatewayError", 502)
    assert "answered 500: boom" in upstream.message
    internal = from_exception(RuntimeError("boom"))
    assert internal.status == 500 and internal.type == "InternalServerError"


def test_codec_decode_errors_are_client_errors():
    from omni_stream import codecs

    error = getattr(codecs, "AudioDecodeError", None)
    if error is None:
        from omni_stream.codecs.errors import AudioDecodeError as error
    assert from_exception(error("not audio")).status == 400


def test_auth_helpers():
    headers = Headers({"authorization": "Bearer k1", "sec-websocket-protocol": "realtime, openai-insecure-api-key.k2"})
    assert presented_keys(headers, websocket=False) == ["k1"]
    assert presented_keys(headers, websocket=True) == ["k1", "k2"]
    assert key_matches("k2", ["k1", "k2"]) and not key_matches("k3", ["k1", "k2"]) and not key_matches("k", [])
    assert select_subprotocol(["realtime", "openai-insecure-api-key.k"]) == "realtime"
    assert select_subprotocol(["openai-insecure-api-key.k", "realtime"]) == "realtime"
    assert select_subprotocol(["openai-insecure-api-key.k"]) is None  # never echo the key
    assert select_subprotocol([]) is None


def test_sse_event_framing():
    assert sse_event("a.b", {"type": "a.b", "text": "x\ny"}) == b'event: a.b\ndata: {"type":"a.b","text":"x\\ny"}\n\n'


def test_error_bodies_render_whatever_text_they_quote():
    response = ApiError(400, "Invalid voice 'x\ud800y'", "voice").response()
    assert json.loads(response.body)["error"]["message"] == "Invalid voice 'x\\ud800y'"


@pytest.mark.parametrize("field", ["input", "instructions", "ref_text", "voice", "language", "model", "ref_audio"])
def test_text_fields_must_be_valid_unicode(field):
    body = {"input": "Hi.", field: "a\udfffb"}
    with pytest.raises((ApiError, FieldError)) as info:
        parse_options(body, Settings()) if field != "input" else parse_input(body, Settings())
    error = from_exception(info.value)
    assert error.status == 400 and error.param == field and "surrogate" in error.message
