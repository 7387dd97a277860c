"""Serving test helpers: a real uvicorn server on 127.0.0.1 (random free port, background thread), real engine.

The engine is built inside the server's lifespan. The speech tests serve the tiny Qwen3-TTS CustomVoice checkpoint
of :func:`tts_checkpoint` (greedy, :data:`TTS_FRAMES` frames when a request names no bound: the same text in the
same voice gives the same audio, so two ways of asking are compared sample by sample); the tests that keep the
synthetic TTS (``tests/synthetic``: deterministic tones, fault markers) say why. ``LiveServer.family`` exposes the
speech family (its scheduler for step counts and step hooks, :func:`step_hook`).
"""

from __future__ import annotations

import contextlib
import io
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import numpy as np
import pytest
import soundfile as sf
import uvicorn
from synthetic import SyntheticConfig, tone_samples, write_checkpoint
from websockets.exceptions import ConnectionClosed

from omni_stream.codecs.pcm import to_int16
from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.family import ModelKind
from omni_stream.realtime.app import create_app
from omni_stream.realtime.graceful import GracefulServer
from omni_stream.realtime.server import uvicorn_config
from omni_stream.realtime.settings import Settings

MODEL = "synthetic-tts"
RATE = 24000
VOICE_TONES = {"alice": 1, "bob": 2, "carol": 3, "dave": 4}
FRAME = 1920  # samples per 80 ms codec frame at 24 kHz (Qwen3-TTS and the synthetic TTS alike)
TTS_FRAMES = 9  # frames the tests' Qwen3-TTS speaks for a request without max_new_tokens (greedy, capped)


def tts_checkpoint() -> Path:
    """The tiny Qwen3-TTS CustomVoice checkpoint of the speech route tests (``tiny_models.tiny_tts``: greedy both
    code predictors, ``max_new_tokens`` ``TTS_FRAMES + 1`` in its generation config, built once per machine)."""
    from tiny_models import tiny_tts

    return tiny_tts("custom_voice", greedy_frames=TTS_FRAMES + 1)


@dataclass
class LiveServer:
    app: Any
    server: uvicorn.Server
    thread: threading.Thread
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def state(self) -> Any:
        return self.app.state.omni

    @property
    def engine(self) -> Any:
        return self.state.engine

    @property
    def family(self) -> Any:
        return self.engine.models.speech()

    def wait_idle(self, timeout: float = 10.0, kind: str = "speech") -> dict[str, int]:
        """Wait until the ``kind`` model's scheduler holds no per-request state; returns its live counts."""
        deadline = time.monotonic() + timeout
        scheduler = self.engine.models.get(kind).scheduler
        while True:
            live = scheduler.live()
            if not any(live.values()) or time.monotonic() > deadline:
                return live
            time.sleep(0.01)


@contextlib.contextmanager
def running_server(
    checkpoint: Path | None,
    settings: Settings | None = None,
    *,
    llm: Path | None = None,
    load: Any = None,
    ws_deflate: bool = False,
    start_timeout: float = 30.0,
    **engine_options: Any,
) -> Iterator[LiveServer]:
    """Serve ``checkpoint`` (and the text model ``llm``, if given; or the engine the async factory ``load``
    builds) until the block ends (``engine_options`` go to ``AsyncEngine.from_pretrained``), with the settings
    ``omni-stream serve`` gives uvicorn."""

    async def load_checkpoint() -> Any:
        return await AsyncEngine.from_pretrained(checkpoint, llm=llm, progress=False, **engine_options)

    app = create_app(load or load_checkpoint, settings or Settings())
    # IPPROTO_TCP named: asyncio turns Nagle's algorithm off only on sockets that say TCP (with it on, a kept-alive
    # client waits 40 ms for each response's second segment, the delayed ACK)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn_config(app, log_level="warning", timeout_graceful_shutdown=5, ws_deflate=ws_deflate)
    server = GracefulServer(config, app.state.omni)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="test-uvicorn")
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield LiveServer(app, server, thread, port)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@contextlib.contextmanager
def default_server(settings: Settings | None = None) -> Iterator[LiveServer]:
    """What ``omni-stream serve`` with no arguments serves: the embedded tiny model of every kind."""

    async def load() -> AsyncEngine:
        return await AsyncEngine.load(None, progress=False)

    with running_server(None, settings, load=load, start_timeout=180.0) as live:
        yield live


