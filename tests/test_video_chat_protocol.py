"""WS /v1/video/chat/stream's protocol core (realtime/video_chat/protocol.py), without a socket: vLLM-Omni's
messages in, events and actions out, on a fake clock. The frames are real PNG and JPEG pictures decoded as the
shell decodes them."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from PIL import Image

from omni_stream.errors import InvalidRequestError
from omni_stream.realtime.common.close_codes import CloseCode
from omni_stream.realtime.video_chat.protocol import (
    CacheFrame,
    CancelQuery,
    Close,
    DecodeFrame,
    OpenCache,
    Phase,
    SendText,
    StartQuery,
    VideoChatLimits,
    VideoChatProtocol,
)
from omni_stream.requests import Role
from omni_stream.vision.frames import FrameLimits, decode_base64


def picture(value: int, fmt: str = "PNG", size: tuple[int, int] = (32, 24)) -> str:
    rng = np.random.default_rng(value)
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return base64.b64encode(buf.getvalue()).decode()


def msg(kind: str, **fields: object) -> str:
    return json.dumps({"type": kind, **fields})


def events(actions: list) -> list[dict]:
    return [json.loads(a.text) for a in actions if isinstance(a, SendText)]


def feed_frames(p: VideoChatProtocol, actions: list) -> list:
    """Perform the DecodeFrame actions as the shell does; return the other actions and what decoding gave."""
    out = []
    for action in actions:
        if isinstance(action, DecodeFrame):
            try:
                frame = decode_base64(action.data, p.limits.frames, "data")
            except InvalidRequestError as exc:
                out += p.frame_refused(exc)
            else:
                out += p.frame_decoded(frame)
        else:
            out.append(action)
    return out


def opened(now: float = 0.0, **config: object) -> VideoChatProtocol:
    p = VideoChatProtocol(models=("tiny-vl",), speaks=True, hears=True, now=now)
    assert p.receive_text(msg("session.config", **config), now) == []
    assert p.phase is Phase.OPEN
    return p


def test_the_example_client_flow() -> None:
    """What vLLM-Omni's streaming_video_client.py sends: config, frames, query, video.done at once."""
    p = opened(model="tiny-vl", modalities=["text"], max_frames=64, num_frames=16, enable_frame_filter=True,
               frame_filter_threshold=0.95, use_audio_in_video=False)  # fmt: skip
    for i in range(10):
        assert feed_frames(p, p.receive_text(msg("video.frame", data=picture(i)), 0.01 * i)) == []
    assert len(p.window) == 10
    (start,) = p.receive_text(msg("video.query", text="What do you see?"), 1.0)
    assert isinstance(start, StartQuery)
    query = start.query
    assert len(query.frames) == 10 and query.audio == b""
    request = query.request()
    assert request.speech is None  # modalities ["text"]
    (user,) = request.text.messages
    assert user.role is Role.USER and user.content == "What do you see?" and len(user.images) == 10
    assert p.receive_text(msg("video.done"), 1.1) == []  # the reply runs: session.done waits for it
    assert p.phase is Phase.ENDING
    qid = query.query_id
    assert events(p.query_started(qid)) == [{"type": "response.start"}]
    assert events(p.query_text(qid, "A ")) == [{"type": "response.text.delta", "delta": "A "}]
    assert events(p.query_text(qid, "cat.")) == [{"type": "response.text.delta", "delta": "cat."}]
    out = p.query_done(qid)
    assert events(out) == [
        {"type": "response.text.done", "text": "A cat."},
        {"type": "session.done"},
    ]
    assert out[-1] == Close(CloseCode.NORMAL)
    assert p.phase is Phase.CLOSED


def test_spoken_reply_and_history() -> None:
    p = opened()  # modalities default: text and audio where a speech model is loaded
    feed_frames(p, p.receive_text(msg("video.frame", data=picture(1)), 0.0))
    (start,) = p.receive_text(msg("video.query", text="first?"), 0.5)
    qid = start.query.query_id
    assert start.query.request().speech is not None
    p.query_started(qid)
    p.query_text(qid, "one")
    assert events(p.query_text_done(qid)) == [{"type": "response.text.done", "text": "one"}]
    (audio,) = events(p.query_audio(qid, b"RIFF....WAVE"))
    assert audio["type"] == "response.audio.delta" and audio["format"] == "wav"
    assert base64.b64decode(audio["data"]) == b"RIFF....WAVE"
    assert events(p.query_done(qid)) == [{"type": "response.audio.done"}]  # text.done was sent already
    (start2,) = p.receive_text(msg("video.query", text="second?"), 1.0)
    history = start2.query.request().text.messages
    assert [(m.role, m.content, len(m.images)) for m in history] == [
        (Role.USER, "first?", 0),  # the history is text only
        (Role.ASSISTANT, "one", 0),
        (Role.USER, "second?", 1),
    ]


