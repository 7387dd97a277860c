"""The remote text backend (family ``openai``) against our own server: the app of ``omni-stream serve`` on a real
uvicorn server on 127.0.0.1 with the tiny native Qwen3 loaded, answering ``POST /v1/chat/completions``.

It runs the text-backend contract (the reference is the same server's ``stream: false`` answer), then loading,
credentials and connection failures. What our server cannot show (raw prompts through ``/v1/completions``,
``/tokenize``, upstream faults mid-stream) is tested against a stand-in in ``test_text_remote_standin.py``; the
same backend runs against a real ``vllm serve`` in the vLLM tier (``test_text_vllm.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

import anyio
import httpx
import pytest
import pytest_asyncio
from lm_helpers import tiny_lm_checkpoint
from serving_helpers import LiveServer, text_server
from text_backend_contract import CHECKS, Reference, TextBackend, chat, check_id, reply

from omni_stream.engine import AsyncEngine
from omni_stream.errors import ConfigError, UpstreamError
from omni_stream.realtime.settings import Settings
from omni_stream.requests import TextRequest


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with text_server(tiny_lm_checkpoint(tmp_path_factory, "qwen3"), max_batch_size=128) as live:
        yield live


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = Settings(api_key="sesame", enable_benchmark_fields=True)
    with text_server(tiny_lm_checkpoint(tmp_path_factory, "qwen3"), settings) as live:
        yield live


@pytest_asyncio.fixture
async def engine(server: LiveServer) -> AsyncIterator[AsyncEngine]:
    async with await AsyncEngine.from_pretrained(llm_endpoint=server.url, progress=False) as engine:
        yield engine


def served_model(server: LiveServer) -> str:
    return server.engine.models.text().info.model_name


def remote_backend(engine: AsyncEngine, server: LiveServer) -> TextBackend:
    async def reference(request: TextRequest) -> Reference:
        """The same request, not streamed (``stream: false``), from the same server."""
        body = {
            "model": served_model(server),
            "messages": [{"role": m.role.value, "content": m.content} for m in request.messages],
            "max_tokens": request.max_tokens,
            "temperature": 0.0,
            "ignore_eos": request.ignore_eos,
        }
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            answer = (await client.post("/v1/chat/completions", json=body)).json()
        usage = answer["usage"]
        return Reference(answer["choices"][0]["message"]["content"], usage["prompt_tokens"], usage["completion_tokens"])

    async def assert_idle() -> None:
        # the server learns of a closed connection on its own schedule: wait (bounded) for its scheduler to empty
        live = await anyio.to_thread.run_sync(lambda: server.wait_idle(kind="text"))
        assert not any(live.values()), live
        assert server.engine.models.text().runner.num_active == 0

    return TextBackend(engine, assert_idle, reference)


# --- the text-backend contract --------------------------------------------------------------------------------


@pytest.mark.parametrize("check", CHECKS, ids=check_id)
async def test_remote_backend_meets_the_contract_against_our_server(engine, server, check):
    backend = remote_backend(engine, server)
    await check(backend)
    await backend.assert_idle()


def disconnects(server: LiveServer) -> float:
    value = server.state.metrics.registry.get_sample_value(
        "omni_stream_client_disconnects_total", {"transport": "chat"}
    )
    return value or 0.0


async def test_closing_the_stream_is_a_client_disconnect_on_the_server(engine, server):
    before = disconnects(server)
    backend = remote_backend(engine, server)
    async with engine.chat(backend.long_request()) as stream:
        await anext(aiter(stream))
    await backend.assert_idle()
    assert disconnects(server) == before + 1  # the server saw its client leave, not a finished stream


async def test_a_request_left_running_is_seen_by_the_idle_check(engine, server):
    """The idle check above can fail: while a stream is open, the server's scheduler holds its request."""
    backend = remote_backend(engine, server)
    async with engine.chat(backend.long_request()) as stream:
        await anext(aiter(stream))
        assert any(server.engine.models.text().scheduler.live().values())
    await backend.assert_idle()


# --- loading ------------------------------------------------------------------------------------------------


async def test_model_name_and_context_come_from_the_servers_model_list(engine, server):
    info, served = engine.models.text().info, server.engine.models.text().info
    assert (info.model_name, info.model_type, info.kind) == (served.model_name, "openai", "text")
    assert info.max_context == served.max_context  # read from max_model_len of GET /v1/models


async def test_an_endpoint_ending_in_v1_names_the_same_server(server):
    async with await AsyncEngine.from_pretrained(llm_endpoint=server.url + "/v1/", progress=False) as engine:
        got = await reply(engine, chat(max_tokens=3))
    assert got.usage.output_tokens > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"model": "nope"}, "does not serve model 'nope'"),
        ({"temperature": 0.5}, "unknown options for the OpenAI-compatible backend: temperature"),
    ],
)
async def test_bad_settings_fail_at_load(server, args, message):
    with pytest.raises(ConfigError, match=message):
        await AsyncEngine.from_pretrained(llm_endpoint=server.url, backend_args=args, progress=False)