@contextlib.contextmanager
def text_server(checkpoint: Path, settings: Settings | None = None, **engine_options: Any) -> Iterator[LiveServer]:
    """``running_server`` with the text model ``checkpoint`` alone (what ``omni-stream serve --model LM`` loads);
    default settings accept the benchmark field ``ignore_eos``."""

    async def load() -> AsyncEngine:
        source = ModelSource(checkpoint, kind=ModelKind.TEXT)
        return await AsyncEngine.load({"llm": source}, progress=False, **engine_options)

    with running_server(None, settings or Settings(enable_benchmark_fields=True), load=load) as live:
        yield live


@contextlib.contextmanager
def encoder_meets_first_step(live: LiveServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, bool]]]:
    """A stream's encoder open and its first model step each wait (10 s at most) until the other has begun; the
    list gets ``("open", True)`` and ``("step", True)`` only if the open runs while the first chunk is being made,
    neither before the request reaches the model nor after its first chunk."""
    from omni_stream.realtime.common.audio_out import AudioOut

    open_began, step_began = threading.Event(), threading.Event()
    met: list[tuple[str, bool]] = []
    original = AudioOut.open.__func__  # type: ignore[attr-defined]

    async def meeting_open(cls: type[AudioOut], *args: Any, **kwargs: Any) -> AudioOut:
        open_began.set()
        met.append(("open", await anyio.to_thread.run_sync(step_began.wait, 10.0)))
        return await original(cls, *args, **kwargs)

    def meeting_step(batch: Any) -> None:
        if not step_began.is_set():
            step_began.set()
            met.append(("step", open_began.wait(10.0)))

    monkeypatch.setattr(AudioOut, "open", classmethod(meeting_open))
    with step_hook(live, meeting_step):
        yield met


@dataclass
class StepLog:
    """What the ``kind`` model ran while :func:`step_log` was open: ``("step", prefill_ids, decode_ids)`` per step
    and ``("release", seq_id)`` per release, in order; ``released`` counts each sequence's releases."""

    events: list[tuple[Any, ...]]
    released: dict[int, int]

    def steps_of(self, seq_id: int) -> int:
        return sum(1 for e in self.events if e[0] == "step" and seq_id in e[1] + e[2])

    def seq_ids(self) -> set[int]:
        return {s for e in self.events if e[0] == "step" for s in e[1] + e[2]}


@contextlib.contextmanager
def step_log(live: LiveServer, before: Any = None, kind: str = "speech") -> Iterator[StepLog]:
    """Record the ``kind`` model's steps and releases (and run ``before(batch)`` at each step's start, on the device
    worker) until the block ends: the scheduler's own calls into the model, whatever the family."""
    model = live.engine.models.get(kind).scheduler.model
    log = StepLog([], {})
    release = model.release

    def record(batch: Any) -> None:
        if before is not None:
            before(batch)
        log.events.append(("step", tuple(s.seq_id for s in batch.prefill), tuple(s.seq_id for s in batch.decode)))

    def recorded_release(seq: Any) -> None:
        log.events.append(("release", seq.seq_id))
        log.released[seq.seq_id] = log.released.get(seq.seq_id, 0) + 1
        release(seq)

    model.release = recorded_release
    try:
        with step_hook(live, record, kind):
            yield log
    finally:
        del model.release


