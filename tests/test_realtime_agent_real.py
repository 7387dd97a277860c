"""The voice agent end to end on the real tiny families, through the unchanged ``openai`` SDK over WS /v1/realtime.

Every model is real: Silero VAD from its wheel, Smart Turn v3.2 from pipecat-ai's package, a tiny random Whisper,
a tiny random Qwen3 and a tiny random Qwen3-TTS CustomVoice, served by a real uvicorn server on 127.0.0.1. The
user speaks espeak-ng speech. Random weights transcribe and answer nonsense, so the checks are on the protocol's
shape and the audio's presence, not on words; replies are bounded (``max_output_tokens``, benchmark fields on,
so the LM cannot stop early and leave the TTS nothing to say).
"""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest
from openai import AsyncOpenAI
from realtime_fixtures import espeak, framed
from serving_helpers import running_server

from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.family import ModelKind
from omni_stream.realtime.settings import Settings

REPLY_TOKENS = 8


@pytest.fixture(scope="module")
def real_agent():
    from tiny_models import tiny_asr, tiny_lm, tiny_tts

    # the embedded defaults (built once per machine, not per run)
    paths = {"tts": tiny_tts(), "lm": tiny_lm(), "asr": tiny_asr()}

    async def load() -> AsyncEngine:
        sources = {
            "tts": ModelSource(paths["tts"]),
            "lm": ModelSource(paths["lm"], kind=ModelKind.TEXT),
            "asr": ModelSource(paths["asr"], kind=ModelKind.TRANSCRIPTION),
        }
        return await AsyncEngine.load(sources, progress=False)

    settings = Settings(enable_benchmark_fields=True, realtime_max_append_bytes=256 * 1024)
    assert settings.turn_model_factory is not None, "Smart Turn (pipecat-ai) and onnxruntime must be installed"
    with running_server(None, settings, load=load) as live:
        yield live


def live_model(live) -> str:
    """The served text model's name (what ?model= must name)."""
    return live.engine.models.text().info.model_name


def client(live) -> AsyncOpenAI:
    return AsyncOpenAI(api_key="x", base_url=f"{live.url}/v1", websocket_base_url=f"{live.ws_url}/v1")


def b64(samples: np.ndarray) -> str:
    return base64.b64encode(samples.astype("<i2").tobytes()).decode()


async def append(conn, samples: np.ndarray, chunk: int = 2400) -> None:
    for i in range(0, samples.size, chunk):
        await conn.input_audio_buffer.append(audio=b64(samples[i : i + chunk]))


async def until(conn, kind: str, seen: list | None = None) -> list:
    events = seen if seen is not None else []
    async for event in conn:
        events.append(event)
        if event.type == "error":
            raise AssertionError(f"unexpected error event: {event.error}")
        if event.type == kind:
            return events
    raise AssertionError(f"the connection closed before {kind}")


def audio_bytes(events: list) -> int:
    return sum(len(base64.b64decode(e.delta)) for e in events if e.type == "response.output_audio.delta")


async def open_session(conn, turn_detection) -> None:
    assert (await conn.recv()).type == "session.created"
    assert (await conn.recv()).type == "conversation.created"
    session = {
        "type": "realtime",
        "max_output_tokens": REPLY_TOKENS,
        "audio": {"input": {"turn_detection": turn_detection}, "output": {"voice": "vivian"}},
    }
    await conn.session.update(session=session)
    updated = await conn.recv()
    assert updated.type == "session.updated", updated
    return updated


def wait_idle(live) -> None:
    models = live.engine.models
    for kind in ("speech", "text", "transcription"):
        assert not any(live.wait_idle(kind=kind).values()), kind
    assert models.text().runner.num_active == 0


async def test_a_manual_commit_is_transcribed_and_answered_with_speech(real_agent):
    speech = framed(espeak("What is the weather like in Paris today?"), tail_ms=300)
    async with client(real_agent).realtime.connect(model=live_model(real_agent)) as conn:
        await open_session(conn, None)
        await append(conn, speech)
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        events = await until(conn, "response.done")
    types = [e.type for e in events]
    assert types.index("input_audio_buffer.committed") < types.index("response.created")
    completed = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed")
    assert completed.transcript  # a random Whisper writes something
    done = events[-1].response
    assert done.status in ("completed", "incomplete") and done.usage.output_token_details.text_tokens == REPLY_TOKENS
    assert audio_bytes(events) > 0 and done.output[0].content[0].transcript
    await asyncio.to_thread(wait_idle, real_agent)


