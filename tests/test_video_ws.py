"""WS /v1/realtime/video on a live server with the tiny Helios, driven by the real ``websockets`` client."""

from __future__ import annotations

import contextlib
import io
import json
import socket

import pytest

pytest.importorskip("diffusers", reason="needs the [video] extra (diffusers)")

import av
from video_helpers import chunks_begun, steps_after_release, video_server, wait_quiet, wait_until
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from omni_stream.realtime.settings import Settings

pytest_plugins = ("video_fixtures", "serving_fixtures")

S = 32
SNDBUF = 8192  # the server's kernel send buffer (Linux doubles it): a stalled reader blocks sends after a few chunks
RCVBUF = 4096  # the stalled client's kernel receive buffer (doubled too)
ASYNCIO_HIGH_WATER = 64 * 1024  # asyncio transports pause writing above it (uvicorn keeps the default)
CLIENT_READ = 64 * 1024  # what the websockets client reads off its socket at once before its queue pauses it


@pytest.fixture(scope="module")
def live(video_checkpoint):
    settings = Settings(video_start_timeout=1.0, api_key=None)
    with video_server(video_checkpoint, settings, sndbuf=SNDBUF) as server:
        yield server


def family(live):
    return live.engine.models.get("video")


def session_of(live, request_id):
    return next(s for s in list(live.state.sessions) if getattr(s, "request_id", None) == request_id)


def start(ws, **fields):
    ws.send(json.dumps({"type": "session.start", "prompt": "a kite over a hill", "width": S, "height": S,
                        "num_inference_steps": 1, **fields}))  # fmt: skip


def recv(ws, timeout=20.0):
    message = ws.recv(timeout=timeout)
    return message if isinstance(message, bytes) else json.loads(message)


def run_to_done(ws):
    """Every message up to session.done: (start, [(metadata, bytes)], done, others)."""
    first = recv(ws)
    assert first["type"] == "video.start", first
    pairs, others = [], []
    while True:
        message = recv(ws)
        assert not isinstance(message, bytes), "a binary frame came without its metadata"
        if message["type"] == "video.chunk_metadata":
            data = recv(ws)
            assert isinstance(data, bytes) and len(data) == message["byte_length"]
            pairs.append((message, data))
        elif message["type"] == "session.done":
            return first, pairs, message, others
        else:
            others.append(message)


