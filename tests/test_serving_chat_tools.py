"""Tools, structured output and the sampling fields of POST /v1/chat/completions, through the unchanged ``openai`` SDK
and the OpenAI Agents SDK, against the app of ``omni-stream serve`` on the tiny Qwen3-TTS and the tiny random Qwen3.

Random weights cannot choose to call a tool, so the tests force calls (``tool_choice``) and JSON output
(``response_format``): the grammar makes every reply valid whatever the weights say.
"""

from __future__ import annotations

import json
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from serving_helpers import running_server

from omni_stream.models.causal_lm.checkpoint import write_tiny_checkpoint as write_tiny_lm
from omni_stream.models.qwen3_tts.checkpoint import write_tiny_checkpoint as write_tiny_tts
from omni_stream.realtime.settings import Settings

WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat-tools")
    with running_server(write_tiny_tts(root / "tts"), Settings(), llm=write_tiny_lm(root / "lm", "qwen3")) as live:
        yield live


def client(live) -> openai.OpenAI:
    return openai.OpenAI(api_key="none", base_url=f"{live.url}/v1", max_retries=0)


def test_streamed_tool_call_deltas_reassemble_to_valid_json(server):
    for seed in range(4):
        stream = client(server).chat.completions.create(
            model="lm", messages=ASK, tools=TOOLS, tool_choice="required", stream=True, seed=seed, max_tokens=80
        )
        calls: dict[int, dict] = {}
        finish = None
        for chunk in stream:
            choice = chunk.choices[0]
            finish = choice.finish_reason or finish
            for piece in choice.delta.tool_calls or []:
                call = calls.setdefault(piece.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = piece.id or call["id"]
                call["name"] += piece.function.name or ""
                call["arguments"] += piece.function.arguments or ""
        assert finish == "tool_calls" and len(calls) >= 1
        for call in calls.values():
            assert call["name"] == "get_weather" and call["id"].startswith("call_")
            jsonschema.validate(json.loads(call["arguments"]), WEATHER)


def test_a_named_call_its_result_and_the_reply_after_it(server):
    api = client(server)
    first = api.chat.completions.create(
        model="lm",
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
        max_tokens=80,
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    history = [
        *ASK,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'},
    ]
    final = api.chat.completions.create(model="lm", messages=history, tools=TOOLS, max_tokens=12)
    assert final.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert final.usage.prompt_tokens > first.usage.prompt_tokens  # the call and its result are in the prompt


class Verdict(BaseModel):
    answer: Literal["yes", "no"]
    score: int = Field(ge=0, le=9)


def test_json_schema_output_parses_and_validates(server):
    api = client(server)
    for seed in range(4):
        parsed = api.chat.completions.parse(model="lm", messages=ASK, response_format=Verdict, seed=seed, max_tokens=40)
        assert isinstance(parsed.choices[0].message.parsed, Verdict)
    reply = api.chat.completions.create(
        model="lm", messages=ASK, response_format={"type": "json_object"}, temperature=0, max_tokens=300
    )
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_logprobs_and_penalties_reach_the_model(server):
    api = client(server)
    reply = api.chat.completions.create(
        model="lm", messages=ASK, temperature=0, max_tokens=5, logprobs=True, top_logprobs=2, presence_penalty=0.5
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens and all(len(e.top_logprobs) == 2 for e in content)
    # each entry's bytes are its token's own (a token inside a character has bytes but no text of its own): the
    # reply's UTF-8 is theirs joined, decoded as the text was
    long = api.chat.completions.create(model="lm", messages=ASK, temperature=0.9, seed=3, max_tokens=40, logprobs=True)
    entries = long.choices[0].logprobs.content
    joined = b"".join(bytes(e.bytes) for e in entries).decode("utf-8", errors="replace")
    assert joined == long.choices[0].message.content
    banned = api.chat.completions.create(model="lm", messages=ASK, temperature=0, max_tokens=5, logprobs=True)
    first = banned.choices[0].logprobs.content[0].top_logprobs  # top_logprobs 0: none
    assert first == []


def test_a_spoken_reply_speaks_its_text_and_not_its_calls(server):
    body = {
        "model": "lm",
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,  # one call, then the reply ends (random weights would call again and again)
        "seed": 0,
        "stream": True,
        "max_tokens": 80,
        "modalities": ["text", "audio"],
        "audio": {"voice": "vivian", "format": "pcm16"},
    }
    transcript, calls, finish, audio = "", "", None, []
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            finish = choice["finish_reason"] or finish
            audio += [choice["delta"]["audio"]] if "audio" in choice["delta"] else []
            transcript += (choice["delta"].get("audio") or {}).get("transcript", "")
            calls += "".join(c["function"]["arguments"] for c in choice["delta"].get("tool_calls") or [])
    assert finish == "tool_calls" and json.loads(calls)
    # the reply only called (a forced call, one at most): nothing spoken, so no audio object (OpenAI's null)
    assert transcript == "" and audio == [], (transcript, audio)
    whole = httpx.post(f"{server.url}/v1/chat/completions", json={**body, "stream": False}, timeout=120).json()
    message = whole["choices"][0]["message"]
    assert message["tool_calls"] and message["audio"] is None, message


BAD = [
    ({"tools": {"a": 1}}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools[0].function.parameters"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    (
        {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "wat"}}}],
            "tool_choice": "required",
        },
        "tools",
    ),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
        "response_format",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}},
        "response_format.json_schema.schema",
    ),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "response_format.json_schema.name"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {}}}},
        "response_format.json_schema.name",
    ),
    ({"n": 0}, "n"),
    ({"n": 2}, "n"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"frequency_penalty": "a"}, "frequency_penalty"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0]"),
    (
        {"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": 3}}]}]},
        "messages[0].tool_calls[0].function.name",
    ),
]