def turn_model_counts(live) -> dict[str, float]:
    """``omni_stream_turn_model_seconds``'s count per phase on the server's ``/metrics``."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{live.url}/metrics", timeout=30).text
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "omni_stream_turn_model_seconds"]
    return {s.labels["phase"]: s.value for s in family.samples if s.name.endswith("_count")}


async def test_semantic_vad_ends_the_turn_answers_and_a_barge_in_cancels_the_answer(real_agent):
    judged_before = await asyncio.to_thread(turn_model_counts, real_agent)
    question = framed(espeak("What is the weather like in Paris today?"), tail_ms=1000)
    interruption = framed(espeak("Wait, stop please."), lead_ms=0, tail_ms=0)
    async with client(real_agent).realtime.connect(model=live_model(real_agent)) as conn:
        updated = await open_session(conn, {"type": "semantic_vad", "eagerness": "high"})
        assert updated.session.audio.input.turn_detection.type == "semantic_vad"
        await append(conn, question)
        events = await until(conn, "response.output_audio.delta")
        types = [e.type for e in events]
        order = [
            "input_audio_buffer.speech_started",
            "input_audio_buffer.speech_stopped",
            "input_audio_buffer.committed",
            "response.created",  # the response waits for the transcript, then answers it
            "conversation.item.input_audio_transcription.completed",
            "response.output_audio.delta",
        ]
        assert [types.index(t) for t in order] == sorted(types.index(t) for t in order), types
        stopped = next(e for e in events if e.type == "input_audio_buffer.speech_stopped")
        # Smart Turn judged the finished question at its pause: the turn ended long before the 2 s maximum pause
        speech_end_ms = 300 + (question.size - 24000) * 1000 // 24000
        assert stopped.audio_end_ms < speech_end_ms + 1000
        # every pause the model judged is on /metrics, each with its wait, call and CPU time
        judged = await asyncio.to_thread(turn_model_counts, real_agent)
        assert set(judged) == {"wait", "run", "cpu"}
        assert judged["run"] - judged_before.get("run", 0) >= 1
        assert judged["wait"] == judged["run"] == judged["cpu"]
        # barge-in: the user talks over the answer
        await append(conn, interruption)
        rest = await until(conn, "response.done")
    rest_types = [e.type for e in rest]
    assert "input_audio_buffer.speech_started" in rest_types
    done = rest[-1].response
    assert done.status == "cancelled" and done.status_details.reason == "turn_detected"
    after_done = rest_types[rest_types.index("input_audio_buffer.speech_started") :]
    assert "response.output_audio.delta" not in after_done[after_done.index("response.done") :]
    await asyncio.to_thread(wait_idle, real_agent)


async def test_a_transcription_language_whisper_does_not_know_is_refused_at_the_update(real_agent):
    """Refused by the loaded Whisper's own check when the session is updated, not as a failed transcript later."""
    async with client(real_agent).realtime.connect(model=live_model(real_agent)) as conn:
        assert (await conn.recv()).type == "session.created"
        assert (await conn.recv()).type == "conversation.created"
        transcription = {"model": "whisper", "language": "xx"}
        await conn.session.update(session={"type": "realtime", "audio": {"input": {"transcription": transcription}}})
        error = await conn.recv()
        assert error.type == "error" and error.error.code == "invalid_value", error
        assert error.error.param == "session.audio.input.transcription.language" and "'xx'" in error.error.message
        transcription["language"] = "English"  # Whisper takes names as well as codes
        await conn.session.update(session={"type": "realtime", "audio": {"input": {"transcription": transcription}}})
        updated = await conn.recv()
        assert updated.type == "session.updated", updated
        assert updated.session.audio.input.transcription.language == "English"
