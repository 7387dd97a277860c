"""Tool calls in text: the chat templates of the tiny Qwen3 and Llama checkpoints render tools, calls and results as
transformers renders the OpenAI-shaped conversation, and the parsers read back what the templates write."""

from __future__ import annotations

import json
import random

import pytest
from lm_helpers import tiny_lm_checkpoint
from transformers import AutoTokenizer

from omni_stream.models.causal_lm.tokenizer import ChatTokenizer
from omni_stream.requests import ChatMessage, Role, TextRequest
from omni_stream.text.tool_parsers import ToolCallParser, ToolFormat
from omni_stream.text.tools import FunctionTool, ToolCall, ToolChoice, ToolMode

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"],
}
TOOLS = (
    FunctionTool("get_weather", "The weather in a city", json.dumps(WEATHER)),
    FunctionTool("get_time", None, json.dumps({"type": "object", "properties": {"tz": {"type": "string"}}})),
)
CALLS = (
    ToolCall("call_1", "get_weather", json.dumps({"city": "Paris", "unit": "c"})),
    ToolCall("call_2", "get_time", json.dumps({"tz": "Europe/Paris"})),
)
CONVERSATION = (
    ChatMessage(Role.SYSTEM, "Be brief."),
    ChatMessage(Role.USER, "Weather and time in Paris?"),
    ChatMessage(Role.ASSISTANT, "Let me look.", tool_calls=CALLS),
    ChatMessage(Role.TOOL, '{"temp": 21}', tool_call_id="call_1"),
    ChatMessage(Role.TOOL, "14:05", tool_call_id="call_2"),
    ChatMessage(Role.ASSISTANT, "21 degrees at 14:05."),
    ChatMessage(Role.USER, "And tomorrow?"),
    ChatMessage(Role.ASSISTANT, "", tool_calls=CALLS[:1]),
    ChatMessage(Role.TOOL, '{"temp": 18}', tool_call_id="call_1"),
)
# The same conversation as an OpenAI SDK user hands it to transformers (arguments as objects, as its docs say).
OPENAI_MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather and time in Paris?"},
    {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
            for c in CALLS
        ],
    },
    {"role": "tool", "content": '{"temp": 21}', "tool_call_id": "call_1"},
    {"role": "tool", "content": "14:05", "tool_call_id": "call_2"},
    {"role": "assistant", "content": "21 degrees at 14:05."},
    {"role": "user", "content": "And tomorrow?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.loads(CALLS[0].arguments)},
            }
        ],
    },
    {"role": "tool", "content": '{"temp": 18}', "tool_call_id": "call_1"},
]
OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The weather in a city", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}},
    },
]
FORMATS = {"qwen3": ToolFormat.HERMES, "llama": ToolFormat.LLAMA_JSON}


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_tools_calls_and_results_render_as_transformers_renders_them(tmp_path_factory, arch):
    path = tiny_lm_checkpoint(tmp_path_factory, arch)
    ours = ChatTokenizer(path).encode(TextRequest(messages=CONVERSATION, tools=TOOLS))
    theirs = AutoTokenizer.from_pretrained(str(path)).apply_chat_template(
        OPENAI_MESSAGES, tools=OPENAI_TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert ours == list(theirs)
    text = AutoTokenizer.from_pretrained(str(path)).decode(ours)
    assert '"name": "get_weather"' in text and '"city": "Paris"' in text and "get_time" in text


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_without_tools_or_under_tool_choice_none_the_prompt_is_the_plain_chat(tmp_path_factory, arch):
    path = tiny_lm_checkpoint(tmp_path_factory, arch)
    tok = ChatTokenizer(path)
    plain = (ChatMessage(Role.SYSTEM, "Be brief."), ChatMessage(Role.USER, "Hi"))
    none = TextRequest(messages=plain, tools=TOOLS, tool_choice=ToolChoice(ToolMode.NONE))
    reference = AutoTokenizer.from_pretrained(str(path)).apply_chat_template(
        [m.template() for m in plain], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert tok.encode(TextRequest(messages=plain)) == tok.encode(none) == list(reference)


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_the_parser_reads_back_the_calls_the_template_writes_in_any_chunking(tmp_path_factory, arch):
    path = tiny_lm_checkpoint(tmp_path_factory, arch)
    hf = AutoTokenizer.from_pretrained(str(path))
    content = "Let me look." if arch == "qwen3" else ""  # a Llama JSON reply is the calls alone
    history = [{"role": "user", "content": "x"}]
    reply = {"role": "assistant", "content": content, "tool_calls": OPENAI_MESSAGES[2]["tool_calls"]}
    before = hf.apply_chat_template(history, tools=OPENAI_TOOLS, add_generation_prompt=True, tokenize=False)
    after = hf.apply_chat_template([*history, reply], tools=OPENAI_TOOLS, tokenize=False)
    assert after.startswith(before)
    end = "<|im_end|>" if arch == "qwen3" else "<|eot_id|>"
    written = after[len(before) :].removesuffix("\n").removesuffix(end)
    rng = random.Random(0)
    for _ in range(20):
        parser = ToolCallParser(FORMATS[arch])
        cuts = sorted(rng.sample(range(1, len(written)), 6))
        shown, calls = "", []
        for piece in (written[a:b] for a, b in zip([0, *cuts], [*cuts, len(written)], strict=True)):
            text, got = parser.push(piece)
            shown, calls = shown + text, calls + got
        text, got = parser.finish()
        shown, calls = shown + text, calls + got
        assert shown.strip() == content
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [(c.name, json.loads(c.arguments)) for c in CALLS]
        assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)


def test_text_that_is_not_a_call_is_given_back_whole():
    parser = ToolCallParser(ToolFormat.HERMES)
    text, calls = parser.push("a <tool_ca")
    assert (text, calls) == ("a ", [])
    text, calls = parser.push("ll>\nnot json\n</tool_call> b <tool")
    assert text == "<tool_call>\nnot json\n</tool_call> b " and not calls
    assert parser.finish() == ("<tool", [])
    llama = ToolCallParser(ToolFormat.LLAMA_JSON)
    assert llama.push("  {oops") == ("", [])
    assert llama.finish() == ("  {oops", [])
    plain = ToolCallParser(ToolFormat.LLAMA_JSON)
    assert plain.push(" Hello {") == (" Hello {", [])


def test_the_newline_between_calls_is_no_text_however_the_pieces_come():
    """A reply of two calls shows no text at all: the template's newline after a call is dropped whichever push it
    comes in (a model writes "</tool_call>" and "\\n" as two tokens; it leaked as a "\\n" content delta)."""
    one = '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>'
    written = one + "\n" + one.replace('"a"', '"b"') + "\n"
    tokens = ["<tool_call>", "\n", '{"name": "a", "arguments": {}}', "\n", "</tool_call>", "\n",
              "<tool_call>", "\n", '{"name": "b", "arguments": {}}', "\n", "</tool_call>", "\n"]  # fmt: skip
    chunkings = [tokens, [written], *([written[:i], written[i:]] for i in range(1, len(written)))]
    for pieces in chunkings:
        parser = ToolCallParser(ToolFormat.HERMES)
        shown, names = "", []
        for piece in pieces:
            text, calls = parser.push(piece)
            shown, names = shown + text, names + [c.name for c in calls]
        text, calls = parser.finish()
        shown, names = shown + text, names + [c.name for c in calls]
        assert (shown, names) == ("", ["a", "b"]), pieces
    # text after a call keeps its own newlines: only the one separator goes
    parser = ToolCallParser(ToolFormat.HERMES)
    text, calls = parser.push(one)
    assert text == "" and [c.name for c in calls] == ["a"]
    assert parser.push("\n\nDone.") == ("\nDone.", [])


def test_without_parallel_calls_only_the_first_is_kept():
    parser = ToolCallParser(ToolFormat.HERMES, parallel=False)
    one = '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
    _, calls = parser.push(one + one.replace('"a"', '"b"'))
    assert [c.name for c in calls] == ["a"]


async def test_a_call_the_reply_ran_out_of_tokens_in_is_neither_a_call_nor_text_to_speak():
    from omni_stream.chunks import TextDelta
    from omni_stream.text.stage import with_tool_calls

    parser = ToolCallParser(ToolFormat.HERMES)
    assert parser.push('Sure. <tool_call>\n{"name": "get_weather", "argu') == ("Sure. ", [])
    assert parser.finish() == ('<tool_call>\n{"name": "get_weather", "argu', [])
    assert parser.cut_call == '<tool_call>\n{"name": "get_weather", "argu'
    whole = ToolCallParser(ToolFormat.HERMES)
    whole.push("<tool_ca")
    assert whole.finish() == ("<tool_ca", []) and whole.cut_call == ""  # held back, never a call: plain text
    llama = ToolCallParser(ToolFormat.LLAMA_JSON)
    assert llama.push('{"name": "get_weather", "parameters": {"city": "Par') == ("", [])
    assert llama.finish()[0] == llama.cut_call == '{"name": "get_weather", "parameters": {"city": "Par'
    plain = ToolCallParser(ToolFormat.LLAMA_JSON)
    plain.push("Sunny.")
    assert plain.finish() == ("", []) and plain.cut_call == ""

    pieces = ["Sure. ", "<tool_call>", '\n{"name": "get_weather", ', '"argu']

    async def stage(ctx, upstream):
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            yield TextDelta(piece, index=i, final=last, finish_reason="length" if last else None)

    out = [d async for d in with_tool_calls(stage, ToolFormat.HERMES)(None, None)]
    assert "".join(d.text for d in out) == "Sure. "  # what a spoken reply speaks
    assert out[-1].final and out[-1].finish_reason == "length" and not out[-1].tool_calls
    assert out[-1].cut_call == '<tool_call>\n{"name": "get_weather", "argu'  # a chat completion's content ends with it
