"""One set of JSON field readers for every surface: each reader's rule and message, and the same words whether the
field came to the speech route, chat, the realtime agent's socket, the video socket or an images form."""

from __future__ import annotations

import json
import math

import pytest

from omni_stream.realtime.agent.events import RealtimeError, parse_client_event
from omni_stream.realtime.chat.params import parse_chat
from omni_stream.realtime.common.body_limit import parse_json, text_over
from omni_stream.realtime.common.errors import ApiError, from_exception
from omni_stream.realtime.common.json_fields import (
    FieldError,
    boolean,
    choice,
    integer,
    number,
    obj,
    optional,
    string,
    type_name,
)
from omni_stream.realtime.images.params import EDIT_FIELDS, parse_params
from omni_stream.realtime.settings import Settings
from omni_stream.realtime.speech.params import parse_options
from omni_stream.realtime.speech.stream_messages import ProtocolError as SpeechError
from omni_stream.realtime.speech.stream_messages import parse_message as speech_message
from omni_stream.realtime.video.protocol import ProtocolError, VideoLimits, parse_start
from omni_stream.realtime.video.protocol import parse_message as video_message
from omni_stream.realtime.video_chat.protocol import ProtocolError as ChatError
from omni_stream.realtime.video_chat.protocol import parse_message as chat_message


def _message(read, *args, **kwargs) -> tuple[str, str]:
    with pytest.raises(FieldError) as info:
        read(*args, **kwargs)
    return info.value.param, info.value.message


def test_each_reader_names_the_field_what_it_must_be_and_what_came():
    assert _message(boolean, "yes", "stream") == ("stream", "'stream' must be a boolean (true or false), got string")
    assert _message(integer, 2.5, "n") == ("n", "'n' must be an integer, got number")
    assert _message(integer, 9, "n", 1, 4) == ("n", "'n' must be between 1 and 4, got 9")
    assert _message(integer, 0, "n", 1)[1] == "'n' must be at least 1, got 0"
    assert _message(number, math.nan, "t", 0.0, 2.0)[1] == "'t' must be a finite number, got NaN"
    assert _message(number, 3, "t", 0.0, 2.0)[1] == "'t' must be between 0.0 and 2.0, got 3"
    assert _message(string, 5, "model")[1] == "'model' must be a string, got integer"
    assert _message(string, " ", "prompt", non_empty=True)[1] == "'prompt' must be a non-empty string"
    assert _message(string, "abc", "prompt", limit=2)[1] == "'prompt' is too long: 3 characters (max 2)"
    assert "unpaired surrogate at position 1" in _message(string, "a\ud800", "input", utf8=True)[1]
    assert _message(choice, "x", "format", ("a", "b"))[1] == "'format' must be one of 'a', 'b', got 'x'"
    assert _message(obj, [], "audio")[1] == "'audio' must be an object, got array"
    assert type_name(math.inf) == "Infinity" and type_name(None) == "null"


def test_readers_return_the_value_as_the_type_they_name():
    assert integer(2.0, "n") == 2 and number(1, "t") == 1.0 and isinstance(number(1, "t"), float)
    assert optional({}, "n", integer) is None and optional({"n": None}, "n", integer) is None
    assert optional({"n": 3}, "n", integer, 1, 4) == 3
    # a form's values are strings
    assert integer(" 3 ", "n", form=True) == 3 and number("0.5", "g", form=True) == 0.5
    assert boolean("on", "stream", form=True) is True and boolean("0", "stream", form=True) is False
    assert choice(" PNG ", "f", ("png",), form=True) == "png" and string(7, "prompt", form=True) == "7"
    with pytest.raises(FieldError):
        boolean("on", "stream")  # JSON booleans are booleans


def test_http_answers_a_field_error_with_a_400_naming_it():
    error = from_exception(FieldError("'n' must be an integer, got string", "n"))
    assert (error.status, error.param, error.type) == (400, "n", "BadRequestError")


