"""A text model that sees, end to end on the real tiny families: the tiny random Qwen2.5-VL (the agent's mind), the
tiny Qwen3-TTS CustomVoice and the tiny Whisper, served by a real uvicorn server on 127.0.0.1.

- vLLM-Omni's own ``streaming_video_client.py``, unchanged (fetched from its PyPI sdist by
  ``tests/vllm_omni_clients.py fetch``), over WS /v1/video/chat/stream;
- the same flow with ``websockets`` asking for speech: frames, audio, queries answered in text and WAV audio;
- the ``openai`` SDK's realtime client shows an ``input_image`` item and gets a spoken answer;
- random aborts of video chat sockets leave every scheduler idle.

Random weights answer nonsense: the checks are on the protocol and on the audio's presence. Replies are bounded
(``Settings.video_chat_max_tokens``, the realtime ``max_output_tokens``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import random
import re
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
import websockets
from openai import AsyncOpenAI
from PIL import Image
from serving_helpers import running_server
from tiny_models import tiny_asr, tiny_tts
from vl_helpers import tiny_vl_checkpoint
from vllm_omni_clients import client

from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.family import ModelKind
from omni_stream.realtime.settings import Settings
from omni_stream.requests import ChatMessage, Role, TextRequest

ROUTE = "/v1/video/chat/stream"
REPLY_TOKENS = 8


@pytest.fixture(scope="module")
def vl_server(tmp_path_factory):
    paths = {"vl": tiny_vl_checkpoint(tmp_path_factory), "tts": tiny_tts(), "asr": tiny_asr()}

    async def load() -> AsyncEngine:
        sources = {
            "vl": ModelSource(paths["vl"], kind=ModelKind.TEXT),
            "tts": ModelSource(paths["tts"]),
            "asr": ModelSource(paths["asr"], kind=ModelKind.TRANSCRIPTION),
        }
        return await AsyncEngine.load(sources, progress=False)

    # benchmark fields on: a realtime reply bounded by max_output_tokens runs to its bound (ignore_eos), so a random
    # model cannot end it before the speech model has anything to say
    settings = Settings(video_chat_max_tokens=REPLY_TOKENS, vad_factory=None, turn_model_factory=None,
                        enable_benchmark_fields=True)  # fmt: skip
    with running_server(None, settings, load=load) as live:
        assert live.engine.models.text().info.sees_images
        yield live


def eventually(condition, within: float = 60.0) -> bool:
    """Whether ``condition()`` holds within ``within`` seconds (server-side teardown runs after the client's end)."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def model_name(live) -> str:
    return live.engine.models.text().info.model_name


def picture(seed: int, size: tuple[int, int] = (96, 64), fmt: str = "JPEG") -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def send(ws, kind: str, **fields: object) -> None:
    await ws.send(json.dumps({"type": kind, **fields}))


async def reply(ws, spoken: bool) -> list[dict]:
    """The events of one reply, through its last: response.audio.done when it is spoken, else response.text.done."""
    last = "response.audio.done" if spoken else "response.text.done"
    events: list[dict] = []
    while not events or events[-1]["type"] != last:
        event = json.loads(await asyncio.wait_for(ws.recv(), 120))
        assert event["type"] != "error", event
        events.append(event)
    return events


def test_vllm_omni_streaming_video_client_unchanged(vl_server) -> None:
    path = client("streaming_video_client.py")
    if path is None:
        pytest.fail(
            "vLLM-Omni's streaming_video_client.py was not fetched: run `python tests/vllm_omni_clients.py fetch`"
        )
    run = subprocess.run(
        [sys.executable, str(path), "--host", "127.0.0.1", "--port", str(vl_server.port),
         "--model", model_name(vl_server), "--query", "Describe what you see.", "--synthetic-frames", "10"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "Generated 10 synthetic frames" in out and "Sent all 10 frames" in out
    assert "Session complete." in out, out
    assert "Error:" not in out and "[unknown message]" not in out, out
    assert not any(vl_server.wait_idle(timeout=60, kind=ModelKind.TEXT).values())


def test_video_chat_spoken_replies_with_audio_in(vl_server) -> None:
    tone = (np.sin(np.arange(16000) * 2 * np.pi * 220 / 16000) * 8000).astype("<i2").tobytes()  # 1 s at 16 kHz

    async def run() -> None:
        async with websockets.connect(vl_server.ws_url + ROUTE, max_size=16 * 1024 * 1024) as ws:
            await send(ws, "session.config", model=model_name(vl_server), num_frames=3, max_frames=8,
                       system_prompt="Answer briefly.", sampling_params_list=[{"temperature": 0}])  # fmt: skip
            for i in range(5):
                await send(ws, "video.frame", data=b64(picture(i)))
            await send(ws, "audio.chunk", data=b64(tone))
            await send(ws, "video.query", text="What happens here?")
            events = await reply(ws, spoken=True)
            kinds = [e["type"] for e in events]
            assert kinds[0] == "response.start" and "response.text.delta" in kinds, kinds
            done = next(e for e in events if e["type"] == "response.text.done")
            assert done["text"] == "".join(e["delta"] for e in events if e["type"] == "response.text.delta")
            wavs = [base64.b64decode(e["data"]) for e in events if e["type"] == "response.audio.delta"]
            assert wavs and all(e["format"] == "wav" for e in events if e["type"] == "response.audio.delta")
            for wav in wavs:  # each a whole WAV file of 16-bit mono PCM at the speech model's rate
                assert wav[:4] == b"RIFF" and wav[8:12] == b"WAVE"
                assert int.from_bytes(wav[40:44], "little") == len(wav) - 44 > 0
                assert int.from_bytes(wav[24:28], "little") == 24000
            # a second query: the history and the newest frames
            await send(ws, "video.frame", data=b64(picture(99, fmt="PNG")))
            await send(ws, "video.query", text="And now?")
            kinds = [e["type"] for e in await reply(ws, spoken=True)]
            assert kinds[0] == "response.start" and kinds[-1] == "response.audio.done"
            await send(ws, "video.done")
            assert json.loads(await asyncio.wait_for(ws.recv(), 60)) == {"type": "session.done"}

    asyncio.run(run())
    for kind in (ModelKind.TEXT, ModelKind.SPEECH, ModelKind.TRANSCRIPTION):
        assert not any(vl_server.wait_idle(timeout=60, kind=kind).values()), kind


def test_realtime_image_item_gets_a_spoken_answer(vl_server) -> None:
    sdk = AsyncOpenAI(api_key="x", base_url=f"{vl_server.url}/v1", websocket_base_url=f"{vl_server.ws_url}/v1")
    url = "data:image/png;base64," + b64(picture(5, fmt="PNG"))

    async def run() -> None:
        async with sdk.realtime.connect(model=model_name(vl_server)) as conn:
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [
                    {"type": "input_image", "image_url": url}, {"type": "input_text", "text": "What is this?"}]}
            )  # fmt: skip
            await conn.response.create(response={"max_output_tokens": REPLY_TOKENS})
            events = []
            async for event in conn:
                assert event.type != "error", event
                events.append(event)
                if event.type == "response.done":
                    break
            added = next(e for e in events if e.type == "conversation.item.added" and e.item.role == "user")
            assert [c.type for c in added.item.content] == ["input_image", "input_text"]
            audio = sum(len(base64.b64decode(e.delta)) for e in events if e.type == "response.output_audio.delta")
            assert audio > 0
            assert events[-1].response.status in ("completed", "incomplete")

    asyncio.run(run())
    for kind in (ModelKind.TEXT, ModelKind.SPEECH):
        assert not any(vl_server.wait_idle(timeout=60, kind=kind).values()), kind


def test_random_aborts_free_every_row(vl_server) -> None:
    rng = random.Random(7)

    async def one(seed: int) -> None:
        async with websockets.connect(vl_server.ws_url + ROUTE) as ws:
            await send(ws, "session.config", model=model_name(vl_server), modalities=["text", "audio"])
            for i in range(rng.randint(1, 4)):
                await send(ws, "video.frame", data=b64(picture(seed * 10 + i)))
            await send(ws, "video.query", text="Quick, what is it?")
            with contextlib.suppress(TimeoutError):  # a short reply may be over sooner: then leave after it
                for _ in range(rng.randint(0, 6)):  # leave at a random point of the reply (or before it starts)
                    await asyncio.wait_for(ws.recv(), 10)
        # the socket closed with the reply (text, speech) running

    async def run() -> None:
        await asyncio.gather(*(one(s) for s in range(6)))

    asyncio.run(run())
    for kind in (ModelKind.TEXT, ModelKind.SPEECH, ModelKind.TRANSCRIPTION):
        assert not any(vl_server.wait_idle(timeout=60, kind=kind).values()), kind
    # the server ends each session after its client has gone: its frame session closes on the device worker
    assert eventually(lambda: not vl_server.state.sessions)
    assert eventually(
        lambda: not vl_server.engine.models.text().runner.views
    )  # every frame session closed  # every frame session closed, its rows free
    # some sockets were left with their reply running (the disconnect counter counts those)
    metrics = httpx.get(f"{vl_server.url}/metrics").text
    assert re.search(r'omni_stream_client_disconnects_total\{transport="video_chat"\} [1-9]', metrics), metrics


def test_image_tokens_are_counted_as_the_prompt_spends_them(vl_server) -> None:
    family = vl_server.engine.models.text()
    text_only = len(family.encode_prompt(TextRequest(messages=(ChatMessage(Role.USER, "x"),))).ids)
    for h, w in ((30, 40), (64, 96), (500, 120), (28, 28)):
        image = np.zeros((h, w, 3), np.uint8)
        shown = family.encode_prompt(TextRequest(messages=(ChatMessage(Role.USER, "x", images=(image,)),)))
        # the template adds <|vision_start|><|image_pad|><|vision_end|>, the pad repeated per merged patch
        assert len(shown.ids) - text_only == family.count_image_tokens(image), (h, w)


@pytest.fixture(scope="module")
def small_vl_server(tmp_path_factory):
    path = tiny_vl_checkpoint(tmp_path_factory)

    async def load() -> AsyncEngine:
        sources = {"vl": ModelSource(path, kind=ModelKind.TEXT)}
        return await AsyncEngine.load(sources, progress=False, backend_args={"max_model_len": 192})

    settings = Settings(vad_factory=None, turn_model_factory=None)
    with running_server(None, settings, load=load) as live:
        yield live


def test_realtime_truncation_counts_the_images(small_vl_server) -> None:
    """Ten pictures of 26 prompt tokens each do not fit a context of 192: the oldest items leave the prompt (their
    text alone would fit, so counting only text would keep them all and the model would refuse the prompt)."""
    live = small_vl_server
    sdk = AsyncOpenAI(api_key="x", base_url=f"{live.url}/v1", websocket_base_url=f"{live.ws_url}/v1")

    async def run() -> None:
        async with sdk.realtime.connect(model=model_name(live)) as conn:
            await conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                               "audio": {"input": {"turn_detection": None}}})  # fmt: skip
            for i in range(10):
                url = "data:image/jpeg;base64," + b64(picture(i, (112, 84)))
                await conn.conversation.item.create(
                    item={"type": "message", "role": "user", "content": [
                        {"type": "input_image", "image_url": url}, {"type": "input_text", "text": f"picture {i}"}]}
                )  # fmt: skip
            await conn.response.create(response={"max_output_tokens": 4})
            async for event in conn:
                assert event.type != "error", event
                if event.type == "response.done":
                    assert event.response.status in ("completed", "incomplete"), event.response.status_details
                    assert event.response.usage.input_tokens <= 192 - 4
                    break

    asyncio.run(run())
    assert not any(live.wait_idle(timeout=60, kind=ModelKind.TEXT).values())