def decoded_frames(data: bytes) -> list:
    with av.open(io.BytesIO(data)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


def test_a_session_streams_every_chunk_as_metadata_and_one_binary_frame(live):
    num_frames = 5 * 33 - 20
    with connect(f"{live.ws_url}/v1/realtime/video") as ws:
        start(ws, num_frames=num_frames, fps=12, seed=4)
        begin, pairs, done, others = run_to_done(ws)
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd.code == 1000 and not others
    request_id = begin["request_id"]
    assert begin["format"] == "m4s" and begin["config"]["num_chunks"] == 5 and begin["config"]["fps"] == 12
    assert begin["config"]["mime_type"].startswith('video/mp4; codecs="avc1.')
    assert done == {"type": "session.done", "request_id": request_id, "chunks": 5, "stopped": False}
    assert [m["transport_chunk_index"] for m, _ in pairs] == [0, 1, 2, 3, 4]
    assert [m["generation_chunk_index"] for m, _ in pairs] == [0, 1, 2, 3, 4]
    assert [m["num_frames"] for m, _ in pairs] == [33, 33, 33, 33, 13]
    assert all(m["kind"] == "media" and m["request_id"] == request_id for m, _ in pairs)
    assert pairs[0][1][4:8] == b"ftyp"  # the init segment first
    frames = decoded_frames(b"".join(data for _, data in pairs))
    assert len(frames) >= num_frames and all(f.shape == (S, S, 3) for f in frames)
    assert chunks_begun(family(live).step_log, request_id) == 5
    wait_until(lambda: not any(family(live).live().values()), what="the request to be released")


def test_each_chunk_decodes_to_exactly_the_frames_its_metadata_counts(live):
    # A browser appends each chunk as it comes: what it can show after chunk k must be every frame announced so far.
    with connect(f"{live.ws_url}/v1/realtime/video") as ws:
        start(ws, num_frames=3 * 33 - 7, seed=5)
        _, pairs, done, _ = run_to_done(ws)
    assert done["chunks"] == 3
    received, announced = b"", 0
    for meta, data in pairs:
        received += data
        announced += meta["num_frames"]
        assert len(decoded_frames(received)) == announced, meta


def test_the_first_chunk_is_sent_before_half_of_the_video_is_generated(live):
    with connect(f"{live.ws_url}/v1/realtime/video") as ws:
        start(ws, num_frames=5 * 33)
        begin = recv(ws)
        session = session_of(live, begin["request_id"])
        *_, done = run_to_done_after_start(ws)
    assert done["chunks"] == 5
    # frames the engine had generated when each chunk's bytes went to the socket: chunk k leaves before chunk k + 2
    # is made, so the first one leaves with at most 2 of the 5 chunks generated (event order, not wall time)
    assert session.sent_progress[0] <= 2 * 33 < 5 * 33 / 2
    assert all(made <= (k + 2) * 33 for k, made in enumerate(session.sent_progress))


def run_to_done_after_start(ws):
    pairs, others = [], []
    while True:
        message = recv(ws)
        if message["type"] == "video.chunk_metadata":
            pairs.append((message, recv(ws)))
        elif message["type"] == "session.done":
            return pairs, others, message
        else:
            others.append(message)


def test_stop_mid_stream_ends_within_one_chunk_and_runs_no_further_step(live):
    with connect(f"{live.ws_url}/v1/realtime/video") as ws:
        start(ws, num_frames=8 * 33, num_inference_steps=4)
        begin = recv(ws)
        session = session_of(live, begin["request_id"])
        meta = recv(ws)
        assert meta["type"] == "video.chunk_metadata" and isinstance(recv(ws), bytes)
        ws.send(json.dumps({"type": "session.stop"}))
        pairs, others, done = run_to_done_after_start(ws)
    assert done["stopped"] is True and done["chunks"] == 1 + len(pairs) < 8 and not others
    assert session.protocol.chunks_after_stop <= 1  # at most the chunk in hand when the stop arrived
    wait_until(lambda: not any(family(live).live().values()), what="the request to be released")
    assert steps_after_release(family(live).step_log, begin["request_id"]) == []
    assert chunks_begun(family(live).step_log, begin["request_id"]) < 8


def test_a_prompt_interaction_is_queued_and_applied_from_a_next_chunk(live):
    with connect(f"{live.ws_url}/v1/realtime/video") as ws:
        start(ws, num_frames=6 * 33)
        assert recv(ws)["type"] == "video.start"
        first = recv(ws)
        assert first["started_event_ids"] == [] and isinstance(recv(ws), bytes)
        interaction = {"event_id": "ui-42", "event": {"prompt": "a red dog runs"}, "transition_chunks": 0}
        ws.send(json.dumps({"type": "session.interaction", "interaction": interaction}))
        pairs, others, done = run_to_done_after_start(ws)
    assert {"type": "session.interaction.queued", "request_id": first["request_id"], "event_id": "ui-42"} in others
    started = [m["generation_chunk_index"] for m, _ in pairs if m["started_event_ids"] == ["ui-42"]]
    assert len(started) == 1 and 1 <= started[0] <= 3  # the chunk after the ones already under way
    assert all(m["completed_event_ids"] == (["ui-42"] if m["generation_chunk_index"] == started[0] else [])
               for m, _ in pairs)  # fmt: skip
    assert done["chunks"] == 6 and done["stopped"] is False


@contextlib.contextmanager
def stalled_client(live):
    """A client that reads nothing after the handshake (a tiny receive buffer, a one-message queue), then drops."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
    sock.connect(("127.0.0.1", live.port))
    with connect(f"{live.ws_url}/v1/realtime/video", sock=sock, max_queue=1, close_timeout=0.2) as ws:
        try:
            yield ws
        finally:
            sock.shutdown(socket.SHUT_RDWR)  # gone without a closing handshake, as a crashed client would be


def test_a_stalled_reader_parks_its_request_while_another_session_keeps_streaming(live):
    fam = family(live)
    with stalled_client(live) as stalled:
        stalled.send(json.dumps({"type": "session.start", "prompt": "stall", "width": 64, "height": 64,
                                 "num_frames": 20 * 33, "num_inference_steps": 1}))  # fmt: skip
        session = wait_until(lambda: next((s for s in list(live.state.sessions) if s.generated), None), what="start")
        request_id = session.request_id

        # Wait until it stops moving (the socket buffers are full; the assertions below fail if it had not): quiet,
        # and no chunk of it on the device (a chunk's decode may be one long quiet step on a busy machine).
        def parked_state():
            while True:
                state = wait_quiet(
                    lambda: (
                        session.sent,
                        chunks_begun(fam.step_log, request_id),
                        len(fam.step_log.of(request_id)),
                        session.encoded_bytes,
                        fam.scheduler.live()["sessions"],
                    )
                )
                if state[-1] == 0:
                    return state[:-1]

        parked = parked_state()
        # parked: the socket took `sent` chunks, one more is in the session's hands, one more generated in the stage
        assert parked[1] == parked[0] + 2 and fam.step_log.of(request_id)[-1].kind == "decode"
        with connect(f"{live.ws_url}/v1/realtime/video") as other:
            start(other, num_frames=3 * 33)
            _, pairs, done, _ = run_to_done(other)
        assert done["chunks"] == 3 and len(pairs) == 3  # the other session ran to the end meanwhile
        # ... while the stalled one ran no model step and sent nothing more
        assert (
            session.sent,
            chunks_begun(fam.step_log, request_id),
            len(fam.step_log.of(request_id)),
            session.encoded_bytes,
        ) == parked
        assert session.sent < 20 - 2  # it really stalled (the socket buffers hold a few chunks only)
        assert session.generated <= session.sent + 1  # the bound: one chunk in hand, one in the stage
        # The stated bound: every byte the server made for a stalled session sits in a buffer of fixed size, so it
        # does not grow with the video: the socket buffers on both sides and asyncio's write buffer (64 KiB high
        # water), the client library's read buffer and queue, plus the chunk in the session's hands.
        chunk = session.peak_unsent_bytes
        bound = 2 * SNDBUF + 2 * RCVBUF + ASYNCIO_HIGH_WATER + CLIENT_READ + 3 * chunk
        assert session.encoded_bytes <= bound < 20 * chunk
    # the stalled client leaves without ever reading: its request is released, nothing runs after
    wait_until(lambda: not any(fam.live().values()), what="the stalled request to be released")
    assert steps_after_release(fam.step_log, request_id) == []


def test_a_disconnect_frees_the_request(live):
    fam = family(live)
    registry = live.state.metrics.registry

    def gone() -> float:
        return registry.get_sample_value("omni_stream_client_disconnects_total", {"transport": "video"}) or 0.0

    before = gone()
    with connect(f"{live.ws_url}/v1/realtime/video") as ws:
        start(ws, num_frames=10 * 33, num_inference_steps=3)
        begin = recv(ws)
        assert recv(ws)["type"] == "video.chunk_metadata"
    wait_until(lambda: not any(fam.live().values()), what="the request to be released")
    assert steps_after_release(fam.step_log, begin["request_id"]) == []
    assert chunks_begun(fam.step_log, begin["request_id"]) < 10
    assert gone() == before + 1  # counted on /metrics


@pytest.mark.parametrize(
    ("first", "code"),
    [
        ("{not json", "invalid_json"),
        (b"\x00binary", "binary_not_supported"),
        (json.dumps({"type": "session.ping"}), "session_not_started"),
        (json.dumps({"type": "session.start", "prompt": "x", "width": 30}), "invalid_request"),
        (json.dumps({"type": "session.start", "prompt": "x", "fps": 1000}), "invalid_request"),
        (json.dumps({"type": "session.start", "prompt": "x", "num_frames": 100_000}), "invalid_request"),
        (json.dumps({"type": "session.start", "prompt": "x", "format": "mkv"}), "unsupported_format"),
        (json.dumps({"type": "session.start", "prompt": "x", "model": "nope"}), "model_not_found"),
        (json.dumps({"type": "session.start", "prompt": "x", "image_reference": "data:image/png;base64,AAAA"}),
         "invalid_request"),
    ],
)  # fmt: skip
def test_bad_input_gets_an_error_with_a_code_and_nothing_hangs(live, first, code):
    with connect(f"{live.ws_url}/v1/realtime/video") as ws:
        ws.send(first)
        error = recv(ws, timeout=10)
        assert error["type"] == "error" and error["code"] == code and error["message"]
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd.code == 1008


def test_bad_messages_mid_stream_get_errors_and_the_video_goes_on(live):
    with connect(f"{live.ws_url}/v1/realtime/video") as ws:
        start(ws, num_frames=2 * 33)
        assert recv(ws)["type"] == "video.start"
        ws.send(b"\x01\x02")
        ws.send("{")
        ws.send(json.dumps({"type": "session.start", "prompt": "again"}))
        ws.send(json.dumps({"type": "session.ping"}))
        pairs, others, done = run_to_done_after_start(ws)
    codes = [m.get("code") for m in others if m["type"] == "error"]
    assert len(pairs) == 2
    assert codes == ["binary_not_supported", "invalid_json", "session_already_started"]
    assert {"type": "session.pong"} in others and done["chunks"] == 2 and not done["stopped"]


def test_a_silent_connection_gets_the_start_timeout(live):
    with connect(f"{live.ws_url}/v1/realtime/video") as ws:
        error = recv(ws, timeout=10)  # the server's start timeout is 1 s here
        assert error["code"] == "start_timeout"
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)


def test_the_stall_timeout_ends_a_session_whose_reader_stopped(video_checkpoint):
    settings = Settings(video_stall_timeout=0.5)
    with video_server(video_checkpoint, settings, sndbuf=SNDBUF) as server:
        fam = family(server)
        with stalled_client(server) as stalled:
            stalled.send(json.dumps({"type": "session.start", "prompt": "stall", "width": 64, "height": 64,
                                     "num_frames": 20 * 33, "num_inference_steps": 1}))  # fmt: skip
            session = wait_until(lambda: next(iter(server.state.sessions), None), what="the session")
            # nothing is read, yet the server gives up after the stall timeout and frees the request
            wait_until(lambda: session.finished.is_set(), what="the stalled session to end")
            wait_until(lambda: not any(fam.live().values()), what="the stalled request to be released")
            assert steps_after_release(fam.step_log, session.request_id) == []


def test_the_route_needs_the_api_key_like_every_v1_route(video_checkpoint):
    with video_server(video_checkpoint, Settings(api_key="sekrit")) as server:
        with pytest.raises(InvalidStatus) as refused:
            connect(f"{server.ws_url}/v1/realtime/video")
        assert refused.value.response.status_code == 403
        with connect(f"{server.ws_url}/v1/realtime/video", subprotocols=["openai-insecure-api-key.sekrit"]) as ws:
            start(ws, num_frames=10)
            *_, done, _ = run_to_done(ws)
        assert done["chunks"] == 1
        with connect(f"{server.ws_url}/v1/realtime/video", additional_headers={"Authorization": "Bearer sekrit"}) as ws:
            start(ws, num_frames=10, format="webm")
            begin, pairs, done, _ = run_to_done(ws)
        assert begin["format"] == "webm" and len(decoded_frames(pairs[0][1])) == 10


def test_a_server_without_a_video_model_says_so(live_server):
    with connect(f"{live_server.ws_url}/v1/realtime/video") as ws:
        start(ws)
        error = recv(ws)
        assert error["code"] == "model_not_found" and "no video model" in error["message"]
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
