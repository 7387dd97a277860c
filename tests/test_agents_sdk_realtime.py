"""The OpenAI Agents SDK's realtime agent, unchanged, over ``WS /v1/realtime`` of the app of ``omni-stream serve``
on the tiny real families (Qwen3-TTS, Qwen3, Whisper; Silero VAD): a voice agent with a function tool it must call.

The SDK's realtime model is pointed at the server's URL. The session forces a call (``tool_choice="required"``: the
grammar makes random weights call the tool validly); the tool, run by the SDK, switches the session back to
``auto`` with a short reply (a raw ``session.update`` through the SDK's own API, so the next reply answers instead
of calling again); the SDK sends the result (``function_call_output``) and asks for the next response, whose
audio arrives after the tool's output.
Tracing is off: nothing leaves 127.0.0.1."""

from __future__ import annotations

import os
from typing import Annotated, Literal

import anyio
import pytest
from pydantic import Field
from serving_helpers import running_server

from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.family import ModelKind
from omni_stream.models.causal_lm.checkpoint import write_tiny_checkpoint as write_tiny_lm
from omni_stream.models.qwen3_tts.checkpoint import write_tiny_checkpoint as write_tiny_tts
from omni_stream.models.whisper.checkpoint import write_tiny_checkpoint as write_tiny_asr
from omni_stream.realtime.settings import Settings

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
import agents
from agents.realtime import RealtimeAgent, RealtimeRunner
from agents.realtime.model_inputs import RealtimeModelSendRawMessage

LM = "lm"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("agents-realtime")
    sources = {
        "tts": ModelSource(write_tiny_tts(root / "tts")),
        "lm": ModelSource(write_tiny_lm(root / LM, "qwen3"), kind=ModelKind.TEXT),
        "asr": ModelSource(write_tiny_asr(root / "asr"), kind=ModelKind.TRANSCRIPTION),
    }

    async def load() -> AsyncEngine:
        return await AsyncEngine.load(sources, progress=False)

    with running_server(None, Settings(), load=load) as live:
        yield live


async def test_a_realtime_voice_agent_calls_its_tool_and_speaks_the_answer(server):
    agents.set_tracing_disabled(True)
    calls: list[tuple[str, int]] = []
    holder: dict = {}

    @agents.function_tool
    async def get_weather(city: Literal["Paris", "Rome", "Oslo"], days: Annotated[int, Field(ge=1, le=14)]) -> str:
        """The weather forecast of a city for a number of days."""
        calls.append((city, days))
        session = {"type": "realtime", "tool_choice": "auto", "max_output_tokens": 12}  # a short spoken answer
        raw = {"type": "session.update", "other_data": {"session": session}}
        await holder["session"].model.send_event(RealtimeModelSendRawMessage(message=raw))
        return f"Sunny in {city} for {days} days."

    agent = RealtimeAgent(name="forecaster", instructions="Answer with the forecast.", tools=[get_weather])
    settings = {
        "model_name": LM,
        "voice": "vivian",
        "output_modalities": ["audio"],
        "tool_choice": "required",
        "max_output_tokens": 100,
        "turn_detection": {"type": "server_vad"},
    }
    runner = RealtimeRunner(agent, config={"model_settings": settings})
    url = f"{server.ws_url}/v1/realtime?model={LM}"
    seen: list[str] = []
    audio_after_tool = 0
    with anyio.fail_after(240):
        async with await runner.run(model_config={"url": url, "api_key": "none"}) as session:
            holder["session"] = session
            await session.send_message("What is the weather in Paris this week?")
            async for event in session:
                seen.append(event.type)
                if event.type == "error":
                    raise AssertionError(f"error event: {event.error}")
                if event.type == "audio" and "tool_end" in seen:
                    audio_after_tool += 1
                if audio_after_tool >= 3:  # the answer is being spoken (leaving cancels the rest)
                    break
            history = session._history  # the SDK's view of the conversation
    # one call or more: a response may hold parallel calls, and a random model may start another after the first
    assert calls and all(city in ("Paris", "Rome", "Oslo") and 1 <= days <= 14 for city, days in calls)
    assert seen.index("tool_start") < seen.index("tool_end")
    assert audio_after_tool > 0, "the answer after the tool's output was not spoken"
    kinds = [getattr(item, "type", None) for item in history]
    assert "function_call" in kinds
    call = next(item for item in history if getattr(item, "type", None) == "function_call")
    assert call.output == f"Sunny in {calls[0][0]} for {calls[0][1]} days."


async def test_an_agent_with_the_sdks_defaults_gets_its_instructions_and_tools_to_the_server(server):
    """``RealtimeRunner(agent)`` as the SDK's docs show it, no model settings: its first session.update names
    OpenAI's model and voice ("gpt-realtime", "ash"). The voice speaks as the model's default voice, so the update,
    which carries the agent's instructions and tools, is not refused whole for it."""
    agents.set_tracing_disabled(True)

    @agents.function_tool
    async def get_time(city: Literal["Paris", "Rome"]) -> str:
        """The local time of a city."""
        return "noon"

    agent = RealtimeAgent(name="clock", instructions="Tell the time when asked.", tools=[get_time])
    runner = RealtimeRunner(agent)
    errors: list[object] = []
    updated: list[dict] = []
    with anyio.fail_after(120):
        async with await runner.run(model_config={"url": f"{server.ws_url}/v1/realtime", "api_key": "none"}) as session:
            await session.send_message("What time is it in Paris?")
            async for event in session:
                if event.type == "error":
                    errors.append(event.error)
                raw = getattr(event, "data", None)
                if event.type == "raw_model_event" and getattr(raw, "type", "") == "raw_server_event":
                    if raw.data.get("type") == "session.updated":
                        updated.append(raw.data["session"])
                    elif raw.data.get("type") == "error":
                        errors.append(raw.data)
                if event.type in ("audio", "tool_start") or errors:
                    break  # the agent answers (leaving cancels the rest)
    assert not errors, errors
    assert updated, "no session.updated"
    session_seen = updated[-1]
    assert session_seen["instructions"] == "Tell the time when asked."
    assert [t["name"] for t in session_seen["tools"]] == ["get_time"]
    assert session_seen["audio"]["output"]["voice"] == "vivian"  # "ash": the tiny checkpoint's first (default) voice
