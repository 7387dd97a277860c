"""WS /v1/realtime through the unchanged official ``openai`` SDK against a real server on 127.0.0.1, on the real
tiny families: the server's Silero VAD, a tiny random Whisper, the tiny Qwen3 chat model and the tests' greedy tiny
Qwen3-TTS (each spoken unit 9 frames).

The user speaks espeak-ng speech. Random weights transcribe and answer nonsense, so the checks are on the
protocol (event order, codes, cancellation, truncation, formats, auth, expiry) and on audio lengths, never on words;
replies are bounded (``max_output_tokens`` with the benchmark fields on: exactly that many tokens). What needs an
exact transcript and answer (the tone ASR and the echo LM) is in the barge-in, drop and session tests.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import websockets
from openai import AsyncOpenAI
from realtime_fixtures import espeak, framed, real_agent_loader
from serving_helpers import FRAME, running_server

from omni_stream.realtime.settings import Settings

REPLY_TOKENS = 6
MANUAL = {
    "type": "realtime",
    "output_modalities": ["audio"],
    "max_output_tokens": REPLY_TOKENS,
    "audio": {
        "input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None},
        "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "vivian"},
    },
}


def agent_settings(**fields) -> Settings:
    return Settings(enable_benchmark_fields=True, realtime_max_append_bytes=256 * 1024, **fields)


@pytest.fixture(scope="module")
def agent():
    with running_server(None, agent_settings(), load=real_agent_loader()) as live:
        yield live


@pytest.fixture(scope="module")
def model(agent) -> str:
    """The served text model's name (what ``?model=`` must name)."""
    return agent.engine.models.text().info.model_name


def client(live, key: str = "x") -> AsyncOpenAI:
    return AsyncOpenAI(api_key=key, base_url=f"{live.url}/v1", websocket_base_url=f"{live.ws_url}/v1")


def b64(samples: np.ndarray) -> str:
    return base64.b64encode(samples.astype("<i2").tobytes()).decode()


async def append(conn, samples: np.ndarray, chunk: int = 2400) -> None:
    for i in range(0, samples.size, chunk):  # 100 ms appends
        await conn.input_audio_buffer.append(audio=b64(samples[i : i + chunk]))


async def until(conn, kind: str) -> list:
    """Events up to and including the first of type ``kind``; an error event fails the test."""
    events = []
    async for event in conn:
        events.append(event)
        if event.type == "error" and kind != "error":
            raise AssertionError(f"unexpected error event: {event.error}")
        if event.type == kind:
            return events
    raise AssertionError(f"the connection closed before {kind}")


def audio_of(events: list) -> bytes:
    return b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")


async def connect_manual(conn) -> None:
    created = await conn.recv()
    assert created.type == "session.created" and created.session.id.startswith("sess_")
    assert (await conn.recv()).type == "conversation.created"
    await conn.session.update(session=MANUAL)
    assert (await conn.recv()).type == "session.updated"


async def test_manual_commit_and_response_create_stream_audio_and_complete(agent, model):
    async with client(agent).realtime.connect(model=model) as conn:
        await connect_manual(conn)
        await append(conn, framed(espeak("three"), tail_ms=300))
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        events = await until(conn, "response.done")
    types = [e.type for e in events]
    order = [
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
        "response.created",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ]
    positions = [types.index(t) for t in order]
    assert positions == sorted(positions), types
    assert next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed").transcript
    done = events[-1].response
    assert done.status in ("completed", "incomplete") and done.usage.output_token_details.text_tokens == REPLY_TOKENS
    audio = audio_of(events)
    assert audio and len(audio) % (FRAME * 2) == 0  # whole codec frames of 24 kHz PCM16
    transcript = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
    assert transcript and done.output[0].content[0].transcript == transcript


async def test_server_vad_on_a_spoken_utterance_answers_without_response_create(agent, model):
    speech = framed(espeak("Hello there. How are you today?"))
    async with client(agent).realtime.connect(model=model) as conn:
        await conn.recv(), await conn.recv()
        vad = {"type": "server_vad", "threshold": 0.5, "silence_duration_ms": 500, "prefix_padding_ms": 300}
        # a short answer: the answer's audio is paced in real time
        session = {"type": "realtime", "max_output_tokens": REPLY_TOKENS, "audio": {"input": {"turn_detection": vad}}}
        await conn.session.update(session=session)
        await append(conn, speech)
        events = await until(conn, "response.done")
    types = [e.type for e in events]
    for kind in (
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.input_audio_transcription.completed",
        "response.created",
        "response.output_audio.delta",
    ):
        assert kind in types, (kind, types)
    assert types.index("input_audio_buffer.speech_started") < types.index("input_audio_buffer.speech_stopped")
    started = next(e for e in events if e.type == "input_audio_buffer.speech_started")
    stopped = next(e for e in events if e.type == "input_audio_buffer.speech_stopped")
    # The speech begins after 300 ms of silence and lasts about 2 s (silero's audio_start_ms includes the 300 ms
    # prefix padding, OpenAI's meaning).
    assert 0 <= started.audio_start_ms < 600 < 1500 < stopped.audio_end_ms <= speech.size * 1000 // 24000
    assert events[-1].response.status in ("completed", "incomplete")


