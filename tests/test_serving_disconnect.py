"""Disconnects free the batch slot within one step (proved with the model's step log), in every transport
and mode; 16 concurrent streams complete with no cross-talk. On the tiny Qwen3-TTS (the shared greedy server:
long streams ask for 200 frames with ``ignore_eos``)."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterator

import anyio
import httpx
import pytest
from serving_helpers import FRAME, TTS_FRAMES, LiveServer, StepLog, assert_same_pcm, spoken, step_log
from websockets.sync.client import connect

LONG = "This sentence is long enough to keep the model busy for many steps. " * 14
FRAMES = 200  # a long stream: exactly this many frames (ignore_eos), ~16 s of audio
LONG_FIELDS = {"max_new_tokens": FRAMES, "ignore_eos": True}
VOICES = ("vivian", "ryan", "serena", "aiden")

pytest_plugins = ("serving_fixtures",)


@pytest.fixture(scope="module")
def live(live_server) -> Iterator[LiveServer]:
    return live_server


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


@contextlib.contextmanager
def frozen_after_first_chunk(live: LiveServer) -> Iterator[tuple[Callable[[], None], StepLog]]:
    """Yields ``(freeze, log)``: after ``freeze()``, the worker blocks at its next step until the block ends.

    On exit it checks that the request the client abandoned was released by the server while the worker
    was frozen, and that the worker ran it in at most one more step (the one already scheduled).
    """
    scheduler = live.family.scheduler
    gate = threading.Event()
    gate.set()
    mark: list[int] = []
    with step_log(live, lambda batch: gate.wait(10)) as log:

        def freeze() -> None:
            gate.clear()
            mark.append(len(log.events))

        try:
            yield freeze, log
            # The client is gone: the server must drop the session without the worker's help.
            assert wait_for(lambda: scheduler.live()["sessions"] == 0), scheduler.live()
        finally:
            gate.set()
        assert not any(live.wait_idle().values())
    events = list(log.events)
    assert len(log.seq_ids()) == 1, events
    (seq,) = log.seq_ids()
    after = [e for e in events[mark[0] :] if e[0] == "step" and seq in e[1] + e[2]]
    assert len(after) <= 1, after
    assert ("release", seq) in events and log.released[seq] == 1
    assert log.steps_of(seq) < FRAMES  # it never ran to the end
    metrics = httpx.get(f"{live.url}/metrics").text
    assert not re.search(r'omni_stream_active_streams\{transport="\w+"\} [1-9]', metrics), metrics


@pytest.mark.parametrize("fields", [{"stream_format": "audio"}, {"stream": True}], ids=["raw", "sse"])
def test_http_stream_disconnect(live, fields):
    body = {"input": LONG, "voice": "vivian", "response_format": "pcm", **LONG_FIELDS, **fields}
    with frozen_after_first_chunk(live) as (freeze, _), httpx.Client(base_url=live.url, timeout=30) as c:
        with c.stream("POST", "/v1/audio/speech", json=body) as r:
            assert r.status_code == 200
            chunks = r.iter_raw()  # keep it referenced: a dropped iterator closes the connection
            next(chunks)
            freeze()
        # leaving the block closed the connection mid-stream


def test_http_whole_body_disconnect(live):
    body = {"input": LONG, "voice": "ryan", "response_format": "wav", **LONG_FIELDS}
    seen = threading.Event()

    with frozen_after_first_chunk(live) as (freeze, log):

        async def client() -> None:
            async with httpx.AsyncClient(base_url=live.url, timeout=30) as c:
                with anyio.move_on_after(30):
                    async with anyio.create_task_group() as tg:

                        async def watch() -> None:
                            # The request has started generating: freeze, then hang up.
                            await anyio.to_thread.run_sync(
                                lambda: wait_for(lambda: any(e[0] == "step" for e in log.events))
                            )
                            freeze()
                            seen.set()
                            tg.cancel_scope.cancel()

                        tg.start_soon(watch)
                        await c.post("/v1/audio/speech", json=body)

        anyio.run(client)
    assert seen.is_set()


@pytest.mark.parametrize("stream_audio", [True, False], ids=["pcm-chunks", "whole-file"])
def test_websocket_disconnect(live, stream_audio):
    config = {"type": "session.config", "voice": "serena", "response_format": "pcm", "stream_audio": stream_audio}
    config |= LONG_FIELDS
    with frozen_after_first_chunk(live) as (freeze, log):
        with connect(f"{live.ws_url}/v1/audio/speech/stream") as ws:
            ws.send(json.dumps(config))
            ws.send(json.dumps({"type": "input.text", "text": LONG}))
            ws.send(json.dumps({"type": "input.done"}))
            assert json.loads(ws.recv(timeout=10))["type"] == "audio.start"
            if stream_audio:
                assert isinstance(ws.recv(timeout=10), bytes)
            else:
                assert wait_for(lambda: any(e[0] == "step" for e in log.events))
            freeze()
    # a new session works at once
    with connect(f"{live.ws_url}/v1/audio/speech/stream") as ws:
        ws.send(json.dumps({"type": "session.config", "voice": "serena", "response_format": "pcm"}))
        ws.send(json.dumps({"type": "input.text", "text": "Again."}))
        ws.send(json.dumps({"type": "input.done"}))
        messages = [ws.recv(timeout=10) for _ in range(4)]
    assert messages[1] == spoken(live, "serena", "Again.")


def test_metrics_count_the_disconnect(live):
    body = {"input": LONG, "voice": "aiden", "response_format": "pcm", "stream_format": "audio", **LONG_FIELDS}
    with frozen_after_first_chunk(live) as (freeze, _), httpx.Client(base_url=live.url, timeout=30) as c:
        with c.stream("POST", "/v1/audio/speech", json=body) as r:
            chunks = r.iter_raw()  # keep it referenced: a dropped iterator closes the connection
            next(chunks)
            freeze()
            assert re.search(r'omni_stream_active_streams\{transport="http"\} 1\.0', c.get("/metrics").text)
    metrics = httpx.get(f"{live.url}/metrics").text
    assert re.search(r'omni_stream_active_streams\{transport="http"\} 0\.0', metrics), metrics
    assert re.search(r'omni_stream_client_disconnects_total\{transport="http"\} [1-9]', metrics), metrics


def test_running_gauge_returns_to_zero_after_a_disconnect(live):
    body = {"input": LONG, "voice": "aiden", "response_format": "pcm", "stream_format": "audio", **LONG_FIELDS}
    with frozen_after_first_chunk(live) as (freeze, _), httpx.Client(base_url=live.url, timeout=30) as c:
        with c.stream("POST", "/v1/audio/speech", json=body) as r:
            chunks = r.iter_raw()
            next(chunks)
            freeze()
    metrics = httpx.get(f"{live.url}/metrics").text
    assert re.search(r'omni_stream_requests_running\{scheduler="talker"\} 0\.0', metrics), metrics


def test_sixteen_concurrent_streams_without_cross_talk(live):
    texts = [
        "Short one.",
        "A medium length sentence here.",
        "A somewhat longer sentence, with a clause or two.",
        "The longest sentence of the four, which keeps going for quite a while before it ends.",
    ]
    jobs = [(voice, text) for voice in VOICES for text in texts]
    results: dict[int, bytes] = {}

    async def one(c: httpx.AsyncClient, i: int, voice: str, text: str) -> None:
        body = {"input": text, "voice": voice, "response_format": "pcm", "stream_format": "audio"}
        async with c.stream("POST", "/v1/audio/speech", json=body) as r:
            assert r.status_code == 200
            results[i] = b"".join([chunk async for chunk in r.aiter_bytes()])

    async def main() -> None:
        limits = httpx.Limits(max_connections=32)
        async with httpx.AsyncClient(base_url=live.url, timeout=60, limits=limits) as c:
            async with anyio.create_task_group() as tg:
                for i, (voice, text) in enumerate(jobs):
                    tg.start_soon(one, c, i, voice, text)

    scheduler = live.family.scheduler
    alone = {job: spoken(live, *job) for job in jobs}  # each request by itself, before the batch
    gathered: list[bool] = []

    def gather(batch) -> None:
        # The first step waits until every request has joined, so all 16 share the batch.
        if not gathered:
            gathered.append(wait_for(lambda: scheduler.live()["sessions"] == len(jobs)))

    with step_log(live, gather) as log:
        anyio.run(main)
    assert gathered == [True]
    for i, job in enumerate(jobs):
        assert len(results[i]) == TTS_FRAMES * FRAME * 2, job
        assert_same_pcm(results[i], alone[job])  # its own audio: the batch's other rows never leak into it
    assert max(len(e[1]) + len(e[2]) for e in log.events if e[0] == "step") == len(jobs)  # really batched
    assert not any(live.wait_idle().values())


def test_health_and_metrics_answer_while_the_worker_is_busy(live):
    body = {"input": LONG, "voice": "vivian", "response_format": "pcm", "stream_format": "audio", **LONG_FIELDS}
    with frozen_after_first_chunk(live) as (freeze, _), httpx.Client(base_url=live.url, timeout=30) as c:
        with c.stream("POST", "/v1/audio/speech", json=body) as r:
            chunks = r.iter_raw()
            next(chunks)
            freeze()  # the device worker is now stuck inside a model step
            assert c.get("/health", timeout=2).json()["status"] == "ok"
            assert c.get("/metrics", timeout=2).status_code == 200
            assert c.get("/v1/models", timeout=2).status_code == 200