def test_every_surface_says_a_wrong_boolean_in_the_same_words():
    words = "must be a boolean (true or false), got string"
    with pytest.raises(Exception) as speech:
        parse_options({"stream": "yes"}, Settings())
    with pytest.raises(Exception) as chat:
        parse_chat({"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, Settings())
    with pytest.raises(RealtimeError) as agent:
        update = {
            "type": "realtime",
            "audio": {"input": {"turn_detection": {"type": "server_vad", "create_response": "yes"}}},
        }
        parse_client_event(json.dumps({"type": "session.update", "session": update}))
    for error, param in ((speech, "stream"), (chat, "stream")):
        assert words in error.value.message and error.value.param == param
    assert words in agent.value.message and agent.value.code == "invalid_value"
    assert agent.value.param == "session.audio.input.turn_detection.create_response"


def test_every_surface_says_a_wrong_integer_in_the_same_words():
    with pytest.raises(Exception) as speech:
        parse_options({"seed": "7"}, Settings())
    with pytest.raises(Exception) as chat:
        parse_chat({"messages": [{"role": "user", "content": "hi"}], "seed": "7"}, Settings())
    with pytest.raises(ProtocolError) as video:
        parse_start({"type": "session.start", "prompt": "a cat", "seed": "7"}, VideoLimits())
    with pytest.raises(RealtimeError) as agent:
        parse_client_event(json.dumps({"type": "conversation.item.truncate", "item_id": "i", "audio_end_ms": "7"}))
    with pytest.raises(Exception) as image:
        parse_params({"prompt": "a cat", "seed": "seven"}, EDIT_FIELDS, form=True)
    assert speech.value.message == chat.value.message == video.value.message == "'seed' must be an integer, got string"
    assert agent.value.message == "'audio_end_ms' must be an integer, got string"
    assert image.value.message == "'seed' must be an integer, got 'seven'"  # a form's values are all strings
    assert video.value.code == "invalid_request" and video.value.param == "seed"


def test_chat_reads_vllms_top_k_and_repetition_penalty_into_its_sampling():
    hi = [{"role": "user", "content": "hi"}]
    options = parse_chat({"messages": hi, "temperature": 0.7, "top_k": 20, "repetition_penalty": 1.1}, Settings())
    assert (options.sampling.top_k, options.sampling.repetition_penalty, options.sampling.temperature) == (20, 1.1, 0.7)
    greedy = parse_chat({"messages": hi, "temperature": 0, "repetition_penalty": 1.3}, Settings()).sampling
    assert not greedy.do_sample and greedy.repetition_penalty == 1.3
    assert parse_chat({"messages": hi, "top_k": -1}, Settings()).sampling.top_k == 0  # vLLM's "no top-k"
    assert parse_chat({"messages": hi}, Settings()).sampling is None  # the model's own defaults


def test_chat_refuses_a_field_it_does_not_read_and_takes_openais_service_options():
    hi = [{"role": "user", "content": "hi"}]
    for body, field in (
        ({"messages": hi, "chat_template_kwargs": {"enable_thinking": False}}, "chat_template_kwargs"),
        ({"messages": hi, "max_token": 5}, "max_token"),  # a typo is named, not silently unbounded
        ({"messages": hi, "modalities": ["text", "audio"], "audio": {"voice": "vivian", "speed": 2}}, "audio.speed"),
    ):
        with pytest.raises(ApiError) as err:
            parse_chat(body, Settings())
        assert (err.value.status, err.value.param) == (400, field) and f"'{field}'" in err.value.message
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    called = [*hi, {"role": "assistant", "content": None, "tool_calls": [call]}]
    answered = parse_chat({"messages": [*called, {"role": "tool", "tool_call_id": "c1", "content": "4"}]}, Settings())
    assert answered.messages[-1].tool_call_id == "c1"
    stray_answers = {
        "messages[2].tool_call_id": [*called, {"role": "tool", "tool_call_id": "c2", "content": "4"}],
        "messages[1].tool_call_id": [*hi, {"role": "tool", "tool_call_id": "c1", "content": "4"}],
    }
    for field, messages in stray_answers.items():
        with pytest.raises(ApiError) as err:
            parse_chat({"messages": messages}, Settings())
        assert err.value.param == field and "answers no call" in err.value.message
    ignored = {"store": True, "metadata": {"k": "v"}, "user": "u", "service_tier": "auto", "reasoning_effort": "low"}
    assert parse_chat({"messages": hi, **ignored}, Settings()).messages[0].content == "hi"


def test_every_socket_reads_a_message_by_one_size_rule_and_one_json_reader():
    # the limit is in UTF-8 bytes: 4 three-byte characters are 12 bytes
    assert not text_over("€€€€", 12) and text_over("€€€€", 11) and not text_over("a" * 12, 12)
    assert text_over("a" * 13, 12) and text_over("\ud800" * 4, 11)  # a lone surrogate counts, never raises
    huge = '{"type": "x", "seed": ' + "9" * 100 + "}"  # past the shared reader's digits, within Python's 4300
    with pytest.raises(SpeechError, match="Invalid JSON"):
        speech_message({"text": huge}, 1 << 20)
    for parse, error in ((video_message, ProtocolError), (chat_message, ChatError)):
        with pytest.raises(error) as refused:
            parse(huge, 1 << 20)
        assert refused.value.code == "invalid_json"
        with pytest.raises(error) as large:
            parse('{"type": "€€€€"}', 20)  # 16 characters, 24 bytes
        assert large.value.code == "message_too_large"
    with pytest.raises(RealtimeError) as agent:
        parse_client_event(huge)
    assert agent.value.code == "invalid_json"


def test_the_json_reader_names_a_lone_surrogate_by_its_path_on_every_surface():
    # JSON spells a lone surrogate as an escape; echoed in an event it broke the socket's send (close 1011), handed
    # to a tokenizer or grammar compiler it raised inside (a 500). The one reader refuses it, naming where it is.
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x\ud800"}]}
    with pytest.raises(RealtimeError) as agent:
        parse_client_event(json.dumps({"type": "conversation.item.create", "item": item}))
    assert (agent.value.code, agent.value.param) == ("invalid_value", "item.content[0].text")
    assert "not valid Unicode text" in agent.value.message
    with pytest.raises(ProtocolError) as video:
        video_message(json.dumps({"type": "session.start", "prompt": "\udfff"}), 1 << 20)
    assert (video.value.code, video.value.param) == ("invalid_request", "prompt")
    with pytest.raises(ChatError) as chat:
        chat_message(json.dumps({"type": "session.config", "\udc00": 1}), 1 << 20)
    assert chat.value.code == "invalid_value" and chat.value.param == "\\udc00"  # a key, shown so it can be sent
    with pytest.raises(SpeechError, match="'text' is not valid Unicode text"):
        speech_message({"text": json.dumps({"type": "input.text", "text": "\ud800"})}, 1 << 20)
    with pytest.raises(FieldError) as top:
        parse_json('["ok", "\\ud800"]')
    assert top.value.param == "[1]"
    with pytest.raises(FieldError):  # a body in UTF-16, which json.loads reads too
        parse_json('{"a": "\\ud800"}'.encode("utf-16"))
    assert parse_json('{"smile": "\\ud83d\\ude00"}') == {"smile": "\U0001f600"}  # a pair is one character


def test_chat_refuses_odd_roles_and_token_ids_as_400s():
    for body, field in (
        ({"messages": [{"role": [], "content": "hi"}]}, "messages[0].role"),  # unhashable: was a 500
        ({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"²": 1}}, "logit_bias"),  # isdigit, not int
        ({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"1" * 5000: 1}}, "logit_bias"),
    ):
        with pytest.raises(ApiError) as err:
            parse_chat(body, Settings())
        assert (err.value.status, err.value.param) == (400, field)


def test_an_image_option_sent_as_null_is_unset_whichever_it_is():
    nulls = {key: None for key in ("size", "quality", "partial_images", "n", "background", "output_format", "seed")}
    assert parse_params({"prompt": "a cat", **nulls}, EDIT_FIELDS, form=False) == parse_params(
        {"prompt": "a cat"}, EDIT_FIELDS, form=False
    )
    with pytest.raises(ApiError, match="'prompt' is required"):
        parse_params({"prompt": None}, EDIT_FIELDS, form=False)