def test_system_prompt_sampling_and_aliases() -> None:
    p = opened(
        system_prompt="Be brief.",
        num_sample_frames=2,
        evs_enabled=False,
        sampling_params_list=[{"temperature": 0, "max_tokens": 7, "seed": 3}, {}, None],
    )
    assert p.config is not None and p.config.num_frames == 2 and not p.config.enable_frame_filter
    for i in range(5):
        feed_frames(p, p.receive_text(msg("video.frame", data=picture(100)), 0.1 * i))  # the same picture
    assert len(p.window) == 5  # filter off: duplicates kept
    (start,) = p.receive_text(msg("video.query", text="q"), 1.0)
    request = start.query.request().text
    assert request.messages[0].role is Role.SYSTEM and request.messages[0].content == "Be brief."
    assert len(request.messages[-1].images) == 2
    assert request.max_tokens == 7 and request.seed == 3
    assert request.sampling is not None and not request.sampling.do_sample


def test_near_duplicates_are_dropped_quietly_and_the_window_is_bounded() -> None:
    p = opened(max_frames=3)
    for i in range(4):
        assert feed_frames(p, p.receive_text(msg("video.frame", data=picture(7)), 0.1 * i)) == []
    assert len(p.window) == 1 and p.window.duplicates == 3
    for i in range(10):
        feed_frames(p, p.receive_text(msg("video.frame", data=picture(20 + i)), 1 + 0.1 * i))
    assert len(p.window) == 3 and p.window.evicted == 8


def error_of(actions: list) -> dict:
    (event,) = [e for e in events(actions) if e["type"] == "error"]
    assert event["message"]
    return event


@pytest.mark.parametrize(
    ("first", "code", "param"),
    [
        (msg("video.frame", data=picture(1)), "session_not_configured", "type"),
        (msg("video.query", text="hi"), "session_not_configured", "type"),
        (msg("session.config", num_frames=0), "invalid_value", "num_frames"),
        (msg("session.config", max_frames=257), "invalid_value", "max_frames"),
        (msg("session.config", frame_filter_threshold=1.5), "invalid_value", "frame_filter_threshold"),
        (msg("session.config", modalities=["video"]), "invalid_value", "modalities"),
        (msg("session.config", shiny=True), "invalid_value", "shiny"),
        (msg("session.config", model="other"), "model_not_found", "model"),
        (msg("session.config", sampling_params_list=[{"beam": 2}]), "invalid_value", "sampling_params_list[0].beam"),
        (msg("session.config", sampling_params_list=[{}, {"temperature": 1}]), "invalid_value",
         "sampling_params_list[1]"),
        ("not json", "invalid_json", None),
        (json.dumps([1]), "invalid_message", None),
    ],
)  # fmt: skip
def test_a_bad_first_message_is_refused_and_closes(first: str, code: str, param: str | None) -> None:
    p = VideoChatProtocol(models=("tiny-vl",), speaks=True, hears=True)
    out = p.receive_text(first, 0.0)
    error = error_of(out)
    assert (error["code"], error["param"]) == (code, param)
    assert out[-1] == Close(CloseCode.POLICY, code)
    assert p.phase is Phase.CLOSED


def test_audio_modality_needs_a_speech_model() -> None:
    p = VideoChatProtocol(speaks=False)
    error = error_of(p.receive_text(msg("session.config", modalities=["text", "audio"]), 0.0))
    assert error["param"] == "modalities" and "speech model" in error["message"]
    p = VideoChatProtocol(speaks=False)
    p.receive_text(msg("session.config"), 0.0)
    assert p.config is not None and p.config.modalities == ("text",)


