"""Pure parts of the vLLM and remote text backends: request bodies, stream chunks, errors, sampling arguments."""

from __future__ import annotations

import json

import pytest

from omni_stream.errors import ConfigError, InvalidRequestError, UpstreamError
from omni_stream.models.openai_text.family import base_url
from omni_stream.models.openai_text.wire import (
    RemoteOptions,
    error_from_body,
    error_from_response,
    parse_chunk,
    request_body,
    served_model,
)
from omni_stream.models.vllm_text.params import sampling_args
from omni_stream.requests import GREEDY, ChatMessage, Role, SamplingParams, TextRequest
from omni_stream.validation.text import fit_prompt

# Recorded from `vllm serve` 0.32 (tiny Qwen3, /v1/chat/completions and /v1/completions, stream_options.include_usage).
VLLM_CHAT = [
    '{"id":"chatcmpl-b4","object":"chat.completion.chunk","created":1796118306,"model":"tiny","choices":[{"index":0,'
    '"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,'
    '"prompt_text":null}',
    '{"id":"chatcmpl-b4","object":"chat.completion.chunk","created":1796118306,"model":"tiny","choices":[{"index":0,'
    '"delta":{"content":"\\u0010"},"logprobs":null,"finish_reason":null,"token_ids":null}]}',
    '{"id":"chatcmpl-b4","object":"chat.completion.chunk","created":1796118306,"model":"tiny","choices":[{"index":0,'
    '"delta":{"content":"\\ufffd "},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}]}',
    '{"id":"chatcmpl-b4","object":"chat.completion.chunk","created":1796118306,"model":"tiny","choices":[],'
    '"usage":{"prompt_tokens":19,"total_tokens":24,"completion_tokens":5},"system_fingerprint":"vllm-0.32.0"}',
]
VLLM_COMPLETION = (
    '{"id":"cmpl-b2","object":"text_completion","created":1796118309,"model":"tiny","choices":[{"index":0,'
    '"text":"ab","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}'
)


def chat(text: str = "hi", **fields) -> TextRequest:
    return TextRequest(messages=(ChatMessage(Role.SYSTEM, "be brief"), ChatMessage(Role.USER, text)), **fields)