def test_video_chat_frames_are_prefilled_as_they_arrive(vl_server) -> None:
    """The text model keeps the session's frames in its cache: by the time a question comes, its frames' tokens
    have run through the layers, and the question prefills only its own tokens."""
    family = vl_server.engine.models.text()
    runner = family.runner
    frames = [picture(200 + i, (112, 84)) for i in range(3)]

    async def pong(ws) -> None:  # messages are handled in order: once pong is back, every frame before it is in
        await send(ws, "ping")
        while json.loads(await asyncio.wait_for(ws.recv(), 60))["type"] != "pong":
            pass

    async def run() -> None:
        async with websockets.connect(vl_server.ws_url + ROUTE) as ws:
            await send(ws, "session.config", model=model_name(vl_server), modalities=["text"], num_frames=3,
                       sampling_params_list=[{"temperature": 0, "max_tokens": 4}])  # fmt: skip
            await pong(ws)
            assert len(runner.views) == 1
            before = runner.tokens_prefilled
            for frame in frames:
                await send(ws, "video.frame", data=b64(frame))
            await pong(ws)
            (view,) = runner.views.values()
            assert len(view.frames) == 3
            image_tokens = sum(f.tokens + 2 for f in view.frames)
            assert runner.tokens_prefilled - before >= image_tokens  # the frames ran as they came
            before = runner.tokens_prefilled
            await send(ws, "video.query", text="What changed?")
            events = await reply(ws, spoken=False)
            assert events[0]["type"] == "response.start" and events[-1]["type"] == "response.text.done"
            question = runner.tokens_prefilled - before
            assert 0 < question < image_tokens, (question, image_tokens)  # the question's own tokens only
            await send(ws, "video.done")
            assert json.loads(await asyncio.wait_for(ws.recv(), 60)) == {"type": "session.done"}

    asyncio.run(run())
    assert eventually(lambda: not runner.views)  # closed once the server ended the session, after session.done
    assert not any(vl_server.wait_idle(timeout=60, kind=ModelKind.TEXT).values())
