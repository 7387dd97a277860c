"""100 realtime sessions dropped at random points leave no state in any scheduler, detector or buffer.

Why the doubles (``realtime_doubles``, ``tests/synthetic``): a hundred sessions at zero step cost on two shared
cores, and the energy VAD's live detectors counted; the real families' sessions end clean in
``test_realtime_sdk.py``, ``test_realtime_agent_real.py`` and ``test_realtime_preemptive.py``."""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import random
import time
import weakref

import pytest
import websockets
from realtime_doubles import EnergyVad, spoken_words
from realtime_fixtures import agent_checkpoints, agent_loader, vad_factory
from serving_helpers import running_server

from omni_stream.realtime.agent import ws as realtime_ws
from omni_stream.realtime.agent.session import RealtimeSession
from omni_stream.realtime.settings import Settings

PREFIX = " ".join(f"Part {i} of a long answer that keeps the models busy for a while." for i in range(12))
SESSIONS, AT_ONCE = 100, 20


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    checkpoints = agent_checkpoints(tmp_path_factory.mktemp("drops"), reply_prefix=PREFIX)
    with running_server(None, Settings(vad_factory=vad_factory()), load=agent_loader(checkpoints)) as live:
        yield live


def b64(samples) -> str:
    return base64.b64encode(samples.astype("<i2").tobytes()).decode()


SPEECH = spoken_words(["three", "seven"])
CHUNKS = [b64(SPEECH[i : i + 2400]) for i in range(0, SPEECH.size, 2400)]
MANUAL = {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}}
TEXT_ITEM = {
    "type": "conversation.item.create",
    "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello. Tell me more."}]},
}


def plan(rng: random.Random) -> list[dict]:
    """A random sequence of client events: a manual or a server-VAD turn, text items, responses, cancels."""
    events: list[dict] = []
    if rng.random() < 0.5:
        events.append(MANUAL)
        events += [{"type": "input_audio_buffer.append", "audio": c} for c in CHUNKS[: rng.randint(1, len(CHUNKS))]]
        events.append({"type": "input_audio_buffer.commit"})
    else:
        events += [{"type": "input_audio_buffer.append", "audio": c} for c in CHUNKS]
    if rng.random() < 0.5:
        events.append(TEXT_ITEM)
    events.append({"type": "response.create"})
    if rng.random() < 0.3:
        events.append({"type": "response.cancel"})
        events.append({"type": "response.create"})
    return events


async def one_session(url: str, seed: int) -> None:
    rng = random.Random(seed)
    events = plan(rng)
    # drop after this many sends (most sessions send their whole plan, so many drops land mid-response)...
    cut_send = len(events) if rng.random() < 0.6 else rng.randint(0, len(events))
    cut_recv = rng.randint(0, 60)  # ...and this many received events
    ws = await websockets.connect(url)
    try:
        for event in events[:cut_send]:
            await ws.send(json.dumps(event))
        for _ in range(cut_recv):
            try:
                json.loads(await asyncio.wait_for(ws.recv(), 0.3))
            except TimeoutError:
                break  # nothing more is coming for what was sent: drop here
    finally:
        if rng.random() < 0.5:
            ws.transport.abort()  # gone without a close frame
        else:
            await ws.close()


def sessions_end(state, timeout: float = 30.0) -> bool:
    """Wait (in a thread: the server runs its own loop) until the server has noticed every disconnect."""
    deadline = time.monotonic() + timeout
    while state.sessions and time.monotonic() < deadline:
        time.sleep(0.05)
    return not state.sessions


async def test_dropped_sessions_leave_nothing_behind(agent, monkeypatch):
    sessions: weakref.WeakSet[RealtimeSession] = weakref.WeakSet()
    busy_at_drop = []  # sessions that still had engine requests running when their client left

    class Tracked(RealtimeSession):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            sessions.add(self)

        async def __aexit__(self, *exc_info):
            if self.live()["engine_requests"]:
                busy_at_drop.append(1)
            return await super().__aexit__(*exc_info)

    monkeypatch.setattr(realtime_ws, "RealtimeSession", Tracked)
    url = f"{agent.ws_url}/v1/realtime"
    for start in range(0, SESSIONS, AT_ONCE):
        await asyncio.gather(*(one_session(url, seed) for seed in range(start, start + AT_ONCE)))
    assert await asyncio.to_thread(sessions_end, agent.state), "sessions still open on the server"
    assert len(busy_at_drop) >= 10  # the drops hit running generations, not only idle sessions
    models = agent.engine.models
    assert not any(agent.wait_idle().values())
    assert not any(models.text().scheduler.live().values())
    assert not models.text().model.live and not models.speech().talker.live
    gc.collect()
    assert not list(sessions), "a session object (its buffer, detector, tasks) is still referenced"
    assert not list(EnergyVad.instances)
    assert agent.state.metrics.streams.labels("realtime")._value.get() == 0