async def test_text_only_output_streams_text(agent, model):
    async with client(agent).realtime.connect(model=model) as conn:
        await connect_manual(conn)
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        await until(conn, "session.updated")
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "nine lives"}]}
        )
        await conn.response.create()
        events = await until(conn, "response.done")
    types = [e.type for e in events]
    assert "response.output_audio.delta" not in types
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and next(e for e in events if e.type == "response.output_text.done").text == text
    assert events[-1].response.usage.output_token_details.text_tokens == REPLY_TOKENS


async def test_response_cancel_stops_the_audio_and_frees_the_models(agent, model):
    async with client(agent).realtime.connect(model=model) as conn:
        await connect_manual(conn)
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 400})  # a long answer
        await until(conn, "session.updated")
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Talk a while."}]}
        )
        await conn.response.create()
        await until(conn, "response.output_audio.delta")
        await conn.response.cancel()
        events = await until(conn, "response.done")
        done = events[-1].response
        assert done.status == "cancelled" and done.status_details.reason == "client_cancelled"
        assert done.usage.output_token_details.text_tokens < 400
        await conn.conversation.item.retrieve(item_id=done.output[0].id)
        after = await until(conn, "conversation.item.retrieved")
        assert not [e for e in after if e.type.startswith("response.output_audio")]
        await conn.response.cancel()
        assert (await until(conn, "error"))[-1].error.code == "response_cancel_not_active"
    for kind in ("text", "speech"):
        assert not any(agent.wait_idle(kind=kind).values()), kind


async def test_truncate_cuts_a_finished_assistant_item(agent, model):
    async with client(agent).realtime.connect(model=model) as conn:
        await connect_manual(conn)
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "One. Two. Three."}]}
        )
        await conn.response.create()
        events = await until(conn, "response.done")
        item = events[-1].response.output[0]
        spoken_ms = len(audio_of(events)) // 2 * 1000 // 24000
        full = item.content[0].transcript
        await conn.conversation.item.truncate(item_id=item.id, content_index=0, audio_end_ms=100)
        truncated = (await until(conn, "conversation.item.truncated"))[-1]
        assert (truncated.item_id, truncated.audio_end_ms) == (item.id, 100)
        await conn.conversation.item.retrieve(item_id=item.id)
        retrieved = (await until(conn, "conversation.item.retrieved"))[-1].item
        assert full.startswith(retrieved.content[0].transcript)  # what was heard by 100 ms, no more
        await conn.conversation.item.truncate(item_id=item.id, content_index=0, audio_end_ms=spoken_ms + 1000)
        assert (await until(conn, "error"))[-1].error.param == "audio_end_ms"


async def test_bad_input_gets_error_events_with_codes_and_the_session_stays_usable(agent, model):
    async with client(agent).realtime.connect(model=model) as conn:
        await connect_manual(conn)
        bad = [
            ({"type": "foo"}, "unknown_event"),
            (
                {
                    "type": "session.update",
                    "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}},
                },
                "unsupported_audio_format",
            ),
            ({"type": "input_audio_buffer.append", "audio": "A" * (400 * 1024)}, "invalid_value"),
            ({"type": "input_audio_buffer.commit"}, "input_audio_buffer_commit_empty"),
            ({"type": "response.cancel"}, "response_cancel_not_active"),
        ]
        for message, code in bad:
            await conn.send({**message, "event_id": f"client-{code}"})
            error = (await until(conn, "error"))[-1].error
            assert error.code == code and error.type == "invalid_request_error"
            assert error.event_id == f"client-{code}" and error.message
        await append(conn, framed(espeak("four"), tail_ms=300))
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        assert (await until(conn, "response.done"))[-1].response.status in ("completed", "incomplete")


async def test_invalid_json_over_a_raw_socket_is_an_error_event(agent):
    async with websockets.connect(f"{agent.ws_url}/v1/realtime") as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.recv()
        await ws.send("{nope")
        assert json.loads(await ws.recv())["error"]["code"] == "invalid_json"
        await ws.send(b"\x00\x01")
        assert json.loads(await ws.recv())["error"]["code"] == "invalid_json"
        await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
        assert json.loads(await ws.recv())["type"] == "input_audio_buffer.cleared"
        # a lone surrogate (ASCII-escaped by json.dumps) echoed back in conversation.item.added closed the socket
        # 1011 with no reason; in the instructions it failed the next response's prompt
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi \ud800"}]}
        await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        error = json.loads(await ws.recv())["error"]
        assert (error["code"], error["param"]) == ("invalid_value", "item.content[0].text")
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "\udfff"}}))
        assert json.loads(await ws.recv())["error"]["param"] == "session.instructions"
        await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
        assert json.loads(await ws.recv())["type"] == "input_audio_buffer.cleared"  # the session goes on


