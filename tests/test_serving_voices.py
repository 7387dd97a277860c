"""Voices: upload, list, use, delete; every invalid upload refused with nothing persisted; restart restores; a
reference in the request itself (a data URL) clones; reference URLs refused by rule.

The server is the tiny Qwen3-TTS Base checkpoint (the family that clones uploaded voices), decoding greedily and
bounded to ``TTS_FRAMES`` frames (``tiny_models.tiny_tts``), so a voice's audio is the same each time it speaks.
One rule needs a family with built-in voices and uploads at once, which no Qwen3-TTS checkpoint is: an upload may
not take a built-in voice's name. That test serves the synthetic TTS (``tests/synthetic``) and says so.
"""

from __future__ import annotations

import base64
import contextlib
import os

import httpx
import numpy as np
import pytest
from serving_helpers import FRAME, TTS_FRAMES, Session, running_server, units_of, wav_bytes
from tiny_models import tiny_tts

from omni_stream.realtime.settings import Settings

TEXT = "Speak in my voice."

pytest_plugins = ("serving_fixtures",)


@pytest.fixture(scope="module")
def base_checkpoint():
    return tiny_tts("base", greedy_frames=TTS_FRAMES + 1)


@pytest.fixture
def voices_dir(tmp_path):
    return tmp_path / "voices"


@pytest.fixture
def live(base_checkpoint, voices_dir):
    with running_server(base_checkpoint, Settings(voices_dir=voices_dir, max_voices=3)) as server:
        yield server


def upload(client, name="MyVoice", audio=None, mime="audio/wav", filename="v.wav", consent="I agree", **fields):
    data = {"name": name, "consent": consent, **fields}
    files = {"audio_sample": (filename, wav_bytes(3.0) if audio is None else audio, mime)}
    return client.post("/v1/audio/voices", data={k: v for k, v in data.items() if v is not None}, files=files)


def speak(client, voice, fmt="pcm"):
    return client.post("/v1/audio/speech", json={"input": TEXT, "voice": voice, "response_format": fmt})


def on_disk(directory) -> list[str]:
    return sorted(os.listdir(directory)) if directory.exists() else []


def test_round_trip_and_restart(base_checkpoint, live, voices_dir):
    with httpx.Client(base_url=live.url, timeout=60) as c:
        assert c.get("/v1/audio/voices").json() == {"voices": [], "uploaded_voices": []}  # a Base model has none
        r = upload(c, ref_text="Hello there.", speaker_description="calm")
        assert r.status_code == 200, r.text
        voice = r.json()["voice"]
        assert r.json()["success"] is True
        assert voice["name"] == "MyVoice" and voice["consent"] == "I agree" and voice["mime_type"] == "audio/wav"
        assert voice["file_size"] == len(wav_bytes(3.0)) and isinstance(voice["created_at"], int)
        assert voice["ref_text"] == "Hello there." and voice["speaker_description"] == "calm"
        assert upload(c, "Other", audio=wav_bytes(3.0, hz=700)).status_code == 200
        listed = c.get("/v1/audio/voices").json()
        assert listed["voices"] == ["myvoice", "other"]
        assert listed["uploaded_voices"][0] == voice
        cloned = speak(c, "MYVOICE")
        assert cloned.status_code == 200 and len(cloned.content) == TTS_FRAMES * FRAME * 2
        assert cloned.content != speak(c, "other").content
        assert on_disk(voices_dir) == ["myvoice.voice", "other.voice"]
    stored = live.state.voices.get("myvoice")
    assert stored.prompt is not None and stored.prompt.ref_codes is not None  # the cloning prompt, kept
    live.server.should_exit = True
    live.thread.join(30)
    with (
        running_server(base_checkpoint, Settings(voices_dir=voices_dir)) as again,
        httpx.Client(base_url=again.url, timeout=60) as c,
    ):
        assert c.get("/v1/audio/voices").json()["uploaded_voices"][0] == voice
        assert speak(c, "myvoice").content == cloned.content  # same prompt, same audio
        np.testing.assert_array_equal(again.state.voices.get("myvoice").prompt.x_vector, stored.prompt.x_vector)
        r = c.delete("/v1/audio/voices/MyVoice")
        assert r.json() == {"success": True, "message": "Voice 'MyVoice' deleted successfully"}
        r = c.delete("/v1/audio/voices/myvoice")
        assert r.status_code == 404 and r.json()["success"] is False
        assert r.json()["error"]["type"] == "NotFoundError"
        assert speak(c, "myvoice").status_code == 400
        assert on_disk(voices_dir) == ["other.voice"]


