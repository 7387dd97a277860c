"""The OpenAI Agents SDK, unchanged, against the app of ``omni-stream serve`` on the tiny models: an agent that must
call its function tool (``tool_choice="required"``: random weights still produce a schema-valid call through the
grammar), gets the tool's result back and gives a final answer; over chat completions here, and over
``/v1/realtime`` in ``test_agents_sdk_realtime.py``. Tracing is off: nothing leaves 127.0.0.1."""

from __future__ import annotations

import os
from typing import Annotated, Literal

import pytest
from openai import AsyncOpenAI
from pydantic import Field
from serving_helpers import running_server

from omni_stream.models.causal_lm.checkpoint import write_tiny_checkpoint as write_tiny_lm
from omni_stream.models.qwen3_tts.checkpoint import write_tiny_checkpoint as write_tiny_tts
from omni_stream.realtime.settings import Settings

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
import agents


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("agents")
    with running_server(write_tiny_tts(root / "tts"), Settings(), llm=write_tiny_lm(root / "lm", "qwen3")) as live:
        yield live


async def test_a_chat_completions_agent_calls_its_tool_and_answers(server):
    agents.set_tracing_disabled(True)
    calls: list[tuple[str, int]] = []

    @agents.function_tool
    def get_weather(city: Literal["Paris", "Rome", "Oslo"], days: Annotated[int, Field(ge=1, le=14)]) -> str:
        """The weather forecast of a city for a number of days."""
        calls.append((city, days))
        return f"Sunny in {city} for {days} days."

    client = AsyncOpenAI(api_key="none", base_url=f"{server.url}/v1", max_retries=0)
    agent = agents.Agent(
        name="forecaster",
        instructions="Answer with the forecast.",
        tools=[get_weather],
        model=agents.OpenAIChatCompletionsModel(model="lm", openai_client=client),
        model_settings=agents.ModelSettings(
            tool_choice="required", parallel_tool_calls=False, max_tokens=100, temperature=0.7, extra_args={"seed": 7}
        ),
    )
    result = await agents.Runner.run(agent, "What is the weather in Paris this week?", max_turns=4)
    assert len(calls) >= 1 and all(city in ("Paris", "Rome", "Oslo") and 1 <= d <= 14 for city, d in calls)
    kinds = [item.type for item in result.new_items]
    assert kinds.index("tool_call_item") < kinds.index("tool_call_output_item") < kinds.index("message_output_item")
    outputs = [item.output for item in result.new_items if item.type == "tool_call_output_item"]
    assert outputs[0] == f"Sunny in {calls[0][0]} for {calls[0][1]} days."
    assert isinstance(result.final_output, str)
