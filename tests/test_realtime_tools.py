"""Tools and conversation items of the realtime protocol, without a server: session tools, function-call items in a
response and the conversation, function_call_output then response.create, items at a position, out-of-band
responses with their own input, metadata, and refusals naming the field."""

from __future__ import annotations

import itertools
import json

from omni_stream.realtime.agent.events import RealtimeError, parse_client_event
from omni_stream.realtime.agent.outputs import Capabilities, Outputs, ResponseUsage, StartResponse
from omni_stream.realtime.agent.protocol import RealtimeProtocol
from omni_stream.requests import Role
from omni_stream.text.tools import ToolCallDelta, ToolMode

CAPS = Capabilities(model="m", default_voice="alice", speech=True, text=True, transcription=True)
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "name": "get_weather", "description": "Weather", "parameters": WEATHER}


def make() -> RealtimeProtocol:
    counter = itertools.count(1)
    proto = RealtimeProtocol(CAPS, None, ids=lambda p: f"{p}_{next(counter)}")
    proto.start()
    return proto


def send(proto: RealtimeProtocol, **event) -> Outputs:
    try:
        parsed = parse_client_event(json.dumps(event))
    except RealtimeError as exc:
        return proto.refuse(exc)
    return proto.receive(parsed)


def types(out: Outputs) -> list[str]:
    return [e.type for e in out.events]


def error_of(out: Outputs) -> dict:
    assert types(out) == ["error"], types(out)
    return out.events[0].body["error"]


def text_session(proto: RealtimeProtocol, **session) -> dict:
    out = send(proto, type="session.update", session={"type": "realtime", "output_modalities": ["text"], **session})
    assert types(out) == ["session.updated"], out.events
    return out.events[0].body["session"]


def user_says(proto: RealtimeProtocol, text: str, **fields) -> Outputs:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return send(proto, type="conversation.item.create", item=item, **fields)


def start(out: Outputs) -> StartResponse:
    (cmd,) = [c for c in out.commands if isinstance(c, StartResponse)]
    return cmd


# A function_call item's events at a reply's end
CALL_EVENTS = (
    "response.output_item.added",
    "conversation.item.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
    "conversation.item.done",
)


def test_session_tools_reach_the_response_and_its_calls_become_items_after_its_text():
    proto = make()
    session = text_session(proto, tools=[TOOL], tool_choice="required")
    assert session["tools"] == [TOOL] and session["tool_choice"] == "required"
    user_says(proto, "Weather in Paris?")
    cmd = start(send(proto, type="response.create"))
    assert [t.name for t in cmd.tools] == ["get_weather"] and cmd.tool_choice.mode is ToolMode.REQUIRED
    proto.response_text(cmd.response_id, "Let me look.")
    args = '{"city": "Paris"}'
    assert proto.response_tool_call(cmd.response_id, (ToolCallDelta(0, "call_1", "get_weather", args),)).events == []
    out = proto.response_done(cmd.response_id, ResponseUsage(10, 5, 0))
    kinds = types(out)
    assert kinds == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        *CALL_EVENTS,
        "response.done",
    ]
    events = {e.type: e.body for e in out.events}
    done = events["response.function_call_arguments.done"]
    assert (done["call_id"], done["name"], done["arguments"], done["output_index"]) == (
        "call_1",
        "get_weather",
        args,
        1,
    )
    assert events["response.function_call_arguments.delta"]["delta"] == args
    output = events["response.done"]["response"]["output"]
    assert [o["type"] for o in output] == ["message", "function_call"]
    assert output[1] | {"id": None} == {
        "id": None,
        "object": "realtime.item",
        "type": "function_call",
        "status": "completed",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": args,
    }
    # the client answers the call and asks for the next response: the history holds the call and its result
    out = send(
        proto,
        type="conversation.item.create",
        item={"type": "function_call_output", "call_id": "call_1", "output": '{"temp": 21}'},
    )
    assert types(out) == ["conversation.item.added", "conversation.item.done"]
    assert out.events[0].body["item"]["type"] == "function_call_output"
    cmd = start(send(proto, type="response.create", response={"tool_choice": "auto"}))
    roles = [(m.role, m.content, [c.name for c in m.tool_calls], m.tool_call_id) for m in cmd.messages]
    assert roles[1:] == [
        (Role.USER, "Weather in Paris?", [], None),
        (Role.ASSISTANT, "Let me look.", ["get_weather"], None),
        (Role.TOOL, '{"temp": 21}', [], "call_1"),
    ]
    assert cmd.tool_choice.mode is ToolMode.AUTO