def test_a_deleted_voice_is_withdrawn_from_sessions_already_speaking_with_it(live):
    from websockets.sync.client import connect

    with httpx.Client(base_url=live.url, timeout=60) as c:
        assert upload(c, ref_text="hello there").status_code == 200
        with contextlib.closing(connect(live.ws_url + "/v1/audio/speech/stream", open_timeout=10)) as ws:
            s = Session(ws)
            s.send(type="session.config", voice="myvoice", response_format="pcm")
            s.send(type="input.text", text="Spoken before.")
            s.send(type="input.done")
            (unit,) = units_of(s.until("session.done", timeout=60))
            assert unit["done"]["error"] is False and unit["frames"]
            assert c.delete("/v1/audio/voices/myvoice").status_code == 200  # consent withdrawn
            s.send(type="input.text", text="Not after.")
            s.send(type="input.done")
            messages = s.until("session.done", timeout=60)
    errors = [m for kind, m in messages if kind == "json" and m["type"] == "error"]
    assert len(errors) == 1 and "was deleted" in errors[0]["message"], messages
    assert not [m for kind, m in messages if kind == "binary"]  # not a frame in the deleted voice
    assert next(m for kind, m in messages if kind == "json" and m["type"] == "audio.done")["error"] is True


def test_a_reference_in_the_request_clones(live):
    with httpx.Client(base_url=live.url, timeout=60) as c:
        url = "data:audio/wav;base64," + base64.b64encode(wav_bytes(2.0)).decode()
        body = {"input": TEXT, "ref_audio": url, "ref_text": "hi", "response_format": "pcm"}
        r = c.post("/v1/audio/speech", json=body)
        assert r.status_code == 200 and len(r.content) == TTS_FRAMES * FRAME * 2
        assert c.post("/v1/audio/speech", json=body).content == r.content  # the same reference, the same voice
        short = "data:audio/wav;base64," + base64.b64encode(wav_bytes(0.5)).decode()
        r = c.post("/v1/audio/speech", json={"input": TEXT, "ref_audio": short})
        error = r.json()["error"]
        assert r.status_code == 400 and error["param"] == "ref_audio"
        assert "Reference audio too short (0.5s)" in error["message"]


