"""Constrained decoding on the native text model (the tiny random Qwen3 and Llama): forced tool calls and JSON output
always follow their schema, whatever the seed; a constrained row beside a free one leaves the free row's tokens as
they are alone; logit bias, penalties and log-probabilities on the device; bad schemas are refused by field."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from lm_helpers import drive, load_tiny, tiny_lm_checkpoint

from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.errors import InvalidRequestError
from omni_stream.family import ModelKind
from omni_stream.models.causal_lm.constraint import Grammars
from omni_stream.models.causal_lm.family import TOOL_FORMATS
from omni_stream.requests import GREEDY, ChatMessage, Role, SamplingParams, TextRequest
from omni_stream.text.grammar import request_grammar
from omni_stream.text.tools import FormatKind, FunctionTool, ResponseFormat, ToolChoice, ToolMode, assemble

# Bounded values only: a random model inside an unbounded string would write until its token budget ran out.
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Rome", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "metric": {"type": "boolean"},
        "note": {"type": "string", "maxLength": 6},
    },
    "required": ["city", "days", "metric", "note"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"utc": {"type": "boolean"}},
    "required": ["utc"],
    "additionalProperties": False,
}
TOOLS = (FunctionTool("get_weather", "Weather", json.dumps(WEATHER)), FunctionTool("get_time", None, json.dumps(TIME)))
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ANSWER = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "score": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["answer", "score"],
    "additionalProperties": False,
}
SEEDS = range(12)
SELF_REFERENCE = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}


def ask(**fields) -> TextRequest:
    return TextRequest(messages=(ChatMessage(Role.USER, "What is the weather in Paris?"),), **fields)


async def load(path) -> AsyncEngine:
    return await AsyncEngine.load({"llm": ModelSource(path, kind=ModelKind.TEXT)}, progress=False, max_batch_size=16)


async def run(engine: AsyncEngine, request: TextRequest):
    async with engine.chat(request) as stream:
        return [out.chunk async for out in stream]


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def arch(request):
    return request.param


@pytest.fixture(scope="module")
def path(tmp_path_factory, arch):
    return tiny_lm_checkpoint(tmp_path_factory, arch)


async def test_a_required_tool_call_is_valid_against_its_schema_for_every_seed(path):
    async with await load(path) as engine:
        for choice in (ToolChoice(ToolMode.REQUIRED), ToolChoice(ToolMode.FUNCTION, "get_time")):
            requests = [
                ask(
                    tools=TOOLS,
                    tool_choice=choice,
                    parallel_tool_calls=False,
                    max_tokens=120,
                    seed=seed,
                    sampling=SamplingParams(temperature=1.0, top_k=0),
                )
                for seed in SEEDS
            ]
            async with anyio_group() as results:
                for request in requests:
                    results.start(run(engine, request))
            for deltas in results.values:
                calls = assemble([c for d in deltas for c in d.tool_calls])
                assert deltas[-1].finish_reason == "tool_calls", "".join(d.text for d in deltas)
                assert len(calls) == 1 and "".join(d.text for d in deltas).strip() == ""
                call = calls[0]
                if choice.name is not None:
                    assert call.name == choice.name
                jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


async def test_json_schema_and_json_object_replies_parse_and_validate_for_every_seed(path):
    schema = ResponseFormat(FormatKind.JSON_SCHEMA, json.dumps(ANSWER), "answer")
    async with await load(path) as engine:
        for seed in SEEDS:
            deltas = await run(
                engine,
                ask(
                    response_format=schema, max_tokens=60, seed=seed, sampling=SamplingParams(temperature=1.0, top_k=0)
                ),
            )
            assert deltas[-1].finish_reason == "stop"
            jsonschema.validate(json.loads("".join(d.text for d in deltas)), ANSWER)
        deltas = await run(
            engine, ask(response_format=ResponseFormat(FormatKind.JSON_OBJECT), max_tokens=200, sampling=GREEDY)
        )
        text = "".join(d.text for d in deltas)
        if deltas[-1].finish_reason == "stop":  # greedy random weights may also run out of tokens inside a key
            assert isinstance(json.loads(text), dict)
        else:
            assert text.startswith("{")


def test_a_constrained_row_beside_a_free_one_leaves_the_free_rows_tokens_as_they_are_alone(tmp_path_factory, arch):
    import anyio

    tiny = load_tiny(tiny_lm_checkpoint(tmp_path_factory, arch))
    grammars = Grammars(tiny.tokenizer.hf, tiny.runner(1).vocab, tiny.eos)
    lark = request_grammar(
        TOOLS,
        ToolChoice(ToolMode.REQUIRED),
        ResponseFormat(),
        TOOL_FORMATS[arch],
        False,
        tiny.tokenizer.is_token("<tool_call>"),
    )
    assert lark is not None
    sampled = SamplingParams(temperature=1.0, top_k=0)

    def requests():
        free = tiny.request("Tell me a story.", max_tokens=24, sampling=sampled, seed=5, ignore_eos=True)
        forced = tiny.request("Weather?", max_tokens=200, sampling=sampled, seed=9, matcher=grammars.matcher(lark, "x"))
        greedy = tiny.request("Hello", max_tokens=24, sampling=GREEDY, ignore_eos=True)
        return free, forced, greedy

    runner = tiny.runner(slots=4)
    free, forced, greedy = requests()
    alone = [anyio.run(drive, runner, [r]) for r in (free, greedy)]
    forced_alone = anyio.run(drive, runner, [forced])[0]
    free, forced, greedy = requests()
    together = anyio.run(drive, runner, [free, forced, greedy], [0, 1, 0])
    assert together[0].tokens == alone[0][0].tokens and together[2].tokens == alone[1][0].tokens
    assert together[1].tokens == forced_alone.tokens  # and the constrained row is the same beside free ones
    assert forced_alone.finish_reason == "stop" and forced_alone.tokens[-1] in tiny.eos


def test_logit_bias_and_penalties_steer_tokens_and_logprobs_are_the_models(tmp_path_factory, arch):
    import anyio

    tiny = load_tiny(tiny_lm_checkpoint(tmp_path_factory, arch))
    runner = tiny.runner(slots=4)
    base = anyio.run(drive, runner, [tiny.request("Hi", max_tokens=12, sampling=GREEDY, ignore_eos=True)])[0]
    banned = base.tokens[0]
    biased = anyio.run(
        drive,
        runner,
        [tiny.request("Hi", max_tokens=12, sampling=GREEDY, ignore_eos=True, logit_bias=((banned, -100.0),))],
    )[0]
    assert banned not in biased.tokens
    forced = anyio.run(
        drive, runner, [tiny.request("Hi", max_tokens=6, sampling=GREEDY, ignore_eos=True, logit_bias=((200, 100.0),))]
    )[0]
    assert forced.tokens == [200] * 6
    repeat = anyio.run(
        drive,
        runner,
        [
            tiny.request(
                "Hi",
                max_tokens=6,
                sampling=GREEDY,
                ignore_eos=True,
                logit_bias=((200, 100.0),),
                frequency_penalty=2.0,
                presence_penalty=2.0,
            )
        ],
    )[0]
    assert repeat.tokens == [200] * 6  # +100 outweighs 2 * count + 2
    free = anyio.run(
        drive,
        runner,
        [
            tiny.request(
                "Hi", max_tokens=12, sampling=GREEDY, ignore_eos=True, logit_bias=((200, 5.0),), frequency_penalty=2.0
            )
        ],
    )[0]
    assert free.tokens.count(200) < 12
    lp = anyio.run(drive, runner, [tiny.request("Hi", max_tokens=4, sampling=GREEDY, ignore_eos=True, logprobs=3)])[0]
    assert lp.tokens == base.tokens[:4]
    entries = [e for d in lp.deltas for e in d.logprobs]
    assert len(entries) == 4
    for token, entry in zip(lp.tokens, entries, strict=True):
        assert len(entry.top) == 3 and entry.top[0][1] >= entry.top[1][1] >= entry.top[2][1]
        assert entry.token == tiny.tokenizer.decode([token]) and abs(entry.logprob - entry.top[0][1]) < 1e-5
    # against the model's own distribution at the first step
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny.path, dtype=torch.float32)
    ids = torch.tensor([tiny.request("Hi", sampling=GREEDY).prompt_ids])
    with torch.no_grad():
        ref = model(ids).logits[0, -1].log_softmax(-1)
    assert abs(ref[lp.tokens[0]].item() - entries[0].logprob) < 1e-4


# A tool whose argument is a model of its own, as pydantic writes it: "$defs" at its root, referenced from inside
LOCATED = {
    "$defs": {"Loc": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
                      "additionalProperties": False}},
    "type": "object",
    "properties": {"where": {"$ref": "#/$defs/Loc"}, "days": {"type": "integer", "minimum": 1, "maximum": 3}},
    "required": ["where", "days"],
    "additionalProperties": False,
}  # fmt: skip


async def test_a_forced_call_of_a_tool_with_definitions_is_valid_and_a_named_one_is_called_once(path):
    """The call schema nests a tool's arguments, so their "#/$defs/..." references are kept valid by moving the
    definitions to the grammar's root (a pydantic model argument failed every forced call: "Pointer '/$defs/Loc'
    does not exist"); a named tool_choice is one call even where parallel calls are on (vLLM's rule); and a
    response_format beside a forced call is no refusal: the call wins, as vLLM lets it."""
    located = FunctionTool("locate", None, json.dumps(LOCATED))
    tools = (located, TOOLS[1])  # the tiny model's context holds two tools' schemas
    fmt = ResponseFormat(FormatKind.JSON_SCHEMA, json.dumps(ANSWER))
    async with await load(path) as engine:
        for choice in (ToolChoice(ToolMode.REQUIRED), ToolChoice(ToolMode.FUNCTION, "locate")):
            for seed in range(6):
                request = ask(tools=tools, tool_choice=choice, max_tokens=120, seed=seed, response_format=fmt,
                              sampling=SamplingParams(temperature=1.0, top_k=0))  # fmt: skip
                deltas = await run(engine, request)
                calls = assemble([c for d in deltas for c in d.tool_calls])
                assert calls and deltas[-1].finish_reason == "tool_calls", "".join(d.text for d in deltas)
                if choice.name is not None:
                    assert [c.name for c in calls] == ["locate"]  # once, though parallel calls are on
                for call in calls:
                    schema = LOCATED if call.name == "locate" else SCHEMAS[call.name]
                    jsonschema.validate(json.loads(call.arguments), schema)
    named = request_grammar(tools, ToolChoice(ToolMode.FUNCTION, "locate"), ResponseFormat(), TOOL_FORMATS["qwen3"])
    assert named is not None and named.startswith("start: call\n")
    clash = FunctionTool("other", None, json.dumps({**LOCATED, "$defs": {"Loc": {"type": "string"}}}))
    with pytest.raises(InvalidRequestError, match=r"\$defs/Loc differently") as refused:
        request_grammar((located, clash), ToolChoice(ToolMode.REQUIRED), ResponseFormat(), TOOL_FORMATS["qwen3"])
    assert refused.value.param == "tools"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"response_format": ResponseFormat(FormatKind.JSON_SCHEMA, json.dumps({"type": "nonsense"}))},
            "response_format",
        ),
        (
            {
                "tools": (
                    FunctionTool("f", None, json.dumps({"type": "object", "properties": {"a": {"type": "wat"}}})),
                ),
                "tool_choice": ToolChoice(ToolMode.REQUIRED),
            },
            "tools",
        ),
        ({"logit_bias": ((10**6, 1.0),)}, "logit_bias"),
        (  # llguidance's own options, not an object: was a TypeError inside the text stage
            {"response_format": ResponseFormat(FormatKind.JSON_SCHEMA, json.dumps({"x-guidance": 5}))},
            "response_format",
        ),
        (
            {
                "tools": (FunctionTool("f", None, json.dumps({"type": "object", "$defs": [1]})),),
                "tool_choice": ToolChoice(ToolMode.REQUIRED),
            },
            "tools",
        ),
        (  # a Python caller's lone surrogate (the JSON readers refuse it before)
            {"response_format": ResponseFormat(FormatKind.JSON_SCHEMA, json.dumps({"const": "\ud800"}))},
            "response_format",
        ),
        (  # no value at all: the reply ended empty with finish_reason "stop", a forced call without a call
            {"response_format": ResponseFormat(FormatKind.JSON_SCHEMA, json.dumps(SELF_REFERENCE))},
            "response_format",
        ),
        (
            {
                "tools": (FunctionTool("f", None, json.dumps(SELF_REFERENCE)),),
                "tool_choice": ToolChoice(ToolMode.REQUIRED),
            },
            "tools",
        ),
    ],
    ids=["schema", "tool-schema", "bias-id", "x-guidance", "defs-list", "surrogate", "self-ref", "tool-self-ref"],
)
async def test_a_schema_that_cannot_be_enforced_is_refused_naming_the_field(path, fields, param):
    async with await load(path) as engine:
        with pytest.raises(InvalidRequestError) as err:
            await run(engine, ask(**fields))
        assert err.value.param == param


class anyio_group:
    def __init__(self) -> None:
        self.values: list = []

    async def __aenter__(self):
        import anyio

        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    def start(self, coro) -> None:
        index = len(self.values)
        self.values.append(None)

        async def keep() -> None:
            self.values[index] = await coro

        self._tg.start_soon(keep)

    async def __aexit__(self, *exc):
        return await self._tg.__aexit__(*exc)
