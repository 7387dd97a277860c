"""The real app as a Ray Serve deployment on a local cluster (loopback): 2 replicas of the synthetic model.

Why the synthetic TTS (``tests/synthetic``, found by the replicas through its entry point on ``PYTHONPATH``) and
not the tiny Qwen3-TTS: these tests hold paced streams of 8 to 16 s of audio, drain them through a redeploy and
check every byte, so the replicas must speak faster than real time, exactly as long as asked, on two shared cores;
the tiny random Qwen3-TTS runs at about real time there. ``tests/test_ray_cli.py`` serves the tiny Qwen3-TTS
through ``omni-stream serve --ray``.

Each test talks to Ray's HTTP proxy with real clients (httpx, websockets). ``x-omni-stream-replica`` tells
which replica answered; a replica's own /metrics is read by asking until that replica answers.
Runs in its own CI tier (``.ci/run``: a venv with ``.[dev,ray]``); skipped where Ray is not installed.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

pytest.importorskip("ray.serve")

import ray
from prometheus_client.parser import text_string_to_metric_families
from ray import serve
from serving_helpers import expected_tone, make_checkpoint, pcm16, wav_bytes
from synthetic import subprocess_env
from websockets.sync.client import connect

from omni_stream.realtime.ray_serve import APP_NAME, EngineSpec, RayOptions, build_application
from omni_stream.realtime.replica import HEADER
from omni_stream.realtime.settings import Settings

pytestmark = [pytest.mark.ray, pytest.mark.slow]

PACE = 1.0  # seconds a stream may run ahead of playback
BATCH = 2  # engine batch size = max_ongoing_requests per replica
QUEUED = 1  # max_queued_requests in the proxy
FRAME_SECONDS = 1920 / 24000
LONG = "x" * 200  # 100 frames: 8 s of audio, ~7 s of wall time when paced


@dataclass
class Deployment:
    url: str
    port: int
    engine: EngineSpec
    settings: Settings

    def application(self, replicas: int = 2):
        return build_application(self.engine, self.settings, _options(self.port, replicas))

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _options(port: int, replicas: int = 2) -> RayOptions:
    return RayOptions(
        host="127.0.0.1",
        port=port,
        replicas=replicas,
        cpus_per_replica=0.25,
        max_ongoing_requests=BATCH,
        max_queued_requests=QUEUED,
        retry_after_s=3,
        health_check_period_s=1,
        graceful_shutdown_timeout_s=30,
        graceful_shutdown_wait_loop_s=0.2,
    )


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    checkpoint = make_checkpoint(tmp_path_factory.mktemp("ray-synthetic"))
    voices = tmp_path_factory.mktemp("ray-voices")
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    # the replicas are Ray's worker processes: they inherit the environment that finds the synthetic families
    os.environ.update(subprocess_env(tmp_path_factory.mktemp("synthetic-site")))
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        _temp_dir=temp,
        log_to_driver=False,
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        settings = Settings(voices_dir=voices, pace_streams_seconds=PACE, ws_config_timeout=5, ws_idle_timeout=20)
        engine = EngineSpec(models=(str(checkpoint),), max_batch_size=BATCH)
        live = Deployment(f"http://127.0.0.1:{port}", port, engine, settings)
        serve.run(live.application(), name=APP_NAME, route_prefix="/")
        yield live
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            shutil.rmtree(temp, ignore_errors=True)


# --- helpers ---


def speech(text: str, voice: str = "alice", **fields) -> dict:
    return {"input": text, "voice": voice, "response_format": "pcm", **fields}


def replica_metrics(client: httpx.Client, replica: str, tries: int = 200) -> dict[str, float]:
    """That replica's /metrics as {'name{labels}': value} (asking until the router sends us there)."""
    for _ in range(tries):
        r = client.get("/metrics")
        if r.headers[HEADER] == replica:
            return _samples(r.text)
    raise AssertionError(f"replica {replica} never answered /metrics")


def _samples(text: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "replica")
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def all_replicas(client: httpx.Client, tries: int = 200) -> set[str]:
    seen: set[str] = set()
    for _ in range(tries):
        seen.add(client.get("/health").headers[HEADER])
        if len(seen) == 2:
            break
    return seen


def engine_idle(metrics: dict[str, float]) -> bool:
    return all(
        metrics.get(f"omni_stream_requests_{q}{{scheduler=talker}}", 0.0) == 0.0
        for q in ("running", "waiting", "paused")
    )