@pytest.mark.parametrize(
    ("ref_audio", "words"),
    [("file:///etc/passwd", ["allowed"]), ("https://example.com/a.wav", ["disabled"]), ("%%%", ["base64"])],
)
def test_reference_urls_are_refused_by_rule(live, ref_audio, words):
    r = httpx.post(f"{live.url}/v1/audio/speech", json={"input": TEXT, "ref_audio": ref_audio}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "BadRequestError" and error["param"] == "ref_audio"
    assert all(w.lower() in error["message"].lower() for w in words), error["message"]


@pytest.mark.parametrize(
    ("kwargs", "param", "words"),
    [
        ({"audio": b"\0" * (10 * 1024 * 1024 + 1)}, "audio_sample", ["10MB"]),
        ({"audio": wav_bytes(0.5)}, "audio_sample", ["Reference audio too short (0.5s)"]),
        # decoding stops past 31 s, so a longer clip's length is not known: said as such, not as "31.0s"
        ({"audio": wav_bytes(40.0, rate=8000)}, "audio_sample", ["Reference audio too long (more than 31s)", "30s"]),
        ({"audio": wav_bytes(30.5, rate=8000)}, "audio_sample", ["Reference audio too long (30.5s)"]),
        ({"audio": b"this is not audio at all"}, "audio_sample", ["decode"]),
        ({"audio": b""}, "audio_sample", ["empty"]),
        ({"mime": "text/plain"}, "audio_sample", ["text/plain"]),
        ({"name": "../x"}, "name", ["letters"]),
        ({"name": "a b"}, "name", ["letters"]),
        ({"name": "x" * 65}, "name", ["1-64"]),
        ({"name": None}, "name", ["required"]),
        ({"consent": None}, "consent", ["required"]),
        ({"consent": "y" * 1001}, "consent", ["too long", "1000"]),
        ({"speaker_description": "d" * 100_000}, "speaker_description", ["too long", "1000"]),
    ],
)
def test_invalid_uploads_persist_nothing(live, voices_dir, kwargs, param, words):
    with httpx.Client(base_url=live.url, timeout=60) as c:
        r = upload(c, **kwargs)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["type"] == "BadRequestError" and error["param"] == param
        assert all(w.lower() in error["message"].lower() for w in words), error["message"]
        assert c.get("/v1/audio/voices").json()["uploaded_voices"] == []
    assert on_disk(voices_dir) == []


def test_missing_file_and_non_multipart(live, voices_dir):
    with httpx.Client(base_url=live.url) as c:
        r = c.post("/v1/audio/voices", data={"name": "x", "consent": "y"}, files={"other": ("a", b"1")})
        assert r.status_code == 400 and r.json()["error"]["param"] == "audio_sample"
        r = c.post("/v1/audio/voices", json={"name": "x"})
        assert r.status_code == 400 and "multipart" in r.json()["error"]["message"]
    assert on_disk(voices_dir) == []


def test_octet_stream_resolves_from_extension_and_overwrite_is_case_insensitive(live, voices_dir):
    with httpx.Client(base_url=live.url, timeout=30) as c:
        assert upload(c, "Anna", mime="application/octet-stream", filename="a.txt").status_code == 400
        r = upload(c, "Anna", mime="application/octet-stream", filename="a.wav")
        assert r.status_code == 200 and r.json()["voice"]["mime_type"] == "audio/wav"
        r = upload(c, "ANNA", audio=wav_bytes(2.0, hz=500))
        assert r.status_code == 200
        assert [v["name"] for v in c.get("/v1/audio/voices").json()["uploaded_voices"]] == ["ANNA"]
    assert on_disk(voices_dir) == ["anna.voice"]


def test_voice_limit(live, voices_dir):
    with httpx.Client(base_url=live.url, timeout=30) as c:
        for name in ("a1", "a2", "a3"):
            assert upload(c, name).status_code == 200
        r = upload(c, "a4")
        assert r.status_code == 400 and "Maximum number" in r.json()["error"]["message"]
        assert upload(c, "A1").status_code == 200  # overwriting is always allowed
    assert on_disk(voices_dir) == ["a1.voice", "a2.voice", "a3.voice"]


def test_crash_between_write_and_rename_leaves_no_voice(live, voices_dir, monkeypatch):
    def crash(src, dst):
        raise OSError("simulated crash before the rename")

    with httpx.Client(base_url=live.url, timeout=30) as c:
        monkeypatch.setattr(os, "replace", crash)
        r = upload(c, "Broken")
        monkeypatch.undo()
        assert r.status_code == 500 and r.json()["error"]["type"] == "InternalServerError"
        assert c.get("/v1/audio/voices").json()["uploaded_voices"] == []
        assert speak(c, "broken").status_code == 400
    assert on_disk(voices_dir) == []


def test_a_prompt_from_another_checkpoint_is_not_reused(base_checkpoint, voices_dir):
    """A voice stored by one checkpoint is cloned again, from its stored audio, by another (prompts do not carry
    across models); a voice this checkpoint extracted is reused."""
    with (
        running_server(tiny_tts("base"), Settings(voices_dir=voices_dir)) as first,
        httpx.Client(base_url=first.url, timeout=60) as c,
    ):
        assert upload(c, "Moved", ref_text="Hello.").status_code == 200
        first_key = first.state.voices.get("moved").prompt_model
        moved = first.state.voices.get("moved").prompt
    with running_server(base_checkpoint, Settings(voices_dir=voices_dir)) as live:
        stored = live.state.voices.get("moved")
        assert stored.prompt_model == first_key and first_key.startswith("qwen3_tts:")
        assert first_key != f"qwen3_tts:{live.engine.speech_info.model_name}"
        extracted = []
        extract = live.family._extract_voice
        live.family._extract_voice = lambda *args: extracted.append(1) or extract(*args)
        with httpx.Client(base_url=live.url, timeout=60) as c:
            r = speak(c, "moved")  # cloned again from the stored audio, by this checkpoint
            assert r.status_code == 200 and len(extracted) == 1
            assert upload(c, "Local").status_code == 200 and len(extracted) == 2
            assert speak(c, "local").status_code == 200 and len(extracted) == 2  # its own prompt is reused
    np.testing.assert_allclose(stored.prompt.x_vector, moved.x_vector)  # the same weights hear the same speaker


def test_an_upload_cannot_take_a_built_in_name(synthetic_checkpoint, voices_dir):
    """Synthetic TTS: the one family here with built-in voices and uploads at once (Qwen3-TTS has either)."""
    with running_server(synthetic_checkpoint, Settings(voices_dir=voices_dir)) as live:
        with httpx.Client(base_url=live.url, timeout=30) as c:
            r = upload(c, "Alice")
            assert r.status_code == 400 and r.json()["error"]["param"] == "name"
            assert "built-in" in r.json()["error"]["message"]
            assert c.get("/v1/audio/voices").json()["uploaded_voices"] == []
            r = c.delete("/v1/audio/voices/alice")  # listed among the voices: not "not found"
            assert r.status_code == 404 and "built into the model" in r.json()["error"]["message"], r.text
    assert on_disk(voices_dir) == []