async def test_an_unreachable_endpoint_fails_at_load():
    with pytest.raises(ConfigError, match="cannot reach"):
        await AsyncEngine.from_pretrained(llm_endpoint="http://127.0.0.1:9", progress=False)


async def test_the_api_key_is_sent_and_a_wrong_one_is_a_server_error(keyed):
    with pytest.raises(ConfigError, match="401"):
        await AsyncEngine.from_pretrained(llm_endpoint=keyed.url, progress=False)
    args = {"api_key": "sesame"}
    async with await AsyncEngine.from_pretrained(llm_endpoint=keyed.url, backend_args=args, progress=False) as engine:
        assert (await reply(engine, chat(max_tokens=3))).usage.output_tokens == 3
    # no model list read: the request itself is refused
    wrong = {"api_key": "guess", "model": served_model(keyed), "max_context": 64}
    async with await AsyncEngine.from_pretrained(llm_endpoint=keyed.url, backend_args=wrong, progress=False) as engine:
        with pytest.raises(UpstreamError) as info:
            await reply(engine, chat(max_tokens=3))
    assert info.value.status == 401


async def test_a_refused_connection_is_a_server_error(tmp_path_factory):
    with text_server(tiny_lm_checkpoint(tmp_path_factory, "qwen3")) as gone:
        engine = await AsyncEngine.from_pretrained(llm_endpoint=gone.url, progress=False)
    async with engine:  # the server is gone now
        with pytest.raises(UpstreamError, match="cannot reach"):
            await reply(engine, chat(max_tokens=3))


async def test_more_concurrent_streams_than_a_default_connection_pool_all_stream_at_once(engine, server):
    """110 streams open at once (httpx's default pool holds 100 connections): each gets its first delta while
    every other one is still open, so none waits for another's connection."""
    streams = [engine.chat(chat(max_tokens=200, ignore_eos=True), timeout=60) for _ in range(110)]
    firsts: list = []

    async def first(stream) -> None:
        firsts.append((await anext(aiter(stream))).chunk)

    async with contextlib.AsyncExitStack() as stack:
        for stream in streams:
            await stack.enter_async_context(stream)
        async with anyio.create_task_group() as tg:
            for stream in streams:
                tg.start_soon(first, stream)
    assert len(firsts) == 110 and all(d.text and not d.final for d in firsts)
    await remote_backend(engine, server).assert_idle()


# --- tools, structured output and the sampling fields pass through ------------------------------------------


async def test_tools_formats_penalties_and_logprobs_pass_through_to_the_server(engine):
    import json

    import jsonschema

    from omni_stream.requests import ChatMessage, Role
    from omni_stream.text.tools import (
        FormatKind,
        FunctionTool,
        ResponseFormat,
        ToolCall,
        ToolChoice,
        ToolMode,
        assemble,
    )

    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"],
        "additionalProperties": False,
    }
    tools = (FunctionTool("pick", None, json.dumps(schema)),)
    ask = (ChatMessage(Role.USER, "Pick a number."),)
    request = TextRequest(
        messages=ask,
        tools=tools,
        tool_choice=ToolChoice(ToolMode.REQUIRED),
        max_tokens=100,
        parallel_tool_calls=False,
        seed=1,
    )
    async with engine.chat(request) as stream:
        deltas = [out.chunk async for out in stream]
    calls = assemble([c for d in deltas for c in d.tool_calls])
    assert deltas[-1].finish_reason == "tool_calls" and [c.name for c in calls] == ["pick"]
    jsonschema.validate(json.loads(calls[0].arguments), schema)
    # the call and its result go back in the history; the JSON reply and log-probabilities come through
    history = (
        *ask,
        ChatMessage(Role.ASSISTANT, "", tool_calls=(ToolCall(calls[0].id, "pick", calls[0].arguments),)),
        ChatMessage(Role.TOOL, "ok", tool_call_id=calls[0].id),
    )
    request = TextRequest(
        messages=history,
        tools=tools,
        max_tokens=60,
        logprobs=2,
        presence_penalty=1.0,
        seed=1,
        response_format=ResponseFormat(FormatKind.JSON_SCHEMA, json.dumps(schema)),
    )
    async with engine.chat(request) as stream:
        deltas = [out.chunk async for out in stream]
    jsonschema.validate(json.loads("".join(d.text for d in deltas)), schema)
    entries = [e for d in deltas for e in d.logprobs]
    assert entries and all(len(e.top) == 2 for e in entries)
