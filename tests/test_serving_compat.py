"""vLLM-Omni wire compatibility over HTTP, and what a new user and a load test found, on the tiny Qwen3-TTS
(CustomVoice for the shared server, Base where a test clones or uploads a speaker embedding; both greedy, so the
same request gives the same audio and a route's audio is compared with the model's answer over plain HTTP).

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
from serving_helpers import (
    FRAME,
    RATE,
    TTS_FRAMES,
    assert_same_pcm,
    pcm_to_float,
    running_server,
    spoken,
    step_hook,
    tts_checkpoint,
    wav_bytes,
)
from tiny_models import tiny_tts

from omni_stream.realtime.common.errors import ApiError
from omni_stream.realtime.settings import Settings
from omni_stream.realtime.speech.batch import merge_items

TEXT = "Hello world, this is a test."

pytest_plugins = ("serving_fixtures",)


@pytest.fixture(scope="module")
def http(live_server):
    with httpx.Client(base_url=live_server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def base_checkpoint():
    return tiny_tts("base", greedy_frames=TTS_FRAMES + 1)


@pytest.fixture(scope="module")
def base_server(base_checkpoint, tmp_path_factory):
    """A Base (cloning) model: speaker embeddings and uploads."""
    with running_server(base_checkpoint, Settings(voices_dir=tmp_path_factory.mktemp("voices"))) as live:
        yield live


def error_of(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    return r.json()["error"]


# --- usage headers ---


def test_whole_bodies_carry_usage_under_both_names_with_the_text_audio_split(live_server, http):
    r = http.post("/v1/audio/speech", json={"input": TEXT, "voice": "vivian"})
    assert r.status_code == 200
    h = r.headers
    text_tokens = live_server.family.count_text_tokens(TEXT)  # the checkpoint's tokenizer
    assert h["x-vllm-omni-input-tokens"] == h["x-omni-stream-input-tokens"] == str(text_tokens)
    assert h["x-vllm-omni-output-tokens"] == h["x-omni-stream-output-tokens"] == str(TTS_FRAMES)
    assert h["x-vllm-omni-total-tokens"] == h["x-omni-stream-total-tokens"] == str(text_tokens + TTS_FRAMES)
    assert h["x-vllm-omni-input-text-tokens"] == str(text_tokens)
    assert h["x-vllm-omni-input-audio-tokens"] == "0"  # no reference audio in the prompt


def test_cloning_usage_counts_the_reference_audio_tokens(base_server):
    url = "data:audio/wav;base64," + base64.b64encode(wav_bytes(2.0)).decode()
    body = {"input": TEXT, "ref_audio": url, "ref_text": "the transcript", "response_format": "pcm"}
    h = httpx.post(f"{base_server.url}/v1/audio/speech", json=body, timeout=60).headers
    audio_tokens = int(h["x-vllm-omni-input-audio-tokens"])
    assert audio_tokens == 25  # the reference's codec frames: 2 s at 12.5 Hz
    assert int(h["x-vllm-omni-input-tokens"]) == int(h["x-vllm-omni-input-text-tokens"]) + audio_tokens


# --- batch ---


def test_batch_items_share_defaults_and_fail_alone(live_server, http):
    body = {
        "voice": "ryan",
        "response_format": "pcm",
        "items": [
            {"input": "First item."},
            {"input": "Second item, in another voice.", "voice": "serena", "response_format": "wav"},
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
    # the items ran in one batch: their audio is the model's answer alone to one 16-bit step
    assert_same_pcm(base64.b64decode(first["audio_data"]), spoken(live_server, "ryan", "First item."))
    assert first["usage"]["output_tokens"] == TTS_FRAMES
    wav, rate = sf.read(io.BytesIO(base64.b64decode(second["audio_data"])), dtype="float32")
    assert second["media_type"] == "audio/wav" and rate == RATE
    want = pcm_to_float(spoken(live_server, "serena", "Second item, in another voice."))
    assert wav.size == want.size and np.abs(wav - want).max() < 2e-4
    assert third == {"index": 2, "status": "error", "error": third["error"]} and "nobody" in third["error"]
    assert fourth["status"] == "error" and "Input text cannot be empty" in fourth["error"]


def test_batch_items_run_in_the_same_model_steps(live_server, http):
    """All items reach the scheduler at once: the first step waits until the others are queued."""
    scheduler = live_server.family.scheduler
    n = 5
    queued = threading.Event()
    sizes: list[int] = []

    def hold_first_step(batch):
        if not queued.is_set():
            # the worker thread waits (bounded) until every item is waiting for a slot or admitted
            for _ in range(500):
                with scheduler.lock:
                    if len(scheduler.waiting) + len(scheduler.running) >= n:
                        break
                queued.wait(0.01)
            queued.set()
        sizes.append(len(batch.prefill) + len(batch.decode))

    with step_hook(live_server, hold_first_step):
        items = [{"input": f"Item number {i} of the batch."} for i in range(n)]
        r = http.post("/v1/audio/speech/batch", json={"voice": "aiden", "response_format": "pcm", "items": items})
    assert r.status_code == 200 and r.json()["succeeded"] == n
    assert max(sizes) == n  # one step ran all items


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({}, "items", ["non-empty"]),
        ({"items": []}, "items", ["non-empty"]),
        ({"items": [{"input": "x"}] * 33}, "items", ["33 items", "maximum of 32"]),
        ({"items": ["x"]}, "items", ["items[0]"]),
        ({"items": [{"input": "x"}], "stream": True}, "stream", ["batch"]),
        ({"items": [{"input": "x", "stream_format": "audio"}]}, "stream_format", ["batch"]),
        ({"items": [{"input": "x"}], "vioce": "ryan"}, "vioce", ["Unknown field"]),  # the batch's, not each item's
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
    error = error_of(http.post("/v1/audio/speech/batch", json={"model": 5, "items": [{"input": "x"}]}))
    assert error["message"] == "'model' must be a string, got integer"  # the readers' words
    items = [{"input": "Mine.", "voice": "ryan", "model": "other"}, {"input": "Fine.", "voice": "ryan"}]
    data = http.post("/v1/audio/speech/batch", json={"items": items}).json()
    assert [r["status"] for r in data["results"]] == ["error", "success"]  # an item naming another model fails alone
    assert "other" in data["results"][0]["error"]


# --- stream=true meaning ---


def test_stream_true_is_sse_by_default_and_raw_pcm_behind_the_legacy_setting(http):
    body = {"input": TEXT, "voice": "vivian", "response_format": "pcm", "stream": True}
    with http.stream("POST", "/v1/audio/speech", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
    with (
        running_server(tts_checkpoint(), Settings(legacy_stream_raw=True)) as legacy,
        httpx.Client(base_url=legacy.url, timeout=30) as c,
    ):
        with c.stream("POST", "/v1/audio/speech", json=body) as r:
            assert r.status_code == 200 and r.headers["content-type"] == "audio/pcm"
            raw = b"".join(r.iter_bytes())
        assert raw == spoken(legacy, "vivian", TEXT)  # every byte is PCM, as the old clients count them
        sse = {**body, "stream_format": "sse"}
        with c.stream("POST", "/v1/audio/speech", json=sse) as r:  # an explicit stream_format still wins
            assert r.headers["content-type"].startswith("text/event-stream")


# --- what vLLM-Omni infers, and what it refuses ---


def test_ref_text_alone_means_base_and_a_task_the_checkpoint_lacks_names_it_first(live_server, monkeypatch):
    from omni_stream.realtime.speech import build as speech_build

    looked_at: list[str] = []
    load = speech_build.load_ref_audio

    async def spy(state, ref):
        looked_at.append(ref)
        return await load(state, ref)

    monkeypatch.setattr(speech_build, "load_ref_audio", spy)
    with httpx.Client(base_url=live_server.url, timeout=30) as c:  # a CustomVoice checkpoint
        for body in (
            {"input": TEXT, "ref_text": "the transcript"},  # no task_type: Base, as vLLM-Omni infers
            {"input": TEXT, "ref_audio": "%%% not even base64 %%%"},  # refused before the audio is looked at
            {"input": TEXT, "task_type": "Base", "voice": "vivian"},
        ):
            error = error_of(c.post("/v1/audio/speech", json=body))
            assert error["param"] == "task_type", error
            assert "checkpoint does not support task_type='Base'" in error["message"]
            assert "Supported" in error["message"] or "CustomVoice" in error["message"]
        assert looked_at == []  # the task is refused before any reference audio is read or decoded


def test_word_timestamps_and_extra_params_are_refused_naming_the_field(http):
    error = error_of(http.post("/v1/audio/speech", json={"input": TEXT, "word_timestamps": True}))
    assert error["param"] == "word_timestamps" and "aligner" in error["message"]
    assert http.post("/v1/audio/speech", json={"input": TEXT, "voice": "vivian", "word_timestamps": False}).is_success
    error = error_of(http.post("/v1/audio/speech", json={"input": TEXT, "extra_params": {"x": 1}}))
    assert error["param"] == "extra_params"


def test_speaker_embedding_clones_with_the_familys_size_and_is_400_otherwise(base_server):
    size = base_server.engine.speech_info.speaker_embedding_dim
    rng = np.random.default_rng(0)
    one, other = (rng.standard_normal(size).round(3).tolist() for _ in range(2))

    def speak(embedding):
        body = {"input": TEXT, "speaker_embedding": embedding, "response_format": "pcm"}
        return httpx.post(f"{base_server.url}/v1/audio/speech", json=body, timeout=60)

    r = speak(one)
    assert r.status_code == 200 and len(r.content) == TTS_FRAMES * FRAME * 2, r.text
    assert speak(one).content == r.content and speak(other).content != r.content  # the embedding is the voice
    with httpx.Client(base_url=base_server.url, timeout=60) as c:
        for body, words in (
            ({"speaker_embedding": [0.1] * 5}, ["has 5 values", str(size)]),
            ({"speaker_embedding": [0.1, "x"]}, ["numeric"]),
            ({"speaker_embedding": one, "ref_audio": "data:audio/wav;base64,AAAA"}, ["mutually exclusive"]),
        ):
            error = error_of(c.post("/v1/audio/speech", json={"input": TEXT, **body}))
            assert error["param"] == "speaker_embedding" and all(w in error["message"] for w in words), error
        infinite = b'{"input": "hi", "speaker_embedding": [1e309' + b", 0" * (size - 1) + b"]}"  # 1e309 is inf
        error = error_of(c.post("/v1/audio/speech", content=infinite, headers={"content-type": "application/json"}))
        assert error["param"] == "speaker_embedding" and "finite" in error["message"]


def test_non_streaming_mode_is_the_familys_option_and_typed(live_server, http):
    body = {"input": TEXT, "voice": "vivian", "response_format": "pcm", "non_streaming_mode": True}
    r = http.post("/v1/audio/speech", json=body)
    assert r.status_code == 200 and len(r.content) == TTS_FRAMES * FRAME * 2
    error = error_of(http.post("/v1/audio/speech", json={**body, "non_streaming_mode": "yes"}))
    assert error["param"] == "non_streaming_mode"


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
        "/v1/audio/speech", json={"input": TEXT, "voice": "vivian", "response_format": "mp3", "sample_rate": 11000}
    )
    assert r.status_code == 200
    assert r.headers["x-sample-rate"] == "11025" and r.headers["x-requested-sample-rate"] == "11000"
    r = http.post(
        "/v1/audio/speech", json={"input": TEXT, "voice": "vivian", "response_format": "wav", "sample_rate": 16000}
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


def test_voices_of_a_checkpoint_that_cannot_clone(base_checkpoint, tmp_path):
    voices_dir = tmp_path / "voices"
    with running_server(base_checkpoint, Settings(voices_dir=voices_dir)) as first:
        files = {"audio_sample": ("v.wav", wav_bytes(2.0), "audio/wav")}
        data = {"name": "Mine", "consent": "y"}
        assert httpx.post(f"{first.url}/v1/audio/voices", data=data, files=files, timeout=60).is_success
    with (
        running_server(tts_checkpoint(), Settings(voices_dir=voices_dir)) as live,  # CustomVoice: no cloning
        httpx.Client(base_url=live.url, timeout=60) as c,
    ):
        listed = c.get("/v1/audio/voices").json()
        assert "mine" not in listed["voices"]  # stored, but not offered by a model that cannot use it
        assert [v["name"] for v in listed["uploaded_voices"]] == ["Mine"]
        error = error_of(c.post("/v1/audio/speech", json={"input": TEXT, "voice": "mine"}))
        assert error["param"] == "voice" and "cannot" in error["message"]
        files = {"audio_sample": ("v.wav", wav_bytes(2.0), "audio/wav")}
        error = error_of(c.post("/v1/audio/voices", data={"name": "Other", "consent": "y"}, files=files))
        assert "cannot clone voices" in error["message"] and "Base" in error["message"]
        assert live.state.voices.get("other") is None


def test_a_voice_uploaded_as_a_speaker_embedding(base_server):
    size = base_server.engine.speech_info.speaker_embedding_dim
    embedding = np.random.default_rng(1).standard_normal(size).round(3).tolist()
    with httpx.Client(base_url=base_server.url, timeout=60) as c:
        data = {"name": "Direct", "consent": "y", "speaker_embedding": json.dumps(embedding)}
        r = c.post("/v1/audio/voices", data=data)
        assert r.status_code == 200, r.text
        assert r.json()["voice"]["embedding_source"] == "direct" and r.json()["voice"]["embedding_dim"] == size
        by_name = c.post("/v1/audio/speech", json={"input": TEXT, "voice": "direct", "response_format": "pcm"})
        direct = c.post(
            "/v1/audio/speech", json={"input": TEXT, "speaker_embedding": embedding, "response_format": "pcm"}
        )
        assert by_name.status_code == 200 and by_name.content == direct.content
        bad = {"name": "Bad", "consent": "y", "speaker_embedding": json.dumps([0.1] * 3)}
        assert error_of(c.post("/v1/audio/voices", data=bad))["param"] == "speaker_embedding"
        deep = {"name": "Bad", "consent": "y", "speaker_embedding": "[" * 3000 + "]" * 3000}  # past the parser: a 500
        assert error_of(c.post("/v1/audio/voices", data=deep))["param"] == "speaker_embedding"
        both = {"name": "Both", "consent": "y", "speaker_embedding": json.dumps(embedding)}
        files = {"audio_sample": ("v.wav", wav_bytes(2.0), "audio/wav")}
        assert error_of(c.post("/v1/audio/voices", data=both, files=files))["param"] == "speaker_embedding"
    assert base_server.state.voices.get("bad") is None and base_server.state.voices.get("both") is None


# --- under load ---


def test_queue_gauges_are_zero_right_after_random_disconnects():
    """Many more clients than slots, each leaving at a random point: nothing stays waiting or running."""
    with running_server(tts_checkpoint(), Settings(), max_batch_size=4) as live:
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

        async def one(c: httpx.AsyncClient, mode: str, after_chunks: int, after_s: float) -> None:
            body = {
                "input": "A sentence of some length for the load probe. " * 3,
                "voice": "ryan",
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

        with step_hook(live, hold_first_step):
            anyio.run(main)
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


def test_the_served_model_answers_after_the_probe(live_server, http):
    model = live_server.engine.speech_info.model_name
    body = {"model": model, "input": TEXT, "voice": "vivian", "response_format": "pcm"}
    r = http.post("/v1/audio/speech", json=body)
    assert r.status_code == 200 and r.content == spoken(live_server, "vivian", TEXT)