def test_a_chat_request_is_a_streaming_chat_completion_with_usage():
    path, body = request_body(chat(max_tokens=7, seed=3, stop=("END",)), "m")
    assert path == "/v1/chat/completions"
    assert body == {
        "model": "m",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "max_tokens": 7,
        "seed": 3,
        "stop": ["END"],
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_a_raw_prompt_goes_to_completions():
    path, body = request_body(TextRequest(prompt="Once"), "m")
    assert (path, body["prompt"], "messages" in body) == ("/v1/completions", "Once", False)


def test_sampling_maps_to_openai_fields_and_extensions_only_when_they_matter():
    assert request_body(chat(sampling=GREEDY), "m")[1]["temperature"] == 0.0
    _, plain = request_body(chat(sampling=SamplingParams(temperature=0.7, top_k=0, top_p=0.9)), "m")
    assert (plain["temperature"], plain["top_p"]) == (0.7, 0.9)
    assert "top_k" not in plain and "repetition_penalty" not in plain and "ignore_eos" not in plain
    _, extended = request_body(chat(sampling=SamplingParams(top_k=20, repetition_penalty=1.1), ignore_eos=True), "m")
    assert (extended["top_k"], extended["repetition_penalty"], extended["ignore_eos"]) == (20, 1.1, True)
    assert "temperature" not in request_body(chat(), "m")[1]  # no sampling given: the server's defaults


def test_vllm_chat_chunks_parse_to_text_finish_and_usage():
    chunks = [parse_chunk(c) for c in VLLM_CHAT]
    assert [c.text for c in chunks] == ["", "\x10", "\ufffd ", ""]
    assert [c.finish_reason for c in chunks] == [None, None, "length", None]
    assert chunks[-1].usage == (19, 5)
    done = parse_chunk(VLLM_COMPLETION)
    assert (done.text, done.finish_reason) == ("ab", "length")


@pytest.mark.parametrize(
    ("status", "kind", "param"),
    [(400, InvalidRequestError, "max_tokens"), (422, InvalidRequestError, "max_tokens"), (401, UpstreamError, None),
     (403, UpstreamError, None), (404, UpstreamError, None), (429, UpstreamError, None), (500, UpstreamError, None),
     (503, UpstreamError, None)],
)  # fmt: skip
def test_upstream_errors_map_to_the_clients_or_the_servers_fault(status, kind, param):
    body = {"error": {"message": "max_tokens=5000 cannot be greater than 512", "type": "x", "param": "max_tokens"}}
    error = error_from_body(status, body)
    assert type(error) is kind
    if kind is InvalidRequestError:
        assert (error.message, error.param) == ("max_tokens=5000 cannot be greater than 512", param)
    else:
        assert error.status == status and "max_tokens=5000" in error.message


def test_error_bodies_of_every_shape_keep_their_message():
    assert "Unauthorized" in error_from_response(401, b'{"error": "Unauthorized"}').message  # vLLM's 401
    assert "upstream down" in error_from_response(502, b"upstream down").message  # a proxy's text body
    flat_body = {"object": "error", "message": "bad role", "param": "messages"}
    flat = error_from_response(400, json.dumps(flat_body).encode())
    assert (flat.message, flat.param) == ("bad role", "messages")


def test_an_error_event_in_the_stream_raises_its_typed_error():
    with pytest.raises(UpstreamError, match="answered 500: boom"):
        parse_chunk('{"error": {"message": "boom", "type": "InternalServerError", "param": null, "code": 500}}')
    with pytest.raises(InvalidRequestError, match="bad"):
        parse_chunk('{"error": {"message": "bad", "type": "BadRequestError", "param": null, "code": 400}}')
    with pytest.raises(UpstreamError, match="not JSON"):
        parse_chunk("<html>")


def test_remote_options_are_checked():
    assert RemoteOptions.from_backend_args((("model", "m"), ("max_context", 64))) == RemoteOptions("m", None, 64)
    with pytest.raises(ConfigError, match=r"unknown options.*tensor_parallel_size"):
        RemoteOptions.from_backend_args((("tensor_parallel_size", 2),))
    with pytest.raises(ConfigError, match="max_context"):
        RemoteOptions(max_context=1)
    assert served_model({"data": [{"id": "a", "max_model_len": 8}, {"id": "b"}]}) == ("a", 8)
    omni = [{"id": "tts", "kind": "speech"}, {"id": "lm", "kind": "text", "max_model_len": 9}]
    assert served_model({"data": omni}) == ("lm", 9)  # an omni-stream server lists its speech model too
    with pytest.raises(ConfigError, match="lists no model"):
        served_model({"data": []})


@pytest.mark.parametrize("url", ["http://h:8000", "http://h:8000/", "http://h:8000/v1", " http://h:8000/v1/ "])
def test_endpoints_name_the_server_root(url):
    assert base_url(url) == "http://h:8000"


def test_an_endpoint_must_be_http():
    with pytest.raises(ConfigError, match="http"):
        base_url("h:8000")


def test_vllm_sampling_arguments():
    defaults = {"temperature": 0.6, "top_p": 0.95}
    assert sampling_args(chat(), defaults) == {"temperature": 0.6, "top_p": 0.95, "max_tokens": None}
    assert sampling_args(chat(sampling=GREEDY, max_tokens=5), defaults) == {"temperature": 0.0, "max_tokens": 5}
    sampled = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.2)
    assert sampling_args(chat(sampling=sampled, seed=1, stop=("x",), ignore_eos=True), defaults) == {
        "temperature": 0.8,
        "top_k": 40,
        "top_p": 0.9,
        "repetition_penalty": 1.2,
        "max_tokens": None,
        "seed": 1,
        "stop": ["x"],
        "ignore_eos": True,
    }


def test_a_prompt_must_leave_room_for_max_tokens():
    assert fit_prompt(10, 6, 16) == 6
    assert fit_prompt(10, None, 11) == 1  # no max_tokens: the rest of the context
    with pytest.raises(InvalidRequestError, match="exceeds the 6 tokens left") as info:
        fit_prompt(10, 7, 16)
    assert info.value.param == "max_tokens"
    with pytest.raises(InvalidRequestError, match="does not fit") as info:
        fit_prompt(16, None, 16, "prompt")
    assert info.value.param == "prompt"