def wait_until(condition, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


# --- tests ---


def test_raw_sse_and_websocket_stream_through_the_proxy(deployment):
    text = "Hello through the proxy."
    want = pcm16(expected_tone("bob", text))
    with httpx.Client(base_url=deployment.url, timeout=60) as c:
        assert c.get("/health").json()["status"] == "ok"
        with c.stream("POST", "/v1/audio/speech", json=speech(text, "bob", stream_format="audio")) as r:
            assert r.status_code == 200 and r.headers[HEADER]
            raw = b"".join(r.iter_bytes())
        assert raw == want

        with c.stream("POST", "/v1/audio/speech", json=speech(text, "bob", stream=True)) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        assert [e["type"] for e in events][-1] == "speech.audio.done"
        audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
        assert audio == want

    with connect(f"{deployment.ws_url}/v1/audio/speech/stream") as ws:
        assert ws.response.headers[HEADER]
        ws.send(json.dumps({"type": "session.config", "voice": "bob", "response_format": "pcm", "stream_audio": True}))
        ws.send(json.dumps({"type": "input.text", "text": text}))
        ws.send(json.dumps({"type": "input.done"}))
        frames, kinds = [], []
        while True:
            message = ws.recv(timeout=30)
            if isinstance(message, bytes):
                frames.append(message)
                continue
            kinds.append(json.loads(message)["type"])
            if kinds[-1] == "session.done":
                break
        assert kinds == ["audio.start", "audio.done", "session.done"]
        assert b"".join(frames) == want


def test_concurrent_streams_land_on_both_replicas_and_the_one_past_the_queue_gets_429(deployment):
    """2 replicas x 2 slots are busy and 1 request waits in the proxy: the next is refused with 429."""
    body = speech(LONG, "carol", stream_format="audio")
    release = threading.Event()

    def hold(opened: threading.Event) -> tuple[str, int]:
        with httpx.Client(base_url=deployment.url, timeout=60) as c:
            with c.stream("POST", "/v1/audio/speech", json=body) as r:
                replica = r.headers[HEADER]
                pieces = r.iter_bytes()  # one iterator: a dropped one closes the response
                first = next(pieces)
                opened.set()
                release.wait(timeout=60)
                return replica, len(first) + sum(len(b) for b in pieces)

    with ThreadPoolExecutor(2 * BATCH + 1) as pool:
        holders = []
        for _ in range(2 * BATCH):  # one at a time: requests the proxy has not assigned yet count as queued
            opened = threading.Event()
            holders.append(pool.submit(hold, opened))
            assert opened.wait(timeout=60)
        with httpx.Client(base_url=deployment.url, timeout=60) as c:
            queued = pool.submit(lambda: httpx.post(f"{deployment.url}/v1/audio/speech", json=speech("hi"), timeout=60))
            time.sleep(1.0)  # let the proxy queue it (the only request it can hold)
            refused = c.post("/v1/audio/speech", json=speech("refused"))
        assert refused.status_code == 429, refused.text
        assert refused.headers["retry-after"] == "3"
        assert not queued.done()
        release.set()
        results = [h.result(timeout=60) for h in holders]
        assert queued.result(timeout=60).status_code == 200
    replicas = [replica for replica, _ in results]
    assert len(set(replicas)) == 2 and all(replicas.count(r) == BATCH for r in set(replicas)), replicas
    assert all(size == len(pcm16(expected_tone("carol", LONG))) for _, size in results)


def test_a_disconnect_frees_the_engine_slot_on_its_replica(deployment):
    body = speech(LONG, "dave", stream_format="audio")
    with httpx.Client(base_url=deployment.url, timeout=60) as c:
        with c.stream("POST", "/v1/audio/speech", json=body) as r:
            replica = r.headers[HEADER]
            pieces = r.iter_bytes()
            assert next(pieces)
            before = replica_metrics(c, replica)
            assert not engine_idle(before)  # the stream holds its slot while it is paced
        # leaving the block closed the connection mid-stream
        key = "omni_stream_client_disconnects_total{transport=http}"

        def freed() -> bool:
            now = replica_metrics(c, replica)
            return engine_idle(now) and now.get(key, 0) > before.get(key, 0)

        assert wait_until(freed)
        after = replica_metrics(c, replica)
        assert after[key] == before.get(key, 0) + 1
        assert after["omni_stream_active_streams{transport=http}"] == 0


def test_a_stalled_reader_never_gets_more_than_the_pacing_bound_ahead(deployment):
    """Ray's proxy buffers whatever the replica sends; pacing bounds it at the replica."""
    text = LONG * 2  # 16 s of audio
    body = speech(text, "alice", stream_format="audio")
    total = len(pcm16(expected_tone("alice", text))) / 2 / 24000
    key = "omni_stream_audio_sent_seconds_total{transport=http}"
    with httpx.Client(base_url=deployment.url, timeout=60) as c:
        sent_before = {r: replica_metrics(c, r).get(key, 0.0) for r in all_replicas(c)}
        started = time.monotonic()
        with c.stream("POST", "/v1/audio/speech", json=body) as r:
            replica = r.headers[HEADER]
            pieces = r.iter_bytes()
            assert next(pieces)
            time.sleep(3.0)  # the client stalls; the proxy would take everything the replica sends
            sent = replica_metrics(c, replica)[key] - sent_before[replica]
            elapsed = time.monotonic() - started
    # what the replica sent leads a real-time player by at most the bound plus one chunk (8 frames);
    # unpaced, the whole utterance would have gone within a fraction of a second
    assert 0 < sent <= elapsed + PACE + 8 * FRAME_SECONDS, (sent, elapsed)
    assert sent < total / 2


def test_a_voice_uploaded_through_one_replica_speaks_through_the_other(deployment):
    with httpx.Client(base_url=deployment.url, timeout=60) as c:
        files = {"audio_sample": ("v.wav", wav_bytes(2.0), "audio/wav")}
        up = c.post("/v1/audio/voices", data={"name": "Shared", "consent": "yes"}, files=files)
        assert up.status_code == 200, up.text
        uploader = up.headers[HEADER]
        spoken: dict[str, bytes] = {}
        for _ in range(200):
            r = c.post("/v1/audio/speech", json=speech("In a shared voice.", "shared"))
            assert r.status_code == 200, r.text
            spoken.setdefault(r.headers[HEADER], r.content)
            if len(spoken) == 2:
                break
        assert len(spoken) == 2 and uploader in spoken
        other = next(rep for rep in spoken if rep != uploader)
        assert spoken[other] == spoken[uploader]
        assert spoken[other] != c.post("/v1/audio/speech", json=speech("In a shared voice.", "alice")).content
        listings = {}
        for _ in range(200):
            r = c.get("/v1/audio/voices")
            listings.setdefault(r.headers[HEADER], r.json()["voices"])
            if len(listings) == 2:
                break
        assert all("shared" in names for names in listings.values()) and len(listings) == 2

        gone = c.delete("/v1/audio/voices/shared")
        assert gone.status_code == 200
        statuses = {}
        for _ in range(200):
            r = c.post("/v1/audio/speech", json=speech("Gone.", "shared"))
            statuses.setdefault(r.headers[HEADER], r.status_code)
            if len(statuses) == 2:
                break
        assert statuses == dict.fromkeys(statuses, 400) and len(statuses) == 2


def test_metrics_carry_the_replica_label(deployment):
    with httpx.Client(base_url=deployment.url, timeout=60) as c:
        for replica in all_replicas(c):
            text = ""
            for _ in range(200):
                r = c.get("/metrics")
                if r.headers[HEADER] == replica:
                    text = r.text
                    break
            samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
            assert samples and all(s.labels["replica"] == replica for s in samples)


def test_redeploying_drains_the_streams_in_flight(deployment):
    """A redeploy with one replica stops both old ones while they stream: Ray drains them, and every stream
    completes in full from the replica it started on."""
    text = LONG * 2  # 16 s of audio, ~15 s of wall time when paced
    body = speech(text, "bob", stream_format="audio")
    want = len(pcm16(expected_tone("bob", text)))

    def stream(started: threading.Event) -> tuple[str, int]:
        with httpx.Client(base_url=deployment.url, timeout=90) as c:
            with c.stream("POST", "/v1/audio/speech", json=body) as r:
                replica = r.headers[HEADER]
                pieces = r.iter_bytes()
                size = len(next(pieces))
                started.set()
                return replica, size + sum(len(b) for b in pieces)

    with ThreadPoolExecutor(BATCH + 1) as pool:
        futures = []
        for _ in range(BATCH):  # one at a time, as in the 429 test: the proxy's queue holds one
            started = threading.Event()
            futures.append(pool.submit(stream, started))
            assert started.wait(timeout=60)
        with httpx.Client(base_url=deployment.url, timeout=60) as c:
            old = all_replicas(c)
        redeploy = pool.submit(serve.run, deployment.application(replicas=1), name=APP_NAME, route_prefix="/")

        def stopping() -> bool:
            status = next(iter(serve.status().applications[APP_NAME].deployments.values()))
            return status.replica_states.get("STOPPING", 0) >= 1

        assert wait_until(stopping, timeout=60)
        draining = [not f.done() for f in futures]  # the old replicas are stopping while they stream
        results = [f.result(timeout=90) for f in futures]
        redeploy.result(timeout=90)
    assert all(draining), draining
    assert all(size == want for _, size in results), results
    assert {replica for replica, _ in results} <= old
    with httpx.Client(base_url=deployment.url, timeout=60) as c:
        new = {c.get("/health").headers[HEADER] for _ in range(20)}
    assert len(new) == 1 and not new & old