def test_a_cancelled_response_makes_no_calls():
    proto = make()
    text_session(proto, tools=[TOOL])
    user_says(proto, "Weather?")
    cmd = start(send(proto, type="response.create"))
    proto.response_tool_call(cmd.response_id, (ToolCallDelta(0, "call_1", "get_weather", "{}"),))
    out = send(proto, type="response.cancel")
    assert "response.function_call_arguments.done" not in types(out)
    response = next(e for e in out.events if e.type == "response.done").body["response"]
    assert response["status"] == "cancelled" and response["output"] == []  # it said nothing before its cancel
    assert [(i.type.value, i.role.value if i.role else None) for i in proto.conversation.items] == [("message", "user")]


def test_a_reply_that_only_calls_has_no_message_item():
    """As OpenAI's server: a reply's message item comes with its first content, so a reply that only calls a tool
    has its function_call item alone (output_index 0), and the conversation holds no empty assistant message; the
    next response's history is the call, then its result."""
    proto = make()
    text_session(proto, tools=[TOOL], tool_choice="required")
    user_says(proto, "Weather in Paris?")
    cmd = start(send(proto, type="response.create"))
    args = '{"city": "Paris"}'
    proto.response_tool_call(cmd.response_id, (ToolCallDelta(0, "call_1", "get_weather", args),))
    out = proto.response_done(cmd.response_id, ResponseUsage(10, 5, 0))
    assert types(out) == [*CALL_EVENTS, "response.done"]
    assert out.events[0].body["output_index"] == 0 and out.events[0].body["item"]["type"] == "function_call"
    assert [o["type"] for o in out.events[-1].body["response"]["output"]] == ["function_call"]
    assert [i.type.value for i in proto.conversation.items] == ["message", "function_call"]
    send(proto, type="conversation.item.create",
         item={"type": "function_call_output", "call_id": "call_1", "output": "sunny"})  # fmt: skip
    nxt = start(send(proto, type="response.create", response={"tool_choice": "auto"}))
    assert [(m.role, m.content, [c.name for c in m.tool_calls]) for m in nxt.messages][1:] == [
        (Role.USER, "Weather in Paris?", []),
        (Role.ASSISTANT, "", ["get_weather"]),
        (Role.TOOL, "sunny", []),
    ]


def test_a_failed_reply_leaves_no_empty_item_and_an_empty_answer_is_still_one():
    proto = make()
    text_session(proto)
    user_says(proto, "Hi")
    cmd = start(send(proto, type="response.create"))
    failed = proto.response_failed(cmd.response_id, "the prompt does not fit", "context_length_exceeded")
    assert types(failed) == ["response.done"] and failed.events[0].body["response"]["output"] == []
    assert [i.role.value for i in proto.conversation.items] == ["user"]
    cmd = start(send(proto, type="response.create"))
    empty = proto.response_done(cmd.response_id, ResponseUsage(3, 1, 0))  # the model ended at once: said nothing
    assert types(empty)[:3] == ["response.output_item.added", "conversation.item.added", "response.content_part.added"]
    assert [o["type"] for o in empty.events[-1].body["response"]["output"]] == ["message"]


def test_items_go_where_previous_item_id_says_and_can_be_retrieved_and_deleted():
    proto = make()
    text_session(proto)
    first = user_says(proto, "one").events[0].body["item"]["id"]
    third = user_says(proto, "three").events[0].body["item"]["id"]
    out = user_says(proto, "two", previous_item_id=first)
    assert out.events[0].body["previous_item_id"] == first
    system = send(
        proto,
        type="conversation.item.create",
        previous_item_id="root",
        item={"type": "message", "role": "system", "content": [{"type": "input_text", "text": "sys"}]},
    )
    assert system.events[0].body["previous_item_id"] is None
    assistant = send(
        proto,
        type="conversation.item.create",
        item={"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
    )
    assert assistant.events[0].body["previous_item_id"] == third
    assert [m.content for m in proto.conversation.messages()] == ["sys", "one", "two", "three", "ok"]
    got = send(proto, type="conversation.item.retrieve", item_id=first)
    assert types(got) == ["conversation.item.retrieved"] and got.events[0].body["item"]["content"][0]["text"] == "one"
    assert types(send(proto, type="conversation.item.delete", item_id=first)) == ["conversation.item.deleted"]
    assert error_of(send(proto, type="conversation.item.retrieve", item_id=first))["param"] == "item_id"
    call = send(
        proto,
        type="conversation.item.create",
        item={"type": "function_call", "call_id": "c9", "name": "f", "arguments": "{}"},
    )
    assert call.events[0].body["item"] | {"id": None} == {
        "id": None,
        "object": "realtime.item",
        "type": "function_call",
        "status": "completed",
        "call_id": "c9",
        "name": "f",
        "arguments": "{}",
    }


def test_an_out_of_band_response_uses_its_own_input_stays_out_of_the_conversation_and_echoes_metadata():
    proto = make()
    text_session(proto)
    kept = user_says(proto, "in the conversation").events[0].body["item"]["id"]
    before = len(proto.conversation)
    out = send(
        proto,
        type="response.create",
        response={
            "conversation": "none",
            "metadata": {"topic": "summary"},
            "instructions": "Summarize.",
            "input": [
                {"type": "item_reference", "id": kept},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "extra"}]},
            ],
        },
    )
    assert "conversation.item.added" not in types(out)
    cmd = start(out)
    assert [(m.role, m.content) for m in cmd.messages] == [
        (Role.SYSTEM, "Summarize."),
        (Role.USER, "in the conversation"),
        (Role.USER, "extra"),
    ]
    proto.response_text(cmd.response_id, "A summary.")
    done = proto.response_done(cmd.response_id, ResponseUsage())
    assert "conversation.item.done" not in types(done)
    response = next(e for e in done.events if e.type == "response.done").body["response"]
    assert response["metadata"] == {"topic": "summary"} and response["conversation_id"] is None
    assert response["output"][0]["content"][0]["text"] == "A summary."
    assert len(proto.conversation) == before


