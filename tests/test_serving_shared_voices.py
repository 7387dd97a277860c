"""A voices directory shared by several servers (replicas): uploads, replacements and deletions made through one
are seen by the others, at the store and through two live servers (the tiny Qwen3-TTS Base checkpoint, greedy:
the same voice speaks the same audio on both)."""

from __future__ import annotations

import httpx
import numpy as np
from serving_helpers import TTS_FRAMES, running_server, wav_bytes
from tiny_models import tiny_tts

from omni_stream.realtime.settings import Settings
from omni_stream.realtime.speech.voice_store import StoredVoice, VoiceStore


def voice(name: str, seconds: float) -> StoredVoice:
    return StoredVoice(
        name=name,
        consent="yes",
        created_at=1700000000,
        mime_type="audio/wav",
        file_size=10,
        samples=np.zeros(int(24000 * seconds), np.float32),
        sample_rate=24000,
    )


def test_refresh_sees_another_stores_upload_replacement_and_deletion(tmp_path):
    a, b = VoiceStore(tmp_path), VoiceStore(tmp_path)
    a.load(), b.load()
    assert b.get("shared") is None and b.refresh("shared") is None
    a.save(voice("Shared", 1.0), b"one")
    assert b.get("shared") is None  # memory alone does not know
    got = b.refresh("SHARED")
    assert got is not None and got.samples.size == 24000 and b.get("shared") is got
    assert b.refresh("shared") is got  # unchanged file: the same object, not read again
    a.save(voice("Shared", 2.0), b"two")
    assert b.refresh("shared").samples.size == 48000
    a.delete("shared")
    assert b.refresh("shared") is None and b.get("shared") is None


def test_refresh_never_leaves_the_directory(tmp_path):
    store = VoiceStore(tmp_path / "voices")
    (tmp_path / "secret.voice").write_bytes(b"not a voice")
    assert store.refresh("../secret") is None


def test_refresh_keeps_the_voice_it_had_when_the_file_is_damaged(tmp_path):
    a, b = VoiceStore(tmp_path), VoiceStore(tmp_path)
    a.save(voice("v", 1.0), b"x")
    kept = b.refresh("v")
    (tmp_path / "v.voice").write_bytes(b"garbage")
    assert b.refresh("v") is kept


def test_sync_lists_what_the_directory_holds(tmp_path):
    a, b = VoiceStore(tmp_path), VoiceStore(tmp_path)
    a.save(voice("one", 1.0), b"x")
    a.save(voice("two", 1.0), b"x")
    b.save(voice("three", 1.0), b"x")
    a.delete("one")
    b.sync()
    assert [v.key for v in b.voices()] == ["three", "two"]


def test_a_voice_uploaded_through_one_server_speaks_through_another(tmp_path):
    base = tiny_tts("base", greedy_frames=TTS_FRAMES + 1)
    settings = Settings(voices_dir=tmp_path / "voices")
    speak = {"input": "In a shared voice.", "voice": "Mine", "response_format": "pcm"}
    with running_server(base, settings) as one, running_server(base, settings) as two:
        with httpx.Client(base_url=one.url, timeout=60) as a, httpx.Client(base_url=two.url, timeout=60) as b:
            assert b.post("/v1/audio/speech", json=speak).status_code == 400
            files = {"audio_sample": ("v.wav", wav_bytes(2.0, hz=300.0), "audio/wav")}
            assert a.post("/v1/audio/voices", data={"name": "Mine", "consent": "yes"}, files=files).status_code == 200
            assert "mine" in b.get("/v1/audio/voices").json()["voices"]
            first = b.post("/v1/audio/speech", json=speak)
            assert first.status_code == 200 and first.content == a.post("/v1/audio/speech", json=speak).content

            # a replacement through one server changes the voice on the other
            files = {"audio_sample": ("v.wav", wav_bytes(2.0, hz=700.0), "audio/wav")}
            assert a.post("/v1/audio/voices", data={"name": "mine", "consent": "yes"}, files=files).status_code == 200
            second = b.post("/v1/audio/speech", json=speak)
            assert second.status_code == 200 and second.content != first.content
            assert second.content == a.post("/v1/audio/speech", json=speak).content

            assert a.delete("/v1/audio/voices/mine").status_code == 200
            assert b.post("/v1/audio/speech", json=speak).status_code == 400
            assert "mine" not in b.get("/v1/audio/voices").json()["voices"]
