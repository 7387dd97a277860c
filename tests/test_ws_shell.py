"""The one WebSocket shell (realtime/common/ws_shell.py) under the three sockets, on the real tiny families: every
open session is in the server's registry while it runs, and a server shutting down closes each with 1001 after its
own goodbye; a refused connection never enters the registry."""

from __future__ import annotations

import json

import pytest
from lm_helpers import tiny_lm_checkpoint
from serving_helpers import running_server
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.family import ModelKind
from omni_stream.models.qwen3_tts.checkpoint import write_tiny_checkpoint
from omni_stream.realtime.settings import Settings

pytest_plugins = ("video_fixtures",)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, video_checkpoint):
    pytest.importorskip("diffusers")
    tts = write_tiny_checkpoint(tmp_path_factory.mktemp("shell-tts"), "custom_voice")
    return {"tts": tts, "lm": tiny_lm_checkpoint(tmp_path_factory), "video": video_checkpoint}


def _server(checkpoints):
    async def load() -> AsyncEngine:
        sources = {
            "tts": ModelSource(checkpoints["tts"]),
            "lm": ModelSource(checkpoints["lm"], kind=ModelKind.TEXT),
            "video": ModelSource(checkpoints["video"], kind=ModelKind.VIDEO),
        }
        return await AsyncEngine.load(sources, progress=False)

    return running_server(None, Settings(vad_factory=None), load=load)


def _until_closed(ws) -> tuple[list, int]:
    """Every message until the server closes the socket, and its close code."""
    messages = []
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            message = ws.recv(timeout=30)
            messages.append(message if isinstance(message, bytes) else json.loads(message))
    assert closed.value.rcvd is not None, "the server closed without a close frame"
    return messages, closed.value.rcvd.code


def _gauge(live, transport: str) -> float:
    return live.state.metrics.streams.labels(transport)._value.get()


def test_a_shutdown_closes_every_socket_with_1001_after_its_goodbye(checkpoints):
    with _server(checkpoints) as live:
        voice = live.engine.speech_info.voices[0]
        speech = connect(f"{live.ws_url}/v1/audio/speech/stream")
        speech.send(json.dumps({"type": "session.config", "voice": voice, "response_format": "pcm"}))
        agent = connect(f"{live.ws_url}/v1/realtime")
        assert json.loads(agent.recv(timeout=30))["type"] == "session.created"
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a story."}]}
        agent.send(json.dumps({"type": "conversation.item.create", "item": item}))
        agent.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 400}}))
        while json.loads(agent.recv(timeout=60))["type"] != "response.output_audio.delta":
            pass  # the response is running (speaking)
        video = connect(f"{live.ws_url}/v1/realtime/video")
        video.send(json.dumps({"type": "session.start", "prompt": "a kite", "width": 32, "height": 32,
                               "num_frames": 99, "num_inference_steps": 1}))  # fmt: skip
        assert json.loads(video.recv(timeout=60))["type"] == "video.start"
        assert {_gauge(live, t) for t in ("ws", "realtime", "video")} == {1.0}
        assert len(live.state.sessions) == 3
        live.server.should_exit = True  # what SIGTERM does: GracefulServer tells the sessions first
        messages, code = _until_closed(speech)
        assert code == 1001 and messages[-1] == {"type": "error", "message": "Server shutting down"}
        messages, code = _until_closed(agent)
        assert code == 1001 and messages[-1]["type"] == "error"
        assert messages[-1]["error"]["code"] == "server_shutdown"
        [done] = [m["response"] for m in messages if m["type"] == "response.done"]  # every response ends
        assert done["status"] == "failed" and done["status_details"]["error"]["code"] == "server_shutdown"
        messages, code = _until_closed(video)
        assert code == 1001 and messages[-1]["code"] == "server_shutdown"
        assert not live.state.sessions and {_gauge(live, t) for t in ("ws", "realtime", "video")} == {0.0}
        assert not any(live.wait_idle(kind="video").values())


def test_a_refused_connection_is_closed_with_1008_and_never_registered(checkpoints):
    with _server(checkpoints) as live:
        agent = connect(f"{live.ws_url}/v1/realtime?model=no-such-model")
        messages, code = _until_closed(agent)
        assert code == 1008 and messages[0]["error"]["code"] == "model_not_found"
        agent = connect(f"{live.ws_url}/v1/realtime?intent=transcribe")  # misspelt: not a realtime session instead
        messages, code = _until_closed(agent)
        assert code == 1008 and messages[0]["error"]["code"] == "invalid_intent"
        assert messages[0]["error"]["param"] == "intent"
        assert _gauge(live, "realtime") == 0.0 and not live.state.sessions