def test_bad_tools_and_items_are_error_events_naming_the_field():
    proto = make()
    cases = [
        (
            {"type": "session.update", "session": {"tools": [{"type": "function", "name": "bad name"}]}},
            "session.tools[0].name",
        ),
        (
            {"type": "session.update", "session": {"tools": [{"type": "function", "name": "f", "parameters": 3}]}},
            "session.tools[0].parameters",
        ),
        ({"type": "session.update", "session": {"tools": [TOOL], "tool_choice": "sometimes"}}, "session.tool_choice"),
        ({"type": "session.update", "session": {"tool_choice": "required"}}, "session.tool_choice"),
        (
            {"type": "session.update", "session": {"tools": [TOOL], "tool_choice": {"type": "function", "name": "x"}}},
            "session.tool_choice",
        ),
        ({"type": "response.create", "response": {"tool_choice": "required"}}, "response.tool_choice"),
        (
            {
                "type": "session.update",
                "session": {
                    "tools": [{**TOOL, "parameters": {"type": "object", "properties": {"a": {"type": "wat"}}}}],
                    "tool_choice": "required",
                },
            },
            "session.tools[0].parameters",
        ),
        *(  # llguidance's options or a schema's definitions of the wrong type: were a TypeError closing the socket
            (
                {
                    "type": "session.update",
                    "session": {"tools": [{**TOOL, "parameters": parameters}], "tool_choice": "required"},
                },
                "session.tools[0].parameters",
            )
            for parameters in ({"type": "object", "x-guidance": 5}, {"type": "object", "$defs": [1]})
        ),
        ({"type": "response.create", "response": {"conversation": "other"}}, "response.conversation"),
        (
            {"type": "response.create", "response": {"input": [{"type": "item_reference", "id": "nope"}]}},
            "response.input[0].id",
        ),
        ({"type": "conversation.item.create", "item": {"type": "function_call_output", "output": "x"}}, "item.call_id"),
        ({"type": "conversation.item.create", "item": {"type": "reasoning"}}, "item.type"),
    ]
    for event, param in cases:
        error = error_of(send(proto, **event))
        assert error["param"] == param and error["code"] == "invalid_value", (event, error)


def test_an_assistant_audio_item_is_heard_as_its_transcript_and_can_be_truncated():
    import base64

    import numpy as np

    proto = make()
    text_session(proto)
    second = base64.b64encode(np.zeros(24000, "<i2").tobytes()).decode()  # one second of audio/pcm
    out = send(
        proto,
        type="conversation.item.create",
        item={
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_audio", "audio": second, "transcript": "It is sunny."}],
        },
    )
    item = out.events[0].body["item"]
    assert item["content"] == [{"type": "output_audio", "transcript": "It is sunny."}]
    assert [(m.role, m.content) for m in proto.conversation.messages()] == [(Role.ASSISTANT, "It is sunny.")]
    out = send(proto, type="conversation.item.truncate", item_id=item["id"], content_index=0, audio_end_ms=500)
    assert types(out) == ["conversation.item.truncated"]
    assert (
        error_of(send(proto, type="conversation.item.truncate", item_id=item["id"], content_index=0, audio_end_ms=900))[
            "param"
        ]
        == "audio_end_ms"
    )  # past what is left
    send(proto, type="conversation.item.truncate", item_id=item["id"], content_index=0, audio_end_ms=0)
    assert proto.conversation.messages() == []  # nothing of it was heard
    bad = send(
        proto,
        type="conversation.item.create",
        item={"type": "message", "role": "user", "content": [{"type": "output_audio", "transcript": "x"}]},
    )
    assert error_of(bad)["param"] == "item.content[0].type"