def test_bad_frames_get_errors_naming_data_and_the_session_goes_on() -> None:
    limits = VideoChatLimits(frames=FrameLimits(max_bytes=2000, max_pixels=100 * 100, max_fps=2.0, burst=2))
    p = VideoChatProtocol(limits=limits)
    p.receive_text(msg("session.config"), 0.0)
    cases = [
        (base64.b64encode(b"not a picture at all").decode(), "invalid_frame"),
        ("%%% not base64", "invalid_frame"),
        (picture(1, size=(200, 200)), "frame_too_large"),  # a noisy 200x200 PNG: over 2000 bytes
        (picture(2, "PNG", size=(120, 100)), "frame_too_large"),
    ]
    for i, (data, code) in enumerate(cases):
        error = error_of(feed_frames(p, p.receive_text(msg("video.frame", data=data), 10.0 * i)))
        assert (error["code"], error["param"]) == (code, "data"), error
    pixels = VideoChatProtocol(limits=VideoChatLimits(frames=FrameLimits(max_pixels=100 * 100)))
    pixels.receive_text(msg("session.config"), 0.0)
    error = error_of(feed_frames(pixels, pixels.receive_text(msg("video.frame", data=picture(3, size=(120, 100))), 0)))
    assert error["code"] == "frame_too_large" and "120x100" in error["message"]
    for data in (None, "", 5):
        error = error_of(p.receive_text(msg("video.frame", data=data), 100.0))
        assert (error["code"], error["param"]) == ("invalid_frame", "data")
    assert p.phase is Phase.OPEN and len(p.window) == 0


def test_frames_too_frequent_are_refused_on_a_fake_clock() -> None:
    p = VideoChatProtocol(limits=VideoChatLimits(frames=FrameLimits(max_fps=4.0, burst=2)))
    p.receive_text(msg("session.config", enable_frame_filter=False), 0.0)
    assert feed_frames(p, p.receive_text(msg("video.frame", data=picture(1)), 0.0)) == []
    assert feed_frames(p, p.receive_text(msg("video.frame", data=picture(2)), 0.0)) == []
    out = p.receive_text(msg("video.frame", data=picture(3)), 0.1)  # 0.4 of a place refilled
    error = error_of(out)
    assert (error["code"], error["param"]) == ("frame_rate_exceeded", "data")
    assert not any(isinstance(a, DecodeFrame) for a in out)  # refused before any decoding
    assert feed_frames(p, p.receive_text(msg("video.frame", data=picture(4)), 0.35)) == []
    assert len(p.window) == 3


def test_queries_without_frames_audio_and_a_new_query_stops_the_last() -> None:
    p = opened()
    error = error_of(p.receive_text(msg("video.query", text="?"), 0.0))
    assert error["code"] == "no_frames"
    feed_frames(p, p.receive_text(msg("video.frame", data=picture(1)), 0.0))
    pcm = (np.arange(1600, dtype=np.int16)).tobytes()
    assert p.receive_text(msg("audio.chunk", data=base64.b64encode(pcm).decode()), 0.1) == []
    (first,) = p.receive_text(msg("video.query", text="one", audio_data=base64.b64encode(pcm).decode()), 0.2)
    assert first.query.audio == pcm + pcm and p.audio == bytearray()  # the query takes the buffered audio
    assert first.query.request("you said hi").text.messages[-1].content == "you said hi one"
    p.query_started(first.query.query_id)
    cancel, second = p.receive_text(msg("video.query", text="two"), 0.3)
    assert cancel == CancelQuery(first.query.query_id) and isinstance(second, StartQuery)
    assert p.query_text(first.query.query_id, "late") == []  # nothing more of the stopped reply
    assert p.query_done(first.query.query_id) == []
    qid = second.query.query_id
    assert events(p.query_failed(qid, "invalid_request", "no images here", "messages")) == [
        {"type": "error", "message": "no images here", "code": "invalid_request", "param": "messages"}
    ]
    assert p.query is None and p.phase is Phase.OPEN


def test_audio_errors() -> None:
    p = VideoChatProtocol(limits=VideoChatLimits(max_audio_bytes=100), hears=True)
    p.receive_text(msg("session.config"), 0.0)
    assert p.receive_text(msg("audio.chunk", data=base64.b64encode(bytes(60)).decode()), 0.0) == []
    error = error_of(p.receive_text(msg("audio.chunk", data=base64.b64encode(bytes(60)).decode()), 0.0))
    assert (error["code"], error["param"]) == ("audio_buffer_overflow", "data") and p.audio == bytearray()
    error = error_of(p.receive_text(msg("audio.chunk", data=base64.b64encode(bytes(3)).decode()), 0.0))
    assert (error["code"], error["param"]) == ("invalid_audio", "data")
    deaf = VideoChatProtocol(hears=False)
    deaf.receive_text(msg("session.config"), 0.0)
    error = error_of(deaf.receive_text(msg("audio.chunk", data=base64.b64encode(bytes(4)).decode()), 0.0))
    assert error["code"] == "audio_not_supported"


