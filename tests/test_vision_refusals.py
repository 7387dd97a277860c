"""Pictures refused end to end on a real server: WS /v1/video/chat/stream with ``websockets`` and ``input_image``
items on WS /v1/realtime with the ``openai`` SDK. The refusals need no model that sees, so they run against the
tiny random Qwen3 (a text model that does not see), whose refusal of pictures is itself one of them. The replies
of a model that sees are in test_vision_serving.py."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import numpy as np
import pytest
import websockets
from openai import AsyncOpenAI
from PIL import Image
from serving_helpers import running_server

from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.family import ModelKind
from omni_stream.realtime.settings import Settings
from omni_stream.vision.limits import FrameLimits

ROUTE = "/v1/video/chat/stream"


@pytest.fixture(scope="module")
def lm_server():
    from tiny_models import tiny_lm

    path = tiny_lm()

    async def load() -> AsyncEngine:
        return await AsyncEngine.load({"lm": ModelSource(path, kind=ModelKind.TEXT)}, progress=False)

    settings = Settings(frame_limits=FrameLimits(max_bytes=64 * 1024, max_fps=0.001, burst=4))
    with running_server(None, settings, load=load) as live:
        yield live


def picture(seed: int, size: tuple[int, int] = (64, 48), fmt: str = "JPEG") -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return base64.b64encode(buf.getvalue()).decode()


async def send(ws, kind: str, **fields: object) -> None:
    await ws.send(json.dumps({"type": kind, **fields}))


async def next_event(ws, within: float = 30.0) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), within))


async def closed_with(ws) -> int | None:
    with pytest.raises(websockets.ConnectionClosed):
        await asyncio.wait_for(ws.recv(), 60)
    return ws.close_code


def test_a_frame_before_session_config_is_refused(lm_server) -> None:
    async def run() -> None:
        async with websockets.connect(lm_server.ws_url + ROUTE) as ws:
            await send(ws, "video.frame", data=picture(1))
            error = await next_event(ws)
            assert error["type"] == "error" and error["code"] == "session_not_configured"
            assert error["param"] == "type" and "session.config" in error["message"]
            assert await closed_with(ws) == 1008

    asyncio.run(run())


def test_bad_config_names_the_field(lm_server) -> None:
    async def run() -> None:
        for config, param in (
            ({"num_frames": 500}, "num_frames"),
            ({"modalities": ["text", "audio"]}, "modalities"),  # no speech model on this server
            ({"model": "Qwen/Qwen3-Omni-MoE"}, "model"),
        ):
            async with websockets.connect(lm_server.ws_url + ROUTE) as ws:
                await send(ws, "session.config", **config)
                error = await next_event(ws)
                assert error["type"] == "error" and error["param"] == param, error
                assert await closed_with(ws) == 1008

    asyncio.run(run())


def test_bad_frames_and_a_model_that_does_not_see(lm_server) -> None:
    model = lm_server.engine.models.text().info.model_name

    async def run() -> None:
        async with websockets.connect(lm_server.ws_url + ROUTE) as ws:
            await send(ws, "session.config", model=model, enable_frame_filter=False)
            await send(ws, "video.frame", data=base64.b64encode(b"GIF89a not really").decode())
            error = await next_event(ws)
            assert (error["code"], error["param"]) == ("invalid_frame", "data")
            await send(ws, "video.frame", data=picture(2, size=(400, 400), fmt="PNG"))  # noise: over 64 KiB
            error = await next_event(ws)
            assert (error["code"], error["param"]) == ("frame_too_large", "data")
            await send(ws, "video.query", text="anything there?")
            error = await next_event(ws)
            assert error["code"] == "no_frames"
            # a burst of 4 frames, hardly refilled (a frame in 1000 s): the two bad frames took two places, so
            # two of these six are taken and four refused
            for i in range(6):
                await send(ws, "video.frame", data=picture(10 + i))
            await send(ws, "ping")
            seen = []
            while (event := await next_event(ws))["type"] != "pong":
                seen.append(event)
            assert len(seen) == 4 and {(e["code"], e["param"]) for e in seen} == {("frame_rate_exceeded", "data")}
            await send(ws, "video.query", text="what is this?")
            error = await next_event(ws)  # refused by the engine: this text model does not see
            assert (
                error["type"] == "error" and error["param"] == "messages" and "does not take images" in error["message"]
            )
            await send(ws, "video.done")
            assert await next_event(ws) == {"type": "session.done"}
            assert await closed_with(ws) == 1000

    asyncio.run(run())
    assert not any(lm_server.wait_idle(timeout=60, kind=ModelKind.TEXT).values())


def test_realtime_image_item_refused_by_a_model_that_does_not_see(lm_server) -> None:
    model = lm_server.engine.models.text().info.model_name
    client = AsyncOpenAI(api_key="x", base_url=f"{lm_server.url}/v1", websocket_base_url=f"{lm_server.ws_url}/v1")
    url = "data:image/jpeg;base64," + picture(3)

    async def run() -> None:
        async with client.realtime.connect(model=model) as conn:
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": url}]}
            )
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}
            )
            errors = []
            async for event in conn:
                if event.type == "error":
                    errors.append(event.error)
                    if len(errors) == 2:
                        break
                assert event.type in ("session.created", "conversation.created", "error"), event.type
            assert errors[0].param == "item.content[0].image_url" and "does not take images" in errors[0].message
            assert errors[1].param == "item.content[0].image_url" and "data: URL" in errors[1].message

    asyncio.run(run())