@contextlib.contextmanager
def step_hook(live: LiveServer, before: Any, kind: str = "speech") -> Iterator[None]:
    """``before(batch)`` runs on the device worker at the start of every step of the ``kind`` model's scheduler
    (raise from it to fail the step's batch), until the block ends."""
    model = live.engine.models.get(kind).scheduler.model
    step = model.step

    def hooked(batch: Any) -> Any:
        before(batch)
        return step(batch)

    model.step = hooked
    try:
        yield
    finally:
        del model.step  # the class's own method again


_SPOKEN: dict[tuple[str, str, str, str], bytes] = {}


def spoken(live: LiveServer, voice: str, text: str, **fields: Any) -> bytes:
    """The PCM16 bytes ``live`` speaks for ``text`` in ``voice`` (and the request ``fields``) when asked for a whole
    PCM body over HTTP (asked once per server). On the tests' greedy Qwen3-TTS every other way of asking (a stream,
    a WebSocket unit, SSE) gives these samples: a route's audio is checked against them."""
    key = (live.url, voice, text, json.dumps(fields, sort_keys=True))
    if key not in _SPOKEN:
        body = {"input": text, "voice": voice, "response_format": "pcm", **fields}
        r = httpx.post(f"{live.url}/v1/audio/speech", json=body, timeout=60)
        assert r.status_code == 200, r.text
        _SPOKEN[key] = r.content
    return _SPOKEN[key]


def assert_same_pcm(got: bytes, want: bytes) -> None:
    """PCM16 ``got`` is ``want`` but for one 16-bit step a sample: what a request batched with others gives (its
    rows computed in other shapes round differently), where one alone gives ``want`` to the byte."""
    a, b = np.frombuffer(got, "<i2").astype(np.int32), np.frombuffer(want, "<i2").astype(np.int32)
    assert a.size == b.size and a.size > 0, (a.size, b.size)
    assert int(np.abs(a - b).max()) <= 1


def make_checkpoint(directory: Path, **options: Any) -> Path:
    return write_checkpoint(directory, **options)


def expected_tone(voice: str, text: str, config: SyntheticConfig | None = None) -> np.ndarray:
    """The exact float32 audio the synthetic model speaks for ``text`` in built-in ``voice``."""
    config = config or SyntheticConfig()
    n_frames = max(1, round(len(text.strip()) * config.frames_per_char))
    return tone_samples(config, VOICE_TONES[voice], 0, n_frames)


def pcm16(samples: np.ndarray) -> bytes:
    """What the server's PCM encoder makes of float32 samples (rounded, clipped int16 LE)."""
    return to_int16(samples).astype("<i2").tobytes()


def pcm_to_float(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32767.0


def wav_bytes(seconds: float, rate: int = 16000, hz: float = 300.0) -> bytes:
    """A mono 16-bit WAV of a sine tone."""
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


class Session:
    """A thin client: JSON out, (kind, payload) in."""

    def __init__(self, ws):
        self.ws = ws

    def send(self, **message):
        self.ws.send(json.dumps(message))

    def recv(self, timeout: float = 10.0):
        message = self.ws.recv(timeout=timeout)
        return ("binary", message) if isinstance(message, bytes) else ("json", json.loads(message))

    def until(self, kind: str, timeout: float = 10.0) -> list:
        """Messages up to and including the first JSON message of type ``kind``."""
        out = []
        while True:
            msg = self.recv(timeout)
            out.append(msg)
            if msg[0] == "json" and msg[1]["type"] == kind:
                return out

    def closed_code(self, timeout: float = 10.0) -> int:
        with pytest.raises(ConnectionClosed) as info:
            while True:
                self.ws.recv(timeout=timeout)
        return info.value.rcvd.code if info.value.rcvd else None


def units_of(messages: list) -> list[dict]:
    """Group an utterance's messages into units: start, frames, done."""
    units, current = [], None
    for kind, payload in messages:
        if kind == "json" and payload["type"] == "audio.start":
            current = {"start": payload, "frames": []}
        elif kind == "binary":
            current["frames"].append(payload)
        elif kind == "json" and payload["type"] == "audio.done":
            current["done"] = payload
            units.append(current)
            current = None
    return units