async def test_g711_both_ways(agent, model):
    from omni_stream.codecs.g711 import ulaw_decode, ulaw_encode
    from omni_stream.codecs.resample import resample

    async with client(agent).realtime.connect(model=model) as conn:
        await conn.recv(), await conn.recv()
        fmt = {"type": "audio/pcmu"}
        await conn.session.update(
            session={
                "type": "realtime",
                "max_output_tokens": REPLY_TOKENS,
                "audio": {"input": {"format": fmt, "turn_detection": None}, "output": {"format": fmt}},
            }
        )
        await until(conn, "session.updated")
        words = framed(espeak("six"), tail_ms=300).astype(np.float32) / 32768
        mu = ulaw_encode(np.rint(resample(words, 24000, 8000) * 32767).astype(np.int16)).tobytes()
        for i in range(0, len(mu), 800):
            await conn.input_audio_buffer.append(audio=base64.b64encode(mu[i : i + 800]).decode())
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        events = await until(conn, "response.done")
    assert next(e for e in events if e.type.endswith("transcription.completed")).transcript  # the 8 kHz input heard
    audio = audio_of(events)
    assert audio and len(audio) % (FRAME // 3) == 0  # one byte a sample at 8 kHz: whole codec frames
    decoded = ulaw_decode(audio).astype(np.float32) / 32768
    assert 0.001 < float(np.abs(decoded).mean()) < 1.0  # audio, not silence


@pytest.fixture(scope="module")
def keyed():
    with running_server(None, agent_settings(api_key="sekret"), load=real_agent_loader()) as live:
        yield live


async def test_auth_as_on_every_v1_route_sdk_header_or_browser_subprotocol(keyed, model):
    async with client(keyed, "sekret").realtime.connect(model=model) as conn:
        assert (await conn.recv()).type == "session.created"
    with pytest.raises(Exception) as info:
        async with client(keyed, "wrong").realtime.connect(model=model) as conn:
            await conn.recv()
    assert "403" in str(info.value) or "1008" in str(info.value) or "rejected" in str(info.value).lower()
    url = f"{keyed.ws_url}/v1/realtime?model={model}"
    async with websockets.connect(url, subprotocols=["realtime", "openai-insecure-api-key.sekret"]) as ws:
        assert ws.subprotocol == "realtime"  # the key-free one is echoed
        assert json.loads(await ws.recv())["type"] == "session.created"


@pytest.fixture(scope="module")
def short_lived():
    with running_server(None, agent_settings(realtime_session_seconds=0.5), load=real_agent_loader()) as live:
        yield live


async def test_an_expired_session_gets_session_expired_and_a_normal_close(short_lived):
    async with websockets.connect(f"{short_lived.ws_url}/v1/realtime") as ws:
        events = []
        with pytest.raises(websockets.ConnectionClosed) as info:
            while True:
                events.append(json.loads(await ws.recv()))
    assert events[-1]["error"]["code"] == "session_expired"
    assert info.value.rcvd.code == 1000


def test_serve_flags_set_the_webrtc_ice_servers_and_limit():
    import argparse

    from omni_stream.realtime.agent.rtc import ice_servers
    from omni_stream.realtime.server import add_arguments, settings_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--rtc-ice-servers", "stun:a:3478, turn:u:p@b:3478", "--rtc-concurrency-limit", "3"])
    settings = settings_from_args(args)
    assert settings.rtc_ice_servers == ("stun:a:3478", "turn:u:p@b:3478") and settings.rtc_concurrency_limit == 3
    assert ice_servers(settings.rtc_ice_servers) == [
        {"urls": "stun:a:3478"},
        {"urls": "turn:b:3478", "username": "u", "credential": "p"},
    ]
    assert settings_from_args(parser.parse_args([])).rtc_ice_servers == ()


async def test_a_transcription_session_streams_asr_deltas_and_makes_no_response(agent, model):
    """session.type "transcription": the turn is transcribed, nothing answers."""
    speech = framed(espeak("Good morning to you."))
    async with client(agent).realtime.connect(model=model) as conn:
        await conn.recv(), await conn.recv()
        vad = {"type": "server_vad", "threshold": 0.5, "silence_duration_ms": 500, "prefix_padding_ms": 300}
        await conn.session.update(session={"type": "transcription", "audio": {"input": {"turn_detection": vad}}})
        await append(conn, speech)
        events = await until(conn, "conversation.item.input_audio_transcription.completed")
        await conn.response.create()  # refused in a transcription session, and the connection stays usable
        refused = await until(conn, "error")
    types = [e.type for e in events]
    assert "input_audio_buffer.speech_stopped" in types and "input_audio_buffer.committed" in types
    deltas = [e.delta for e in events if e.type == "conversation.item.input_audio_transcription.delta"]
    assert deltas and "".join(deltas) == events[-1].transcript
    assert not any(t.startswith("response.") for t in types)
    assert refused[-1].error.param == "session.type"
