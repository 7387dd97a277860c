"""vLLM-Omni wire compatibility over HTTP, and what a new user and a load test found (synthetic model).

Each test names the behaviour a vLLM-Omni client relies on, or the rough edge it used to hit.
"""

from __future__ import annotations

import base64
import io
import json
import random
import re
import threading

import anyio
import httpx
import numpy as np
import pytest
import soundfile as sf
from serving_helpers import MODEL, RATE, expected_tone, make_checkpoint, pcm16, running_server, wav_bytes
from synthetic.config import SyntheticConfig, tone_samples
from synthetic.family import _prompt_tone

from omni_stream.realtime.common.errors import ApiError
from omni_stream.realtime.settings import Settings
from omni_stream.realtime.speech.batch import merge_items
from omni_stream.requests import VoicePrompt

TEXT = "Hello world, this is a test."

pytest_plugins = ("serving_fixtures",)


@pytest.fixture(scope="module")
def http(live_server):
    with httpx.Client(base_url=live_server.url, timeout=30) as c:
        yield c


def error_of(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    return r.json()["error"]


# --- usage headers ---


def test_whole_bodies_carry_usage_under_both_names_with_the_text_audio_split(http):
    r = http.post("/v1/audio/speech", json={"input": TEXT, "voice": "alice", "instructions": "calm"})
    assert r.status_code == 200
    h = r.headers
    text_tokens = len(TEXT.encode()) + len(b"calm")  # the synthetic family counts bytes
    frames = expected_tone("alice", TEXT).size // 1920
    assert h["x-vllm-omni-input-tokens"] == h["x-omni-stream-input-tokens"] == str(text_tokens)
    assert h["x-vllm-omni-output-tokens"] == h["x-omni-stream-output-tokens"] == str(frames)
    assert h["x-vllm-omni-total-tokens"] == h["x-omni-stream-total-tokens"] == str(text_tokens + frames)
    assert h["x-vllm-omni-input-text-tokens"] == str(text_tokens)
    assert h["x-vllm-omni-input-audio-tokens"] == "0"  # no reference audio in the prompt


# --- batch ---


def test_batch_items_share_defaults_and_fail_alone(http):
    body = {
        "voice": "bob",
        "response_format": "pcm",
        "items": [
            {"input": "First item."},
            {"input": "Second item, in another voice.", "voice": "carol", "response_format": "wav"},
            {"input": "Third item.", "voice": "nobody"},
            {"input": ""},
        ],
    }
    r = http.post("/v1/audio/speech/batch", json=body)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["id"].startswith("speech-batch-")
    assert (data["total"], data["succeeded"], data["failed"]) == (4, 2, 2)
    first, second, third, fourth = data["results"]
    assert [res["index"] for res in data["results"]] == [0, 1, 2, 3]
    assert first["status"] == "success" and first["media_type"] == "audio/pcm"
    assert base64.b64decode(first["audio_data"]) == pcm16(expected_tone("bob", "First item."))
    assert first["usage"]["output_tokens"] == expected_tone("bob", "First item.").size // 1920
    wav, rate = sf.read(io.BytesIO(base64.b64decode(second["audio_data"])), dtype="float32")
    assert second["media_type"] == "audio/wav" and rate == RATE
    assert np.abs(wav - expected_tone("carol", "Second item, in another voice.")).max() < 1e-4
    assert third == {"index": 2, "status": "error", "error": third["error"]} and "nobody" in third["error"]
    assert fourth["status"] == "error" and "Input text cannot be empty" in fourth["error"]


def test_batch_items_run_in_the_same_model_steps(live_server, http):
    """All items reach the scheduler at once: the first step waits until the others are queued."""
    talker, scheduler = live_server.family.talker, live_server.family.scheduler
    n = 5
    queued = threading.Event()

    def hold_first_step(batch):
        if not queued.is_set():
            # the worker thread waits (bounded) until every item is waiting for a slot or admitted
            for _ in range(500):
                with scheduler.lock:
                    if len(scheduler.waiting) + len(scheduler.running) >= n:
                        break
                queued.wait(0.01)
            queued.set()

    talker.record, talker.before_step = True, hold_first_step
    mark = len(talker.log)
    try:
        items = [{"input": f"Item number {i} of the batch."} for i in range(n)]
        r = http.post("/v1/audio/speech/batch", json={"voice": "dave", "response_format": "pcm", "items": items})
    finally:
        talker.before_step, talker.record = None, False
    assert r.status_code == 200 and r.json()["succeeded"] == n
    steps = [e for e in talker.log[mark:] if e[0] == "step"]
    assert max(len(prefill) + len(decode) for _, prefill, decode in steps) == n  # one step ran all items


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({}, "items", ["non-empty"]),
        ({"items": []}, "items", ["non-empty"]),
        ({"items": [{"input": "x"}] * 33}, "items", ["33 items", "maximum of 32"]),
        ({"items": ["x"]}, "items", ["items[0]"]),
        ({"items": [{"input": "x"}], "stream": True}, "stream", ["batch"]),
        ({"items": [{"input": "x", "stream_format": "audio"}]}, "stream_format", ["batch"]),
    ],
)
def test_malformed_batches_are_400(http, body, param, words):
    error = error_of(http.post("/v1/audio/speech/batch", json=body))
    assert error["param"] == param and all(w in error["message"] for w in words), error
    with pytest.raises(ApiError) as info:  # the same rule, pure
        merge_items(body, 32)
    assert info.value.param == param


