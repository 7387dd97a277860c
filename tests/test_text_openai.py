"""The remote text backend (family ``openai``) against a real OpenAI-compatible server on 127.0.0.1.

The server here is the STAND-IN of ``openai_standin.py`` (a Starlette app in vLLM's exact wire shapes over an
omni-stream engine with the synthetic LM), until ``omni-stream serve`` answers ``/v1/chat/completions``. The same
backend runs against a real ``vllm serve`` in the vLLM tier (``test_text_vllm.py``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator

import anyio
import httpx
import pytest
import pytest_asyncio
from openai_standin import MAX_CONTEXT, MODEL, StandIn, running_standin
from text_backend_checks import (
    Backend,
    Reference,
    chat,
    check_cancelling_the_consumer_aborts,
    check_close_aborts,
    check_deltas_join_to_the_reference_with_usage,
    check_engine_abort_by_id,
    check_finish_reason_length_at_max_tokens,
    check_finish_reason_stop_at_a_stop_string,
    check_greedy_is_deterministic,
    check_invalid_requests_raise_before_any_delta,
    check_random_aborts_leave_nothing,
    run,
)

from omni_stream.engine import AsyncEngine
from omni_stream.errors import ConfigError, DeadlineExceeded, InvalidRequestError, UpstreamError
from omni_stream.requests import TextRequest

SAID = "one two three four five six seven eight"


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIn]:
    with running_standin(tmp_path_factory.mktemp("standin")) as server:
        yield server


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIn]:
    with running_standin(tmp_path_factory.mktemp("keyed"), api_key="sesame") as server:
        yield server


@pytest_asyncio.fixture
async def engine(standin: StandIn) -> AsyncIterator[AsyncEngine]:
    async with await AsyncEngine.from_pretrained(llm_endpoint=standin.url, progress=False) as engine:
        yield engine


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def make_backend(engine: AsyncEngine, standin: StandIn) -> Backend:
    async def reference(request: TextRequest) -> Reference:
        """The same request, not streamed (``stream: false``), from the same server."""
        body: dict = {"model": MODEL, "stream": False, "max_tokens": request.max_tokens}
        body["ignore_eos"] = request.ignore_eos
        if request.prompt is not None:
            path, body["prompt"] = "/v1/completions", request.prompt
        else:
            path = "/v1/chat/completions"
            body["messages"] = [{"role": m.role.value, "content": m.content} for m in request.messages]
        async with httpx.AsyncClient(base_url=standin.url) as client:
            answer = (await client.post(path, json=body)).json()
        choice = answer["choices"][0]
        text = choice["message"]["content"] if "message" in choice else choice["text"]
        return Reference(text, answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"])

    async def assert_idle() -> None:
        ends = await anyio.to_thread.run_sync(standin.wait_streams_ended)
        assert "running" not in ends.values(), ends
        idle = await anyio.to_thread.run_sync(lambda: wait_for(lambda: not any(standin.live().values())))
        assert idle, standin.live()

    return Backend(engine, reference, assert_idle, lambda: chat("word " * 20, max_tokens=200, ignore_eos=True))


# --- the shared text-backend checks ---------------------------------------------------------------------------


async def test_deltas_join_to_the_whole_reply_with_the_servers_usage(engine, standin):
    await check_deltas_join_to_the_reference_with_usage(make_backend(engine, standin), chat(SAID))


async def test_a_raw_prompt_streams_through_completions(engine, standin):
    await check_deltas_join_to_the_reference_with_usage(make_backend(engine, standin), TextRequest(prompt=SAID))


async def test_greedy_is_deterministic(engine, standin):
    await check_greedy_is_deterministic(make_backend(engine, standin), chat(SAID))


async def test_finish_reason_is_length_at_max_tokens(engine, standin):
    await check_finish_reason_length_at_max_tokens(make_backend(engine, standin), chat(SAID), max_tokens=5)


async def test_finish_reason_is_stop_at_a_stop_string(engine, standin):
    await check_finish_reason_stop_at_a_stop_string(make_backend(engine, standin), chat("alpha beta gamma delta eps"))


async def test_closing_the_stream_disconnects_and_the_server_aborts(engine, standin):
    before = set(standin.streams)
    await check_close_aborts(make_backend(engine, standin))
    ended = {k: v for k, v in standin.streams.items() if k not in before}
    assert list(ended.values()) == ["client gone"], ended


async def test_cancelling_the_reader_disconnects(engine, standin):
    before = set(standin.streams)
    await check_cancelling_the_consumer_aborts(make_backend(engine, standin))
    assert [v for k, v in standin.streams.items() if k not in before] == ["client gone"]


async def test_engine_abort_by_id_disconnects(engine, standin):
    before = set(standin.streams)
    await check_engine_abort_by_id(make_backend(engine, standin))
    assert [v for k, v in standin.streams.items() if k not in before] == ["client gone"]


async def test_random_aborts_leave_no_request_upstream(engine, standin):
    await check_random_aborts_leave_nothing(make_backend(engine, standin))


async def test_invalid_requests_raise_before_any_delta(engine, standin):
    # max_tokens past the context is caught here; the over-long prompt by the server (a 400 passed on).
    await check_invalid_requests_raise_before_any_delta(make_backend(engine, standin), "word " * (MAX_CONTEXT + 1))


# --- loading ------------------------------------------------------------------------------------------------


async def test_model_name_and_context_come_from_the_servers_model_list(engine):
    info = engine.models.text().info
    assert (info.model_name, info.model_type, info.kind, info.max_context) == (MODEL, "openai", "text", MAX_CONTEXT)


async def test_an_endpoint_ending_in_v1_names_the_same_server(standin):
    async with await AsyncEngine.from_pretrained(llm_endpoint=standin.url + "/v1/", progress=False) as engine:
        deltas, _ = await run(engine, chat("a b"))
    assert "".join(d.text for d in deltas) == "a b"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"model": "nope"}, "does not serve model 'nope'"),
        ({"temperature": 0.5}, "unknown options for the OpenAI-compatible backend: temperature"),
    ],
)
async def test_bad_settings_fail_at_load(standin, args, message):
    with pytest.raises(ConfigError, match=message):
        await AsyncEngine.from_pretrained(llm_endpoint=standin.url, backend_args=args, progress=False)


async def test_an_unreachable_endpoint_fails_at_load():
    with pytest.raises(ConfigError, match="cannot reach"):
        await AsyncEngine.from_pretrained(llm_endpoint="http://127.0.0.1:9", progress=False)


async def test_the_api_key_is_sent_and_a_wrong_one_is_a_server_error(keyed):
    with pytest.raises(ConfigError, match="401"):
        await AsyncEngine.from_pretrained(llm_endpoint=keyed.url, progress=False)
    args = {"api_key": "sesame"}
    async with await AsyncEngine.from_pretrained(llm_endpoint=keyed.url, backend_args=args, progress=False) as engine:
        deltas, _ = await run(engine, chat("open up"))
        assert "".join(d.text for d in deltas) == "open up"
    wrong = {"api_key": "guess", "model": MODEL, "max_context": 64}  # no model list read: the request itself is refused
    async with await AsyncEngine.from_pretrained(llm_endpoint=keyed.url, backend_args=wrong, progress=False) as engine:
        with pytest.raises(UpstreamError) as info:
            await run(engine, chat("open up"))
    assert info.value.status == 401


# --- upstream failures ----------------------------------------------------------------------------------------


async def remote(url: str, model: str, **extra) -> AsyncEngine:
    args = {"model": model, "max_context": MAX_CONTEXT, **extra}
    return await AsyncEngine.from_pretrained(llm_endpoint=url, backend_args=args, progress=False)


async def test_an_upstream_5xx_is_a_server_error(standin):
    async with await remote(standin.url, "fail-500") as engine:
        with pytest.raises(UpstreamError, match="answered 500: EngineCore encountered an issue") as info:
            await run(engine, chat("hi"))
    assert info.value.status == 500


async def test_an_upstream_400_is_an_invalid_request_with_the_upstream_message(standin):
    async with await remote(standin.url, MODEL) as engine:
        with pytest.raises(InvalidRequestError, match="does not fit the context") as info:
            await run(engine, chat("word " * (MAX_CONTEXT + 1), max_tokens=2))
    assert info.value.param == "messages"


async def test_an_error_event_mid_stream_is_a_server_error_after_the_first_delta(standin):
    got = []
    async with await remote(standin.url, "error-midway") as engine:
        with pytest.raises(UpstreamError, match="answered 500"):
            async with engine.chat(chat("one two three")) as stream:
                async for item in stream:
                    got.append(item.chunk.text)
    assert got == ["one"]


async def test_a_dropped_connection_is_a_server_error(standin):
    async with await remote(standin.url, "drop") as engine:
        with pytest.raises(UpstreamError, match=r"broke off|ended before its last chunk"):
            await run(engine, chat("one two three"))


async def test_a_refused_connection_is_a_server_error(tmp_path):
    with running_standin(tmp_path) as server:
        engine = await remote(server.url, MODEL)
    async with engine:  # the server is gone now
        with pytest.raises(UpstreamError, match="cannot reach"):
            await run(engine, chat("hi"))


async def test_a_stalled_upstream_ends_at_the_deadline_and_the_server_sees_the_client_leave(standin):
    before = set(standin.streams)
    got = []
    async with await remote(standin.url, "stall") as engine:
        with pytest.raises(DeadlineExceeded):
            async with engine.chat(chat("one two three"), timeout=1.0) as stream:
                async for item in stream:
                    got.append(item.chunk.text)
    assert got == ["one"]
    ends = await anyio.to_thread.run_sync(standin.wait_streams_ended)
    assert [v for k, v in ends.items() if k not in before] == ["client gone"]


async def test_count_text_tokens_asks_the_server(engine):
    count = await anyio.to_thread.run_sync(engine.count_text_tokens, "one two three", "text")
    assert count == 3


async def test_more_concurrent_streams_than_a_default_connection_pool_all_stream_at_once(engine):
    """110 streams open at once (httpx's default pool holds 100 connections): each gets its first delta while
    every other one is still open, so none waits for another's connection."""
    streams = [engine.chat(chat("word " * 20, max_tokens=200, ignore_eos=True), timeout=30) for _ in range(110)]
    firsts: list = []

    async def first(stream) -> None:
        firsts.append((await anext(aiter(stream))).chunk)

    async with contextlib.AsyncExitStack() as stack:
        for stream in streams:
            await stack.enter_async_context(stream)
        async with anyio.create_task_group() as tg:
            for stream in streams:
                tg.start_soon(first, stream)
    assert len(firsts) == 110 and all(d.text == "word" and not d.final for d in firsts)