def test_unknown_messages_ping_binary_and_a_second_config() -> None:
    p = opened()
    assert events(p.receive_text(msg("ping"), 0.0)) == [{"type": "pong"}]
    assert error_of(p.receive_text(msg("video.rewind"), 0.0))["code"] == "unknown_type"
    assert error_of(p.receive_text(msg("session.config"), 0.0))["code"] == "session_already_configured"
    assert error_of(p.receive_binary(b"\xff\xd8", 0.0))["code"] == "invalid_message"
    assert p.phase is Phase.OPEN


def test_timers_config_and_idle() -> None:
    p = VideoChatProtocol(limits=VideoChatLimits(config_timeout=10.0, idle_timeout=60.0), now=100.0)
    assert p.deadline() == 110.0 and p.timeout(109.0) == []
    out = p.timeout(110.0)
    assert error_of(out)["code"] == "config_timeout" and out[-1] == Close(CloseCode.POLICY, "config_timeout")
    p = opened(now=0.0)
    feed_frames(p, p.receive_text(msg("video.frame", data=picture(1)), 5.0))
    assert p.deadline() == 65.0
    (start,) = p.receive_text(msg("video.query", text="?"), 6.0)
    assert p.deadline() is None  # no idle timer while a reply runs
    p.query_done(start.query.query_id)
    assert p.deadline() == 66.0
    out = p.timeout(66.0)
    assert error_of(out)["code"] == "idle_timeout" and out[-1] == Close(CloseCode.NORMAL)


def test_disconnect_and_shutdown_stop_the_running_query() -> None:
    p = opened()
    feed_frames(p, p.receive_text(msg("video.frame", data=picture(1)), 0.0))
    (start,) = p.receive_text(msg("video.query", text="?"), 0.0)
    assert p.disconnected() == [CancelQuery(start.query.query_id)]
    p = opened()
    feed_frames(p, p.receive_text(msg("video.frame", data=picture(1)), 0.0))
    (start,) = p.receive_text(msg("video.query", text="?"), 0.0)
    out = p.shutdown()
    assert out[0] == CancelQuery(start.query.query_id) and out[-1] == Close(CloseCode.GOING_AWAY)
    assert error_of(out)["code"] == "server_shutdown"
    assert p.query_text(start.query.query_id, "x") == []


def test_a_model_that_caches_frames_gets_them_as_they_are_kept() -> None:
    p = VideoChatProtocol(caches=True)
    assert p.receive_text(msg("session.config", num_frames=3, system_prompt="Be brief."), 0.0) == [
        OpenCache(3, "Be brief.")
    ]
    assert feed_frames(p, p.receive_text(msg("video.frame", data=picture(1)), 0.0)) == []  # not open yet
    assert p.cache_opened() == [] and p.caching
    out = feed_frames(p, p.receive_text(msg("video.frame", data=picture(2)), 0.1))
    assert len(out) == 1 and isinstance(out[0], CacheFrame) and out[0].frame is p.window.frames[-1]
    assert feed_frames(p, p.receive_text(msg("video.frame", data=picture(2)), 0.2)) == []  # a duplicate: dropped
    error = error_of(p.frame_not_cached(InvalidRequestError("the frame does not fit the session's rows", "image")))
    assert (error["code"], error["param"]) == ("invalid_frame", "data")
    (start,) = p.receive_text(msg("video.query", text="one?"), 1.0)
    assert start.query.cached
    p.query_done(start.query.query_id)
    (start,) = p.receive_text(msg("video.query", text="two?"), 2.0)
    cached = tuple(np.zeros((4, 4, 3), np.uint8) for _ in range(2))
    messages = start.query.request("", cached).text.messages
    # no history between the system turn and the frames: the prompt starts with the session's cached rows
    assert [(m.role, m.content) for m in messages] == [(Role.SYSTEM, "Be brief."), (Role.USER, "two?")]
    assert messages[-1].images == cached