def test_batch_of_another_model_is_404(http):
    error = error_of(http.post("/v1/audio/speech/batch", json={"model": "other", "items": [{"input": "x"}]}), 404)
    assert error["param"] == "model"


# --- stream=true meaning ---


def test_stream_true_is_sse_by_default_and_raw_pcm_behind_the_legacy_setting(http, synthetic_checkpoint):
    body = {"input": TEXT, "voice": "alice", "response_format": "pcm", "stream": True}
    with http.stream("POST", "/v1/audio/speech", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
    with (
        running_server(synthetic_checkpoint, Settings(legacy_stream_raw=True)) as legacy,
        httpx.Client(base_url=legacy.url, timeout=30) as c,
    ):
        with c.stream("POST", "/v1/audio/speech", json=body) as r:
            assert r.status_code == 200 and r.headers["content-type"] == "audio/pcm"
            raw = b"".join(r.iter_bytes())
        assert raw == pcm16(expected_tone("alice", TEXT))  # every byte is PCM, as the old clients count them
        sse = {**body, "stream_format": "sse"}
        with c.stream("POST", "/v1/audio/speech", json=sse) as r:  # an explicit stream_format still wins
            assert r.headers["content-type"].startswith("text/event-stream")


# --- what vLLM-Omni infers, and what it refuses ---


def test_ref_text_alone_means_base_and_a_task_the_checkpoint_lacks_names_it_first(tmp_path, monkeypatch):
    from omni_stream.realtime.speech import build as speech_build

    looked_at: list[str] = []
    load = speech_build.load_ref_audio

    async def spy(state, ref):
        looked_at.append(ref)
        return await load(state, ref)

    monkeypatch.setattr(speech_build, "load_ref_audio", spy)
    custom_only = make_checkpoint(tmp_path / "cv", task_types=["CustomVoice"])
    with running_server(custom_only, Settings()) as live, httpx.Client(base_url=live.url, timeout=30) as c:
        for body in (
            {"input": TEXT, "ref_text": "the transcript"},  # no task_type: Base, as vLLM-Omni infers
            {"input": TEXT, "ref_audio": "%%% not even base64 %%%"},  # refused before the audio is looked at
            {"input": TEXT, "task_type": "Base", "voice": "alice"},
        ):
            error = error_of(c.post("/v1/audio/speech", json=body))
            assert error["param"] == "task_type", error
            assert "checkpoint does not support task_type='Base'" in error["message"]
            assert "Supported" in error["message"] or "CustomVoice" in error["message"]
        assert looked_at == []  # the task is refused before any reference audio is read or decoded


def test_word_timestamps_and_extra_params_are_refused_naming_the_field(http):
    error = error_of(http.post("/v1/audio/speech", json={"input": TEXT, "word_timestamps": True}))
    assert error["param"] == "word_timestamps" and "aligner" in error["message"]
    assert http.post("/v1/audio/speech", json={"input": TEXT, "voice": "alice", "word_timestamps": False}).is_success
    error = error_of(http.post("/v1/audio/speech", json={"input": TEXT, "extra_params": {"x": 1}}))
    assert error["param"] == "extra_params"


def test_speaker_embedding_clones_with_the_familys_size_and_is_400_otherwise(http):
    embedding = [0.1, -0.2, 0.3, 0.4, 0.5, 0.0, 0.0, 0.0]  # the synthetic family's x-vector has 8 values
    r = http.post("/v1/audio/speech", json={"input": TEXT, "speaker_embedding": embedding, "response_format": "pcm"})
    assert r.status_code == 200, r.text
    tone = _prompt_tone(VoicePrompt(x_vector=np.asarray(embedding, np.float32)))
    n = expected_tone("alice", TEXT).size // 1920
    assert r.content == pcm16(tone_samples(SyntheticConfig(), tone, 0, n))  # the embedding is the voice
    for body, words in (
        ({"speaker_embedding": [0.1] * 5}, ["has 5 values", "8"]),
        ({"speaker_embedding": [0.1, "x"]}, ["numeric"]),
        ({"speaker_embedding": embedding, "ref_audio": "data:audio/wav;base64,AAAA"}, ["mutually exclusive"]),
    ):
        error = error_of(http.post("/v1/audio/speech", json={"input": TEXT, **body}))
        assert error["param"] == "speaker_embedding" and all(w in error["message"] for w in words), error
    infinite = b'{"input": "hi", "speaker_embedding": [1e309, 0, 0, 0, 0, 0, 0, 0]}'  # JSON's 1e309 is inf
    error = error_of(http.post("/v1/audio/speech", content=infinite, headers={"content-type": "application/json"}))
    assert error["param"] == "speaker_embedding" and "finite" in error["message"]


def test_non_streaming_mode_is_400_where_the_family_has_one_prompt_layout(http):
    error = error_of(http.post("/v1/audio/speech", json={"input": TEXT, "voice": "alice", "non_streaming_mode": True}))
    assert error["param"] == "non_streaming_mode" and "not supported" in error["message"]


# --- what a new user found ---


def test_huge_integers_are_400_in_our_words(http):
    raw = b'{"input": "hi", "seed": ' + b"9" * 5000 + b"}"
    error = error_of(http.post("/v1/audio/speech", content=raw, headers={"content-type": "application/json"}))
    assert "5000 digits" in error["message"] and "4300" not in error["message"] and "sys.set" not in error["message"]


def test_delete_without_a_name_is_400_not_a_redirect(http):
    r = http.delete("/v1/audio/voices/", follow_redirects=False)
    assert r.status_code == 400 and r.json()["error"]["param"] == "name"


def test_a_sample_rate_the_format_cannot_carry_is_said_in_a_header(http):
    r = http.post(
        "/v1/audio/speech", json={"input": TEXT, "voice": "alice", "response_format": "mp3", "sample_rate": 11000}
    )
    assert r.status_code == 200
    assert r.headers["x-sample-rate"] == "11025" and r.headers["x-requested-sample-rate"] == "11000"
    r = http.post(
        "/v1/audio/speech", json={"input": TEXT, "voice": "alice", "response_format": "wav", "sample_rate": 16000}
    )
    assert r.headers["x-sample-rate"] == "16000" and "x-requested-sample-rate" not in r.headers


def test_a_truncated_multipart_upload_says_so(http):
    boundary = "b0und4ry"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="audio_sample"; filename="a.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n"
    ).encode() + wav_bytes(2.0)[:1000]  # cut inside the file part: name and consent never arrive
    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
    error = error_of(http.post("/v1/audio/voices", content=body, headers=headers))
    assert "closing boundary" in error["message"] and "required" not in error["message"]


