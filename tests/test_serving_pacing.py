"""Paced streams in the serving layer (``Settings.pace_streams_seconds``), on a live server of the tiny Qwen3-TTS
with a fake clock.

The pacer's clock is replaced by one that moves only when the pacer sleeps, so what pacing does is exact:
with a producer faster than real time, a stream of ``total`` seconds whose last chunk lasts ``last`` seconds
sleeps ``total - ahead - last`` seconds in all (the lead reaches the bound, then one chunk goes per chunk played).
"""

from __future__ import annotations

import base64
import json

import anyio
import httpx
import pytest
from serving_helpers import FRAME, TTS_FRAMES, running_server, spoken, tts_checkpoint
from websockets.sync.client import connect

from omni_stream.realtime.common import stream_pacing
from omni_stream.realtime.settings import Settings
from omni_stream.realtime.speech.voice_store import VoiceStore
from omni_stream.realtime.state import ServerState
from omni_stream.speech.pacing import Pacer

AHEAD = 1.0
TEXT = "A sentence long enough to speak for a while."
LONG = {"max_new_tokens": 50, "ignore_eos": True}  # exactly 50 frames: 4 s of audio, in the codec's windows
RATE = 24000

pytest_plugins = ("serving_fixtures",)


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds


class Recorder:
    """Pacers built by the serving layer, on the fake clock, with every chunk duration they were told."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.durations: list[float] = []

    def __call__(self, ahead: float) -> Pacer:
        recorder = self

        class RecordingPacer(Pacer):
            def sent(self, duration: float) -> None:
                recorder.durations.append(duration)
                super().sent(duration)

        return RecordingPacer(ahead, self.clock)

    def check(self, total: float) -> None:
        assert sum(self.durations) == pytest.approx(total)
        assert sum(self.clock.sleeps) == pytest.approx(total - AHEAD - self.durations[-1])


@pytest.fixture(scope="module")
def paced_server():
    settings = Settings(
        pace_streams_seconds=AHEAD, ws_config_timeout=5, ws_idle_timeout=10, enable_benchmark_fields=True
    )
    with running_server(tts_checkpoint(), settings) as live:
        yield live


@pytest.fixture
def recorder(monkeypatch) -> Recorder:
    recorder = Recorder()
    monkeypatch.setattr(stream_pacing, "Pacer", recorder)
    return recorder


def seconds(frames: int) -> float:
    return frames * FRAME / RATE


def sent_seconds(client: httpx.Client, transport: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(f'omni_stream_audio_sent_seconds_total{{transport="{transport}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_raw_http_stream_is_paced_and_complete(paced_server, recorder):
    with httpx.Client(base_url=paced_server.url, timeout=60) as c:
        before = sent_seconds(c, "http")
        body = {"input": TEXT, "voice": "vivian", "response_format": "pcm", "stream_format": "audio", **LONG}
        r = c.post("/v1/audio/speech", json=body)
        assert r.status_code == 200 and r.content == spoken(paced_server, "vivian", TEXT, **LONG)
        assert sent_seconds(c, "http") - before == pytest.approx(seconds(50))
    recorder.check(seconds(50))
    assert len(recorder.durations) > 2  # streamed in several chunks, each a whole number of frames
    assert all(d / seconds(1) == pytest.approx(round(d / seconds(1))) for d in recorder.durations)


def test_sse_stream_is_paced_and_complete(paced_server, recorder):
    with httpx.Client(base_url=paced_server.url, timeout=60) as c:
        body = {"input": TEXT, "voice": "ryan", "response_format": "pcm", "stream": True, **LONG}
        r = c.post("/v1/audio/speech", json=body)
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done"
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert audio == spoken(paced_server, "ryan", TEXT, **LONG)
    recorder.check(seconds(50))


def run_session(url: str, config: dict, texts: list[str]) -> list[bytes]:
    frames = []
    with connect(f"{url}/v1/audio/speech/stream") as ws:
        ws.send(json.dumps({"type": "session.config", **config}))
        for text in texts:
            ws.send(json.dumps({"type": "input.text", "text": text}))
        ws.send(json.dumps({"type": "input.done"}))
        while True:
            message = ws.recv(timeout=30)
            if isinstance(message, bytes):
                frames.append(message)
            elif json.loads(message)["type"] == "session.done":
                return frames


def test_websocket_units_share_one_playback_clock(paced_server, recorder):
    """Two sentences play back to back: one pacer spans both, so the lead stays bounded across them."""
    first, second = "The first sentence of two.", "And the second."
    config = {"voice": "serena", "response_format": "pcm", "stream_audio": True, "split_granularity": "sentence"}
    frames = run_session(
        paced_server.ws_url, {**config, "max_new_tokens": 20, "ignore_eos": True}, [f"{first} {second}"]
    )
    want = [spoken(paced_server, "serena", text, max_new_tokens=20, ignore_eos=True) for text in (first, second)]
    assert len(b"".join(frames)) == len(b"".join(want)) == 2 * 20 * FRAME * 2
    recorder.check(seconds(40))


def test_websocket_whole_file_units_are_paced_by_their_playing_time(paced_server, recorder):
    config = {"voice": "aiden", "response_format": "wav", "split_granularity": "sentence"}
    texts = ["The first one. ", "The second one. ", "The third one."]
    frames = run_session(paced_server.ws_url, config, ["".join(texts)])
    assert len(frames) == 3 and all(f[:4] == b"RIFF" for f in frames)
    each = seconds(TTS_FRAMES)
    assert recorder.durations == pytest.approx([each] * 3)
    # each file after the first waits until the lead has fallen back to the bound
    recorder.check(3 * each)


def test_unpaced_server_counts_sent_audio_without_pacing(live_server, recorder):
    with httpx.Client(base_url=live_server.url, timeout=60) as c:
        before = sent_seconds(c, "http")
        body = {"input": TEXT, "voice": "vivian", "response_format": "pcm", "stream_format": "audio", **LONG}
        assert c.post("/v1/audio/speech", json=body).status_code == 200
        assert sent_seconds(c, "http") - before == pytest.approx(seconds(50))
    assert recorder.durations == [] and recorder.clock.sleeps == []


async def test_interrupt_ends_a_pacing_wait_at_once(monkeypatch):
    """input.cancel must not wait out a paced chunk: ``interrupt()`` ends the wait."""

    class StuckClock:
        def now(self) -> float:
            return 0.0

        async def sleep(self, seconds: float) -> None:
            await anyio.sleep_forever()

    monkeypatch.setattr(stream_pacing, "Pacer", lambda ahead: Pacer(ahead, StuckClock()))

    state = ServerState(settings=Settings(pace_streams_seconds=0.5), voices=VoiceStore(None))
    pacer = stream_pacing.SessionPacer(state)
    pacer.sent(2.0)  # 2 s queued at t=0: the next frame must wait 1.5 s
    finished = anyio.Event()

    async def waiter() -> None:
        await pacer.wait()
        finished.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        assert not finished.is_set()
        pacer.interrupt()
        with anyio.fail_after(5):
            await finished.wait()