def test_vllm_gets_penalties_bias_logprobs_and_structured_outputs():
    import json
    from types import SimpleNamespace

    from omni_stream.models.vllm_text.params import structured_args, token_logprobs
    from omni_stream.text.tool_parsers import ToolFormat
    from omni_stream.text.tools import FormatKind, FunctionTool, ResponseFormat, ToolChoice, ToolMode

    args = sampling_args(chat(presence_penalty=0.5, frequency_penalty=-1.0, logit_bias=((7, 2.0),), logprobs=3), {})
    assert args == {
        "max_tokens": None,
        "presence_penalty": 0.5,
        "frequency_penalty": -1.0,
        "logit_bias": {7: 2.0},
        "logprobs": 3,
    }
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert structured_args(chat(), ToolFormat.HERMES) == {}
    assert structured_args(chat(response_format=ResponseFormat(FormatKind.JSON_OBJECT)), None) == {"json_object": True}
    as_schema = ResponseFormat(FormatKind.JSON_SCHEMA, json.dumps(schema))
    assert structured_args(chat(response_format=as_schema), None) == {"json": schema}
    forced = chat(tools=(FunctionTool("f", None, json.dumps(schema)),), tool_choice=ToolChoice(ToolMode.REQUIRED))
    grammar = structured_args(forced, ToolFormat.HERMES)["grammar"]
    assert grammar.startswith("start: call") and '"const": "f"' in grammar and "<tool_call>" in grammar
    with pytest.raises(InvalidRequestError) as err:
        structured_args(forced, None)
    assert err.value.param == "tool_choice"
    lp = SimpleNamespace
    entries = [
        {5: lp(logprob=-0.1, rank=1, decoded_token="a"), 9: lp(logprob=-2.5, rank=2, decoded_token="b")},
        {9: lp(logprob=-0.3, rank=1, decoded_token="b"), 4: lp(logprob=-3.0, rank=4, decoded_token="c")},
    ]
    got = token_logprobs([5, 4], entries, 1)
    assert [(t.token, t.logprob, t.top) for t in got] == [("a", -0.1, (("a", -0.1),)), ("c", -3.0, (("b", -0.3),))]


def test_a_logprob_entrys_bytes_are_its_tokens_own(tmp_path):
    """A byte-level BPE token inside a character: its text is U+FFFD, its bytes are the ones it stands for; the
    tokens' bytes joined are the text's UTF-8; a special token (text skipped) has none."""
    from omni_stream.models.causal_lm.checkpoint import write_tiny_checkpoint
    from omni_stream.models.causal_lm.tokenizer import ChatTokenizer
    from omni_stream.text.logprobs import TokenLogprob

    tokenizer = ChatTokenizer(write_tiny_checkpoint(tmp_path, "qwen3", seed=0))
    text = "héllo 世界 🙂!"
    ids = tokenizer.hf(text, add_special_tokens=False)["input_ids"]
    assert any(tokenizer.decode([i]) == "\ufffd" for i in ids)  # the tokenizer splits characters
    assert b"".join(tokenizer.token_bytes(i) for i in ids) == text.encode("utf-8")
    assert tokenizer.token_bytes(tokenizer.hf.eos_token_id) == b""
    partial = next(i for i in ids if tokenizer.decode([i]) == "\ufffd")
    raw = tokenizer.token_bytes(partial)
    entry = TokenLogprob("\ufffd", -0.5, (("\ufffd", -0.5), ("a", -1.0)), raw, (raw, b"a")).wire()
    assert entry["bytes"] == list(raw) != list("\ufffd".encode()) and entry["top_logprobs"][0]["bytes"] == list(raw)
    assert TokenLogprob("a", -1.0, (("b", -2.0),)).wire()["top_logprobs"][0]["bytes"] == [98]  # no raw: the text's


def test_a_remote_servers_logprob_bytes_are_kept_as_sent():
    """A remote OpenAI-compatible server's entry for a token inside a character: its ``bytes`` are the token's own
    and pass through (re-deriving them from the text would give U+FFFD's); entries without bytes use their text."""
    part = {
        "token": "\ufffd",
        "logprob": -0.5,
        "bytes": [228, 184],
        "top_logprobs": [{"token": "\ufffd", "logprob": -0.5, "bytes": [228, 184]}, {"token": "a", "logprob": -2}],
    }
    plain = {"token": "b", "logprob": -1.0, "top_logprobs": []}
    data = json.dumps({"choices": [{"index": 0, "delta": {"content": "b"}, "logprobs": {"content": [part, plain]},
                                    "finish_reason": None}]})  # fmt: skip
    first, second = parse_chunk(data).logprobs
    assert first.wire()["bytes"] == [228, 184] and first.wire()["top_logprobs"][0]["bytes"] == [228, 184]
    assert first.wire()["top_logprobs"][1]["bytes"] == [97]  # an alternative sent without bytes: its text's
    assert second.wire()["bytes"] == [98]