def test_voices_of_a_checkpoint_that_cannot_clone(tmp_path):
    voices_dir = tmp_path / "voices"
    with running_server(make_checkpoint(tmp_path / "base"), Settings(voices_dir=voices_dir)) as first:
        files = {"audio_sample": ("v.wav", wav_bytes(2.0), "audio/wav")}
        assert httpx.post(f"{first.url}/v1/audio/voices", data={"name": "Mine", "consent": "y"}, files=files).is_success
    custom_only = make_checkpoint(tmp_path / "cv", task_types=["CustomVoice"], model_name="cv-only")
    with running_server(custom_only, Settings(voices_dir=voices_dir)) as live, httpx.Client(base_url=live.url) as c:
        listed = c.get("/v1/audio/voices").json()
        assert "mine" not in listed["voices"]  # stored, but not offered by a model that cannot use it
        assert [v["name"] for v in listed["uploaded_voices"]] == ["Mine"]
        error = error_of(c.post("/v1/audio/speech", json={"input": TEXT, "voice": "mine"}))
        assert error["param"] == "voice" and "cannot" in error["message"]
        files = {"audio_sample": ("v.wav", wav_bytes(2.0), "audio/wav")}
        error = error_of(c.post("/v1/audio/voices", data={"name": "Other", "consent": "y"}, files=files))
        assert "cannot clone voices" in error["message"] and "Base" in error["message"]
        assert live.state.voices.get("other") is None