@pytest.mark.parametrize(("fields", "param"), BAD, ids=[f"{i}-{p}" for i, (_, p) in enumerate(BAD)])
def test_bad_tools_choices_schemas_and_sampling_fields_are_400s_naming_the_field(server, fields, param):
    response = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "lm", "messages": ASK, **fields})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "BadRequestError", error
    if param == "n":  # one message for every other count, 0 and 2 alike
        assert error["message"].startswith("'n' must be 1: this server returns one choice"), error
    if param.endswith("json_schema.name"):
        assert "is required: 1-64 letters, digits, underscores or dashes" in error["message"], error


def test_what_openai_compatible_clients_send_is_taken(server):
    """An assistant turn echoed back with null content and no call (some frameworks send one, with a refusal), and
    a response_format beside a forced call (the Agents SDK sends its output_type's format on every turn): taken,
    the forced call winning, as vLLM does."""
    url = f"{server.url}/v1/chat/completions"
    for turn in ({"role": "assistant", "content": None, "tool_calls": []},
                 {"role": "assistant", "content": None, "refusal": "I cannot"}):  # fmt: skip
        messages = [*ASK, turn, {"role": "user", "content": "And now?"}]
        answered = httpx.post(url, json={"model": "lm", "messages": messages, "max_tokens": 4}, timeout=60)
        assert answered.status_code == 200, answered.text
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}}}
    body = {"model": "lm", "messages": ASK, "tools": TOOLS, "tool_choice": "required", "response_format": fmt,
            "parallel_tool_calls": False, "seed": 0, "max_tokens": 80}  # fmt: skip
    forced = httpx.post(url, json=body, timeout=120)
    assert forced.status_code == 200, forced.text
    choice = forced.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["tool_calls"], choice


def test_a_call_cut_by_max_tokens_is_the_replys_content_not_a_call(server):
    """What vLLM answers: a call the reply ran out of tokens in is returned as content (finish_reason length)."""
    fields = dict(model="lm", messages=ASK, tools=TOOLS, tool_choice="required", seed=0, max_tokens=6)
    reply = client(server).chat.completions.create(**fields)
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "length" and not message.tool_calls
    assert message.content.startswith("<tool_call>")
    stream = client(server).chat.completions.create(**fields, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == message.content
