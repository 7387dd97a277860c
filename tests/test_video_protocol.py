"""The /v1/realtime/video protocol as a pure state machine: messages in, actions out, time passed in by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

from omni_stream.family import ModelKind
from omni_stream.realtime.common.close_codes import CloseCode
from omni_stream.realtime.video.protocol import (
    Close,
    Phase,
    SendBinary,
    SendText,
    StartGeneration,
    StopGeneration,
    VideoLimits,
    VideoProtocol,
)
from omni_stream.video.spec import ChunkPrompt, PromptSchedule, VideoChunk, VideoInfo, resolve_request

INFO = VideoInfo(
    "tiny", "HeliosPipeline", ModelKind.VIDEO, frames_per_chunk=33,
    default_width=32, default_height=32, max_width=128, max_height=128,
    max_num_frames=99, default_num_frames=66, default_steps=2, default_guidance=1.0,
)  # fmt: skip
LIMITS = VideoLimits(start_timeout=10.0, stall_timeout=60.0, max_control_bytes=1024)


def new(now: float = 0.0) -> VideoProtocol:
    return VideoProtocol(
        lambda r: resolve_request(INFO, r),
        models=("tiny",),
        frames_per_chunk=INFO.frames_per_chunk,
        limits=LIMITS,
        now=now,
    )


def msg(**body) -> str:
    return json.dumps(body)


def texts(actions) -> list[dict]:
    return [json.loads(a.text) for a in actions if isinstance(a, SendText)]


def chunk(index: int, prompt: ChunkPrompt | None = None, n: int = 33) -> VideoChunk:
    frames = np.zeros((n, 32, 32, 3), np.uint8)
    return VideoChunk(frames, index, index * 33, 16, prompt or ChunkPrompt((("a cat", 1.0),)))


def streaming(now: float = 0.0, **start) -> VideoProtocol:
    p = new(now)
    (action,) = p.receive_text(msg(type="session.start", prompt="a cat", **start), now)
    assert isinstance(action, StartGeneration)
    (started,) = texts(p.started(now, 'video/mp4; codecs="avc1.42c00a"'))
    assert started["type"] == "video.start"
    return p


def test_a_session_streams_start_then_metadata_binary_pairs_then_done():
    p = new()
    (action,) = p.receive_text(msg(type="session.start", model="tiny", prompt="a cat", num_frames=80, seed=3), 0.0)
    assert isinstance(action, StartGeneration) and action.format == "m4s" and action.image_reference is None
    assert (action.request.num_frames, action.request.width, action.request.seed) == (80, 32, 3)
    (start,) = texts(p.started(1.0, "video/mp4"))
    assert start == {
        "type": "video.start", "request_id": action.request.request_id, "format": "m4s",
        "config": {"prompt": "a cat", "width": 32, "height": 32, "fps": 16, "num_frames": 80, "num_inference_steps": 2,
                   "guidance_scale": 1.0, "seed": 3, "negative_prompt": None, "image_reference": False,
                   "frames_per_chunk": 33, "num_chunks": 3, "model": "tiny", "mime_type": "video/mp4"},
    }  # fmt: skip
    for k in range(3):
        meta, binary = p.chunk_ready(chunk(k, n=33 if k < 2 else 14), b"x" * (10 + k), 2.0 + k)
        assert isinstance(meta, SendText) and isinstance(binary, SendBinary) and binary.data == b"x" * (10 + k)
        body = json.loads(meta.text)
        assert body == {
            "type": "video.chunk_metadata", "request_id": action.request.request_id, "kind": "media",
            "transport_chunk_index": k, "generation_chunk_index": k, "num_frames": 33 if k < 2 else 14,
            "byte_length": 10 + k, "started_event_ids": [], "active_event_ids": [], "completed_event_ids": [],
        }  # fmt: skip
    done, close = p.generation_ended(6.0)
    assert json.loads(done.text) == {"type": "session.done", "request_id": action.request.request_id, "chunks": 3,
                                     "stopped": False}  # fmt: skip
    assert close == Close(CloseCode.NORMAL) and p.phase is Phase.CLOSED


def test_stop_mid_stream_sends_at_most_the_chunk_in_hand_then_done_stopped():
    p = streaming()
    p.chunk_ready(chunk(0), b"a", 1.0)
    assert p.receive_text(msg(type="session.stop"), 1.5) == [StopGeneration()]
    assert p.receive_text(msg(type="session.stop"), 1.6) == []  # once
    assert len(p.chunk_ready(chunk(1), b"b", 2.0)) == 2  # the chunk already encoded still goes out as a pair
    (done, close) = p.generation_ended(2.1)
    assert json.loads(done.text)["stopped"] is True and json.loads(done.text)["chunks"] == 2
    assert p.chunks_after_stop == 1 and close == Close(CloseCode.NORMAL)
    assert p.chunk_ready(chunk(2), b"c", 3.0) == []  # nothing once done


def test_a_prompt_interaction_is_queued_into_the_requests_steering_channel():
    p = streaming()
    interaction = {"event_id": "ui-1", "event": {"prompt": "a dog"}, "transition_chunks": 2}
    (queued,) = texts(p.receive_text(msg(type="session.interaction", interaction=interaction), 1.0))
    assert queued == {"type": "session.interaction.queued", "request_id": p.request_id, "event_id": "ui-1"}
    steering = p.request.steering
    assert len(steering) == 1
    # a retry of the same update is acknowledged again and not queued twice
    assert texts(p.receive_text(msg(type="session.interaction", interaction=interaction), 1.1)) == [queued]
    assert len(steering) == 1
    # the stage takes it between chunks; the chunk it starts reports the event id
    prompt = PromptSchedule("a cat").next_chunk(steering.take())
    meta, _ = p.chunk_ready(chunk(1, prompt), b"x", 2.0)
    assert json.loads(meta.text)["started_event_ids"] == ["ui-1"]
    assert json.loads(meta.text)["active_event_ids"] == ["ui-1"]
    # the same event id for another update is a conflict; no event id gets one made up
    other = {**interaction, "event": {"prompt": "a fox"}}
    (error,) = texts(p.receive_text(msg(type="session.interaction", interaction=other), 2.1))
    assert error["code"] == "event_id_conflict" and error["event_id"] == "ui-1"
    (queued,) = texts(p.receive_text(msg(type="session.interaction", interaction={"event": {"prompt": "x"}}), 2.2))
    assert queued["event_id"].startswith("evt-")


def test_interactions_beyond_the_channel_capacity_are_refused_with_a_code():
    p = streaming()
    codes = []
    for i in range(p.request.steering.capacity + 1):
        interaction = {"event_id": f"e{i}", "event": {"prompt": f"p{i}"}}
        codes.append(texts(p.receive_text(msg(type="session.interaction", interaction=interaction), 1.0))[0])
    assert [c["type"] for c in codes[:-1]] == ["session.interaction.queued"] * p.request.steering.capacity
    assert codes[-1]["code"] == "interaction_not_queued"
    # a refused event id may be sent again later
    p.request.steering.take()
    again = {"event_id": codes[-1]["event_id"], "event": {"prompt": "later"}}
    assert texts(p.receive_text(msg(type="session.interaction", interaction=again), 2.0))[0]["type"].endswith("queued")


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ("not json", "invalid_json"),
        ("[1, 2]", "invalid_message"),
        (msg(type="session.ping"), "session_not_started"),
        (msg(type="session.interaction", interaction={}), "session_not_started"),
        (msg(type="session.start"), "invalid_request"),  # no prompt
        (msg(type="session.start", prompt="x", width=50), "invalid_request"),
        (msg(type="session.start", prompt="x", fps=0), "invalid_request"),
        (msg(type="session.start", prompt="x", fps=500), "invalid_request"),
        (msg(type="session.start", prompt="x", num_frames=0), "invalid_request"),
        (msg(type="session.start", prompt="x", num_frames=100), "invalid_request"),
        (msg(type="session.start", prompt="x", num_frames="9"), "invalid_request"),
        (msg(type="session.start", prompt="x", format="gif"), "unsupported_format"),
        (msg(type="session.start", prompt="x", model="other"), "model_not_found"),
        (msg(type="session.start", prompt="x", colour="red"), "invalid_request"),
        (msg(type="session.start", prompt="x", extra_params={"a": 1}), "invalid_request"),
        (msg(type="session.start", prompt="x", extra_params=[]), "invalid_request"),  # no object: as the speech routes
        (msg(type="session.start", prompt="x", image_reference={"image_url": "https://x/y.png"}), "invalid_request"),
    ],
)
def test_a_bad_first_message_gets_an_error_code_and_closes(message, code):
    p = new()
    actions = p.receive_text(message, 0.0)
    (error,) = texts(actions)
    assert error["type"] == "error" and error["code"] == code and error["message"]
    assert actions[-1] == Close(CloseCode.POLICY, code) and p.phase is Phase.CLOSED
    if message == msg(type="session.start"):
        assert error["message"] == "'prompt' is required", error
    if "num_frames" in message and '"num_frames": 0' in message:
        assert "must be at least 1" in error["message"] or "between" in error["message"], error


def test_a_binary_first_message_is_refused_and_closes():
    p = new()
    actions = p.receive_binary(b"\x00\x01", 0.0)
    assert texts(actions)[0]["code"] == "binary_not_supported" and isinstance(actions[-1], Close)


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ("{", "invalid_json"),
        (msg(type="session.start", prompt="again"), "session_already_started"),
        (msg(type="video.frame"), "unknown_message_type"),
        (msg(type="session.interaction"), "invalid_message"),
        (msg(type="session.interaction", interaction={"event": {"prompt": ""}}), "invalid_request"),
        (msg(type="session.interaction", interaction={"event": {"prompt": "x"}, "transition_chunks": -1}),
         "invalid_request"),
        (msg(type="session.interaction", interaction={"event_id": "e" * 257, "event": {"prompt": "x"}}),
         "invalid_request"),
        (msg(type="session.interaction", interaction={"event": {"prompt": "x", "negative_prompt": "y"}}),
         "unsupported_interaction"),
        (msg(type="session.ping", pad="x" * 2000), "message_too_large"),
    ],
)  # fmt: skip
def test_bad_messages_while_streaming_get_an_error_and_the_stream_goes_on(message, code):
    p = streaming()
    (error,) = texts(p.receive_text(message, 1.0))
    assert error["code"] == code and p.phase is Phase.STREAMING
    (error,) = texts(p.receive_binary(b"x", 1.0))
    assert error["code"] == "binary_not_supported" and p.phase is Phase.STREAMING


@pytest.mark.parametrize(
    ("interaction", "param"),
    [
        ({"event": {"prompt": ""}}, "interaction.event.prompt"),
        ({"event": {"prompt": "x"}, "transition_chunks": 65}, "interaction.transition_chunks"),
        ({"event_id": "e" * 257, "event": {"prompt": "x"}}, "interaction.event_id"),
    ],
)
def test_a_bad_interaction_value_names_its_path(interaction, param):
    """A value problem in an interaction is ``invalid_request`` naming the field by its path in the message (an
    event_id is echoed in every later chunk's lists: at most 256 characters)."""
    p = streaming()
    (error,) = texts(p.receive_text(msg(type="session.interaction", interaction=interaction), 1.0))
    assert (error["code"], error["param"]) == ("invalid_request", param), error
    assert param in error["message"] or "event_id" in error["message"], error


def test_the_start_timeout_closes_a_silent_connection():
    p = new(now=100.0)
    assert p.deadline() == 110.0
    assert p.timeout(109.9) == []  # woken early: nothing happens
    actions = p.timeout(110.0)
    assert texts(actions)[0]["code"] == "start_timeout" and actions[-1] == Close(CloseCode.POLICY, "start_timeout")


def test_the_stall_timer_restarts_on_progress_and_pings_and_ends_a_stalled_session():
    p = streaming(now=0.0)
    assert p.deadline() == 60.0
    p.chunk_ready(chunk(0), b"a", 30.0)
    assert p.deadline() == 90.0
    assert texts(p.receive_text(msg(type="session.ping"), 80.0)) == [{"type": "session.pong"}]
    assert p.deadline() == 140.0 and p.timeout(139.0) == []
    actions = p.timeout(140.0)
    assert actions[0] == StopGeneration()
    assert texts(actions)[0]["code"] == "stall_timeout" and actions[-1].code == CloseCode.INTERNAL
    assert p.phase is Phase.CLOSED and p.deadline() is None


def test_a_disconnect_stops_the_generation_and_a_failure_reports_an_error():
    p = streaming()
    assert p.disconnected() == [StopGeneration()] and p.phase is Phase.CLOSED
    q = streaming()
    actions = q.generation_failed("boom", 1.0)
    assert texts(actions)[0] == {"type": "error", "code": "generation_failed", "message": "boom",
                                 "request_id": q.request_id}  # fmt: skip
    assert actions[-1] == Close(CloseCode.INTERNAL)


def test_a_start_that_fails_after_validation_reports_and_closes():
    p = new()
    p.receive_text(msg(type="session.start", prompt="x", image_reference="data:image/png;base64,AAAA"), 0.0)
    actions = p.start_failed("invalid_request", "not an image", "image_reference")
    assert texts(actions)[0]["param"] == "image_reference" and isinstance(actions[-1], Close)


def test_the_readme_lists_every_error_code_the_socket_sends():
    """Every code the protocol can put in an ``error`` event is in the README's video section (a client reads it
    there, not in the source)."""
    import re
    from pathlib import Path

    import omni_stream.realtime.video.protocol as protocol

    source = Path(protocol.__file__).read_text()
    codes = set(re.findall(r'(?:ProtocolError|error_action|_refuse)\(\s*"([a-z_]+)"', source))
    codes |= set(re.findall(r'code = "([a-z_]+)"', source)) | set(re.findall(r'"([a-z_]+)" if exc\.param', source))
    assert {"invalid_json", "model_not_found", "stall_timeout", "generation_failed"} <= codes, codes
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme[readme.index("## Video streaming") :]
    section = section[: section.index("\n## ")]
    assert not {code for code in codes if f"`{code}`" not in section}, "README's video section lacks these codes"
