"""Tools and conversation items over ``WS /v1/realtime`` with the unchanged ``openai`` SDK, on the tiny random Qwen3 (a
text session): the forced call's argument deltas join to valid JSON, the function_call_output item and the next
response, an out-of-band response with its own input and metadata, and a bad tool refused by an error event."""

from __future__ import annotations

import json

import jsonschema
import pytest
from openai import AsyncOpenAI
from serving_helpers import running_server

from omni_stream.models.causal_lm.checkpoint import write_tiny_checkpoint
from omni_stream.realtime.settings import Settings

LM = "lm"
SCHEMA = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOL = {"type": "function", "name": "get_weather", "description": "Weather", "parameters": SCHEMA}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    lm = write_tiny_checkpoint(tmp_path_factory.mktemp("rt-tools") / LM, "qwen3")
    with running_server(None, Settings(), llm=lm) as live:
        yield live


def client(live) -> AsyncOpenAI:
    return AsyncOpenAI(api_key="x", base_url=f"{live.url}/v1", websocket_base_url=f"{live.ws_url}/v1")


async def until(conn, kind: str) -> list:
    events = []
    async for event in conn:
        events.append(event)
        if event.type == "error" and kind != "error":
            raise AssertionError(f"unexpected error event: {event.error}")
        if event.type == kind:
            return events
    raise AssertionError(f"the connection closed before {kind}")


async def test_a_forced_call_its_output_the_next_response_and_an_out_of_band_one(server):
    async with client(server).realtime.connect(model=LM) as conn:
        await until(conn, "session.created")
        session = {
            "type": "realtime",
            "output_modalities": ["text"],
            "tools": [TOOL],
            "tool_choice": "required",
            "max_output_tokens": 100,
            "audio": {"input": {"turn_detection": None}},
        }
        await conn.session.update(session=session)
        updated = (await until(conn, "session.updated"))[-1].session
        assert updated.tool_choice == "required" and updated.tools[0].name == "get_weather"
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]}
        )
        await conn.response.create()
        events = await until(conn, "response.done")
        calls = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert calls and all(c.name == "get_weather" for c in calls)
        for c in calls:
            deltas = [
                e.delta for e in events if e.type == "response.function_call_arguments.delta" and e.call_id == c.call_id
            ]
            assert "".join(deltas) == c.arguments
            jsonschema.validate(json.loads(c.arguments), SCHEMA)
        response = events[-1].response
        # the grammar allows more calls after the first (parallel calls): a random model may start one it has no
        # tokens left to finish, and only then is the response incomplete
        assert response.status == "completed" or (
            response.status == "incomplete" and response.status_details.reason == "max_output_tokens"
        ), response.status_details
        done = calls[0]
        call = next(o for o in response.output if o.type == "function_call")
        assert (call.call_id, call.arguments, call.status) == (done.call_id, done.arguments, "completed")
        added = [e.item for e in events if e.type == "conversation.item.added"]
        assert any(i.type == "function_call" and i.call_id == done.call_id for i in added)

        # the tool's result, then the next response answers it (free to answer: tool_choice auto)
        await conn.conversation.item.create(
            item={"type": "function_call_output", "call_id": done.call_id, "output": '{"temp_c": 21}'}
        )
        output_item = (await until(conn, "conversation.item.done"))[-1].item
        assert output_item.type == "function_call_output" and output_item.output == '{"temp_c": 21}'
        await conn.response.create(response={"tool_choice": "auto", "max_output_tokens": 6})
        events = await until(conn, "response.done")
        answer = events[-1].response
        assert answer.status in ("completed", "incomplete") and [o.type for o in answer.output] == ["message"]
        assert answer.usage.input_tokens > response.usage.input_tokens  # the call and its result are in its prompt

        # out of band: its own input, metadata echoed, nothing added to the conversation
        await conn.response.create(
            response={
                "conversation": "none",
                "metadata": {"purpose": "title"},
                "output_modalities": ["text"],
                "max_output_tokens": 4,
                "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Title?"}]}],
            }
        )
        events = await until(conn, "response.done")
        assert not [e for e in events if e.type.startswith("conversation.item")]
        oob = events[-1].response
        assert oob.metadata == {"purpose": "title"} and oob.conversation_id is None
        assert oob.usage.input_tokens < answer.usage.input_tokens  # its prompt is its own input, not the conversation

        # a bad tool is an error event naming the field; the session goes on
        await conn.session.update(session={"type": "realtime", "tools": [{"type": "function", "name": "bad name"}]})
        error = (await until(conn, "error"))[-1].error
        assert error.param == "session.tools[0].name" and error.code == "invalid_value"
        await conn.conversation.item.retrieve(item_id=call.id)
        got = (await until(conn, "conversation.item.retrieved"))[-1].item
        assert got.type == "function_call" and got.arguments == done.arguments


async def test_the_tools_count_when_old_turns_leave_the_prompt(server):
    """The tools take room in the prompt: with ``truncation: auto`` the oldest turns leave until the tools fit too."""
    family = server.engine.models.text()
    async with client(server).realtime.connect(model=LM) as conn:
        await until(conn, "session.created")
        session = {
            "type": "realtime",
            "output_modalities": ["text"],
            "tools": [TOOL],
            "max_output_tokens": 4,
            "instructions": "",
            "audio": {"input": {"turn_detection": None}},
        }
        await conn.session.update(session=session)
        await until(conn, "session.updated")
        text = "the quick brown fox jumps over the lazy dog " * 3
        turns = 0
        while (turns + 1) * (family.count_text_tokens(text) + 8) < 1024 - 64:  # the turns alone would fit
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
            )
            await until(conn, "conversation.item.done")
            turns += 1
        await conn.response.create()
        response = (await until(conn, "response.done"))[-1].response
        assert response.status in ("completed", "incomplete"), response.status_details
        assert response.usage.input_tokens <= 1024 - 4