def test_a_voice_uploaded_as_a_speaker_embedding(tmp_path):
    with running_server(make_checkpoint(tmp_path / "base"), Settings(voices_dir=tmp_path / "voices")) as live:
        with httpx.Client(base_url=live.url, timeout=30) as c:
            embedding = [0.5, 0.25, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
            data = {"name": "Direct", "consent": "y", "speaker_embedding": json.dumps(embedding)}
            r = c.post("/v1/audio/voices", data=data)
            assert r.status_code == 200, r.text
            assert r.json()["voice"]["embedding_source"] == "direct" and r.json()["voice"]["embedding_dim"] == 8
            spoken = c.post("/v1/audio/speech", json={"input": TEXT, "voice": "direct", "response_format": "pcm"})
            direct = c.post(
                "/v1/audio/speech", json={"input": TEXT, "speaker_embedding": embedding, "response_format": "pcm"}
            )
            assert spoken.status_code == 200 and spoken.content == direct.content
            bad = {"name": "Bad", "consent": "y", "speaker_embedding": json.dumps([0.1] * 3)}
            assert error_of(c.post("/v1/audio/voices", data=bad))["param"] == "speaker_embedding"
            both = {"name": "Both", "consent": "y", "speaker_embedding": json.dumps(embedding)}
            files = {"audio_sample": ("v.wav", wav_bytes(2.0), "audio/wav")}
            assert error_of(c.post("/v1/audio/voices", data=both, files=files))["param"] == "speaker_embedding"
        assert live.state.voices.get("bad") is None and live.state.voices.get("both") is None


# --- under load ---


def test_queue_gauges_are_zero_right_after_random_disconnects(tmp_path):
    """Many more clients than slots, each leaving at a random point: nothing stays waiting or running."""
    checkpoint = make_checkpoint(tmp_path / "slow", step_cost_ms=2.0)
    with running_server(checkpoint, Settings(), max_batch_size=4) as live:
        scheduler = live.family.scheduler
        peak = {"waiting": 0}
        rng = random.Random(7)
        plans = [(rng.choice(["raw", "sse", "whole"]), rng.randint(0, 4), rng.uniform(0.3, 1.5)) for _ in range(200)]
        held = threading.Event()

        def hold_first_step(batch) -> None:
            # The first step waits (bounded) until requests queue behind the four slots, as under real load.
            for _ in range(300):
                if held.is_set() or scheduler.live()["waiting"] >= 16:
                    break
                held.wait(0.01)
            held.set()

        live.family.talker.before_step = hold_first_step

        async def one(c: httpx.AsyncClient, mode: str, after_chunks: int, after_s: float) -> None:
            body = {
                "input": "A sentence of some length for the load probe. " * 3,
                "voice": "bob",
                "response_format": "pcm",
            }
            body |= {"raw": {"stream_format": "audio"}, "sse": {"stream": True}, "whole": {}}[mode]
            with anyio.move_on_after(after_s):
                async with c.stream("POST", "/v1/audio/speech", json=body) as r:
                    async for i, _ in _enumerate(r.aiter_raw()):
                        if i >= after_chunks:
                            return

        async def watch(done: anyio.Event) -> None:
            while not done.is_set():
                peak["waiting"] = max(peak["waiting"], scheduler.live()["waiting"])
                with anyio.move_on_after(0.005):
                    await done.wait()

        async def main() -> None:
            limits = httpx.Limits(max_connections=200)
            done = anyio.Event()
            async with httpx.AsyncClient(base_url=live.url, timeout=30, limits=limits) as c:
                async with anyio.create_task_group() as watcher:
                    watcher.start_soon(watch, done)
                    async with anyio.create_task_group() as tg:
                        for plan in plans:
                            tg.start_soon(one, c, *plan)
                    done.set()

        try:
            anyio.run(main)
        finally:
            live.family.talker.before_step = None
        # Every client has gone: the server notices at once, nothing waits for a slot "for seconds".
        assert not any(live.wait_idle(timeout=2.0).values()), scheduler.live()
        metrics = httpx.get(f"{live.url}/metrics").text
        for gauge in ("requests_waiting", "requests_running", "requests_paused"):
            assert re.search(rf'omni_stream_{gauge}\{{scheduler="talker"\}} 0\.0', metrics), (gauge, metrics)
        assert peak["waiting"] > 0  # the probe really queued requests behind the four slots


async def _enumerate(chunks):
    i = 0
    async for chunk in chunks:
        yield i, chunk
        i += 1


def test_the_served_model_answers_after_the_probe(http):
    r = http.post("/v1/audio/speech", json={"model": MODEL, "input": TEXT, "voice": "alice", "response_format": "pcm"})
    assert r.status_code == 200 and r.content == pcm16(expected_tone("alice", TEXT))
