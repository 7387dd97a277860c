"""The remote text backend against a STAND-IN server, for what our own server cannot show.

``openai_standin.py`` is a Starlette app in vLLM's exact wire shapes over an omni-stream engine with the synthetic
LM. It is here only for: raw prompts through ``POST /v1/completions`` and token counts through ``POST /tokenize``
(vLLM's routes, which ``omni-stream serve`` does not have), and upstream faults chosen by the request's model name
(a 500, an error event mid-stream, a dropped connection, a stream that stalls), and what our server answers its
own clients when that upstream fails (502 in OpenAI's error shape). Everything our server can show
(the text-backend contract, loading, credentials, refused connections) runs against it in ``test_text_remote.py``;
the same backend runs against a real ``vllm serve`` in the vLLM tier (``test_text_vllm.py``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import anyio
import httpx
import pytest
import pytest_asyncio
from openai_standin import MAX_CONTEXT, MODEL, StandIn, running_standin
from serving_helpers import running_server
from text_backend_contract import chat, reply

from omni_stream.engine import AsyncEngine
from omni_stream.errors import DeadlineExceeded, UpstreamError
from omni_stream.requests import TextRequest

SAID = "one two three four five six seven eight"


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIn]:
    with running_standin(tmp_path_factory.mktemp("standin")) as server:
        yield server


@pytest_asyncio.fixture
async def engine(standin: StandIn) -> AsyncIterator[AsyncEngine]:
    async with await AsyncEngine.from_pretrained(llm_endpoint=standin.url, progress=False) as engine:
        yield engine


async def remote(url: str, model: str) -> AsyncEngine:
    args = {"model": model, "max_context": MAX_CONTEXT}
    return await AsyncEngine.from_pretrained(llm_endpoint=url, backend_args=args, progress=False)


# --- vLLM's routes our server does not have ---------------------------------------------------------------------


async def test_a_raw_prompt_streams_through_completions_and_joins_to_the_whole_answer(engine, standin):
    got = await reply(engine, TextRequest(prompt=SAID))
    async with httpx.AsyncClient(base_url=standin.url) as client:
        whole = (await client.post("/v1/completions", json={"model": MODEL, "prompt": SAID})).json()
    assert got.text == whole["choices"][0]["text"] == SAID  # the synthetic LM echoes
    assert (got.usage.input_tokens, got.usage.output_tokens) == (
        whole["usage"]["prompt_tokens"],
        whole["usage"]["completion_tokens"],
    )
    assert any(v == "done" for v in standin.streams.values())


async def test_count_text_tokens_asks_the_servers_tokenize_route(engine):
    count = await anyio.to_thread.run_sync(engine.count_text_tokens, "one two three", "text")
    assert count == 3


# --- upstream faults ------------------------------------------------------------------------------------------


async def test_an_upstream_5xx_is_a_server_error(standin):
    async with await remote(standin.url, "fail-500") as engine:
        with pytest.raises(UpstreamError, match="answered 500: EngineCore encountered an issue") as info:
            await reply(engine, chat("hi"))
    assert info.value.status == 500


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
            await reply(engine, chat("one two three"))


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


# --- what our server answers when its remote text model fails ---------------------------------------------------


def chat_body(model: str, **fields) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "one two three"}], **fields}


@pytest.mark.parametrize("stream", [False, True])
def test_a_failed_upstream_is_a_502_bad_gateway_in_the_openai_shape(standin, stream):
    async def failing() -> AsyncEngine:
        return await remote(standin.url, "fail-500")

    with running_server(None, load=failing) as server:
        r = httpx.post(f"{server.url}/v1/chat/completions", json=chat_body("fail-500", stream=stream), timeout=30)
    assert r.status_code == 502
    error = r.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("BadGatewayError", 502, None)
    assert "answered 500: EngineCore encountered an issue" in error["message"]


def test_an_upstream_failure_mid_stream_is_an_in_band_server_error(standin):
    async def midway() -> AsyncEngine:
        return await remote(standin.url, "error-midway")

    with running_server(None, load=midway) as server:
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=chat_body("error-midway", stream=True),
                          timeout=30) as r:  # fmt: skip
            assert r.status_code == 200
            events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    contents = [json.loads(e)["choices"][0]["delta"].get("content") for e in events[:-2]]
    assert contents == ["", "one"]  # the role chunk, then the delta that came before the fault
    error = json.loads(events[-2])["error"]
    assert (error["code"], error["type"]) == (502, "server_error") and events[-1] == "[DONE]"
