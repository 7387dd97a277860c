"""WS /v1/realtime through the unchanged official ``openai`` SDK against a real server on 127.0.0.1.

The agent: synthetic TTS (a tone per voice) + synthetic LM (echoes the last user message) + the ASR model of
:mod:`realtime_fixtures` (the tone-naming double unless ``OMNI_STREAM_TEST_ASR`` names a real checkpoint), with
the VAD factory of ``OMNI_STREAM_TEST_VAD`` (the energy double by default).
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import websockets
from openai import AsyncOpenAI
from realtime_doubles import spoken_words
from realtime_fixtures import REAL_MODELS, agent_checkpoints, agent_loader, espeak, framed, vad_factory
from serving_helpers import expected_tone, pcm16, running_server

from omni_stream.realtime.settings import Settings

MANUAL = {
    "type": "realtime",
    "output_modalities": ["audio"],
    "audio": {
        "input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None},
        "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "alice"},
    },
}


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    checkpoints = agent_checkpoints(tmp_path_factory.mktemp("agent"))
    settings = Settings(vad_factory=vad_factory(), realtime_max_append_bytes=256 * 1024)
    with running_server(None, settings, load=agent_loader(checkpoints)) as live:
        yield live


@pytest.fixture(scope="module")
def real_agent(tmp_path_factory):
    """The agent on the real speech-input models: silero-vad (the server's default VAD) and a tiny random Whisper."""
    from omni_stream.models.whisper.checkpoint import write_tiny_checkpoint

    root = tmp_path_factory.mktemp("real-agent")
    checkpoints = {**agent_checkpoints(root), "asr": write_tiny_checkpoint(root / "whisper")}
    with running_server(None, Settings(), load=agent_loader(checkpoints)) as live:
        yield live


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


async def test_manual_commit_and_response_create_stream_audio_and_complete(agent):
    async with client(agent).realtime.connect(model="synthetic-lm") as conn:
        await connect_manual(conn)
        await append(conn, spoken_words(["three"], lead_ms=300, tail_ms=300))  # 1 s of PCM16
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
    assert "conversation.item.input_audio_transcription.completed" in types
    done = events[-1].response
    assert done.status == "completed" and done.usage.total_tokens > 0
    audio = audio_of(events)
    assert audio and len(audio) % 2 == 0
    if not REAL_MODELS:
        transcript = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed")
        assert transcript.transcript == "three"
        assert audio == pcm16(expected_tone("alice", "three"))  # the LM echoed it, the TTS spoke it
        assert done.output[0].content[0].transcript == "three"


@pytest.mark.parametrize("which", ["doubles", "silero+whisper"])
async def test_server_vad_on_a_spoken_utterance_answers_without_response_create(which, request):
    agent = request.getfixturevalue("agent" if which == "doubles" else "real_agent")
    speech = framed(espeak("Hello there. How are you today?"))
    async with client(agent).realtime.connect(model="synthetic-lm") as conn:
        await conn.recv(), await conn.recv()
        vad = {"type": "server_vad", "threshold": 0.5, "silence_duration_ms": 500, "prefix_padding_ms": 300}
        # a short answer: a random-weight ASR transcribes at length, and the answer's audio is paced in real time
        session = {"type": "realtime", "max_output_tokens": 6, "audio": {"input": {"turn_detection": vad}}}
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
    # prefix padding, OpenAI's meaning; the energy double reports the onset itself).
    assert 0 <= started.audio_start_ms < 600 < 1500 < stopped.audio_end_ms <= speech.size * 1000 // 24000
    # a random Whisper's transcript may be long enough for the echoed answer to stop at max_output_tokens
    assert events[-1].response.status in (("completed",) if which == "doubles" else ("completed", "incomplete"))


async def test_text_only_output_streams_text(agent):
    async with client(agent).realtime.connect(model="synthetic-lm") as conn:
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
    assert text == "nine lives"
    assert next(e for e in events if e.type == "response.output_text.done").text == "nine lives"
    assert events[-1].response.status == "completed"


async def test_response_cancel_stops_the_audio_and_frees_the_models(agent):
    long = " ".join(["This sentence is long enough to speak for a while."] * 12)
    async with client(agent).realtime.connect(model="synthetic-lm") as conn:
        await connect_manual(conn)
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": long}]}
        )
        await conn.response.create()
        await until(conn, "response.output_audio.delta")
        await conn.response.cancel()
        events = await until(conn, "response.done")
        done = events[-1].response
        assert done.status == "cancelled" and done.status_details.reason == "client_cancelled"
        await conn.conversation.item.retrieve(item_id=done.output[0].id)
        after = await until(conn, "conversation.item.retrieved")
        assert not [e for e in after if e.type.startswith("response.output_audio")]
        await conn.response.cancel()
        assert (await until(conn, "error"))[-1].error.code == "response_cancel_not_active"
    assert not any(agent.engine.models.text().scheduler.live().values())
    assert not any(agent.wait_idle().values())


async def test_truncate_cuts_a_finished_assistant_item(agent):
    async with client(agent).realtime.connect(model="synthetic-lm") as conn:
        await connect_manual(conn)
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "One. Two. Three."}]}
        )
        await conn.response.create()
        done = (await until(conn, "response.done"))[-1].response
        item = done.output[0]
        await conn.conversation.item.truncate(item_id=item.id, content_index=0, audio_end_ms=100)
        truncated = (await until(conn, "conversation.item.truncated"))[-1]
        assert (truncated.item_id, truncated.audio_end_ms) == (item.id, 100)
        await conn.conversation.item.retrieve(item_id=item.id)
        retrieved = (await until(conn, "conversation.item.retrieved"))[-1].item
        assert retrieved.content[0].transcript == "One."
        await conn.conversation.item.truncate(item_id=item.id, content_index=0, audio_end_ms=10_000)
        assert (await until(conn, "error"))[-1].error.param == "audio_end_ms"


async def test_bad_input_gets_error_events_with_codes_and_the_session_stays_usable(agent):
    async with client(agent).realtime.connect(model="synthetic-lm") as conn:
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
        await append(conn, spoken_words(["four"], tail_ms=300))
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        assert (await until(conn, "response.done"))[-1].response.status == "completed"


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


async def test_g711_both_ways(agent):
    from omni_stream.codecs.g711 import ulaw_decode, ulaw_encode
    from omni_stream.codecs.resample import resample

    async with client(agent).realtime.connect(model="synthetic-lm") as conn:
        await conn.recv(), await conn.recv()
        fmt = {"type": "audio/pcmu"}
        await conn.session.update(
            session={
                "type": "realtime",
                "audio": {"input": {"format": fmt, "turn_detection": None}, "output": {"format": fmt}},
            }
        )
        await until(conn, "session.updated")
        words = spoken_words(["six"], tail_ms=300).astype(np.float32) / 32768
        mu = ulaw_encode(np.rint(resample(words, 24000, 8000) * 32767).astype(np.int16)).tobytes()
        for i in range(0, len(mu), 800):
            await conn.input_audio_buffer.append(audio=base64.b64encode(mu[i : i + 800]).decode())
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        events = await until(conn, "response.done")
    if not REAL_MODELS:
        assert next(e for e in events if e.type.endswith("transcription.completed")).transcript == "six"
    audio = audio_of(events)
    expected = expected_tone("alice", "six")
    assert abs(len(audio) - expected.size // 3) <= 2  # one byte a sample at 8 kHz
    decoded = ulaw_decode(audio).astype(np.float32) / 32768
    assert np.corrcoef(decoded[100:-100], resample(expected, 24000, 8000)[100 : len(decoded) - 100])[0, 1] > 0.98


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    checkpoints = agent_checkpoints(tmp_path_factory.mktemp("keyed"))
    with running_server(None, Settings(api_key="sekret"), load=agent_loader(checkpoints)) as live:
        yield live


async def test_auth_as_on_every_v1_route_sdk_header_or_browser_subprotocol(keyed):
    async with client(keyed, "sekret").realtime.connect(model="synthetic-lm") as conn:
        assert (await conn.recv()).type == "session.created"
    with pytest.raises(Exception) as info:
        async with client(keyed, "wrong").realtime.connect(model="synthetic-lm") as conn:
            await conn.recv()
    assert "403" in str(info.value) or "1008" in str(info.value) or "rejected" in str(info.value).lower()
    url = f"{keyed.ws_url}/v1/realtime?model=synthetic-lm"
    async with websockets.connect(url, subprotocols=["realtime", "openai-insecure-api-key.sekret"]) as ws:
        assert ws.subprotocol == "realtime"  # the key-free one is echoed
        assert json.loads(await ws.recv())["type"] == "session.created"


@pytest.fixture(scope="module")
def short_lived(tmp_path_factory):
    checkpoints = agent_checkpoints(tmp_path_factory.mktemp("short"))
    with running_server(None, Settings(realtime_session_seconds=0.5), load=agent_loader(checkpoints)) as live:
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


async def test_a_transcription_session_streams_asr_deltas_and_makes_no_response(real_agent):
    """session.type "transcription" on the real speech-input models: the turn is transcribed, nothing answers."""
    speech = framed(espeak("Good morning to you."))
    async with client(real_agent).realtime.connect(model="synthetic-lm") as conn:
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
