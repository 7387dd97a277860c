"""The on-disk voice store: round trip, case-insensitive names, limits, atomic writes, crash leftovers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from omni_stream.realtime.speech.voice_store import StoredVoice, VoiceLimitError, VoiceStore, validate_name
from omni_stream.requests import VoicePrompt


def voice(name: str = "MyVoice", prompt: bool = True, seconds: float = 1.5) -> StoredVoice:
    samples = np.sin(np.arange(int(24000 * seconds)) / 10).astype(np.float32)
    return StoredVoice(
        name=name,
        consent="yes",
        created_at=1700000000,
        mime_type="audio/wav",
        file_size=1234,
        samples=samples,
        sample_rate=24000,
        ref_text="hello there",
        prompt=VoicePrompt(np.arange(8, dtype=np.float32), np.ones((3, 16), np.int64), "hello there")
        if prompt
        else None,
    )


def files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_round_trip_restores_everything(tmp_path):
    store = VoiceStore(tmp_path)
    assert store.save(voice(), b"RIFF-original") is False
    again = VoiceStore(tmp_path)
    assert again.load() == 1
    got = again.get("MYVOICE")
    assert got is not None and got.name == "MyVoice" and got.public() == voice().public()
    np.testing.assert_array_equal(got.samples, voice().samples)
    assert got.prompt is not None and got.prompt.ref_text == "hello there"
    np.testing.assert_array_equal(got.prompt.ref_codes, np.ones((3, 16), np.int64))
    assert files(tmp_path) == ["myvoice.voice"]


def test_voice_without_prompt_round_trips(tmp_path):
    VoiceStore(tmp_path).save(voice(prompt=False), b"x")
    store = VoiceStore(tmp_path)
    store.load()
    assert store.get("myvoice").prompt is None


def test_names_are_case_insensitive_and_reupload_overwrites(tmp_path):
    store = VoiceStore(tmp_path)
    store.save(voice("Anna"), b"1")
    assert store.save(voice("ANNA", seconds=2.0), b"2") is True
    assert len(store) == 1 and store.get("anna").name == "ANNA"
    assert files(tmp_path) == ["anna.voice"]
    assert store.delete("aNNa").name == "ANNA" and store.delete("anna") is None
    assert files(tmp_path) == []


def test_limit_refuses_new_names_but_allows_overwrite(tmp_path):
    store = VoiceStore(tmp_path, max_voices=1)
    store.save(voice("a"), b"")
    with pytest.raises(VoiceLimitError):
        store.save(voice("b"), b"")
    store.save(voice("A"), b"")
    assert files(tmp_path) == ["a.voice"]


@pytest.mark.parametrize("name", ["", "../x", "a/b", "a b", ".", "..", "x" * 65, "é", "a\x00"])
def test_invalid_names(name):
    assert validate_name(name) is not None


@pytest.mark.parametrize("name", ["a", "My-Voice_2", "x" * 64])
def test_valid_names(name):
    assert validate_name(name) is None


def test_failed_rename_leaves_nothing(tmp_path, monkeypatch):
    store = VoiceStore(tmp_path)
    store.save(voice("keep"), b"")

    def boom(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        store.save(voice("new"), b"")
    assert store.get("new") is None
    assert files(tmp_path) == ["keep.voice"]


def test_process_killed_between_write_and_rename_leaves_no_half_voice(tmp_path):
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_serving_voice_store import voice
        from omni_stream.realtime.speech.voice_store import VoiceStore
        os.replace = lambda src, dst: os.kill(os.getpid(), signal.SIGKILL)
        VoiceStore(__import__("pathlib").Path({str(tmp_path)!r})).save(voice("crash"), b"abc")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert result.returncode == -9, result.stderr.decode()
    leftovers = files(tmp_path)
    assert len(leftovers) == 1 and leftovers[0].startswith(".tmp-crash")
    store = VoiceStore(tmp_path)
    assert store.load() == 0 and store.get("crash") is None
    assert files(tmp_path) == []  # the leftover is cleaned up at start


def test_corrupt_voice_file_is_skipped(tmp_path):
    (tmp_path / "bad.voice").write_bytes(b"not a safetensors file")
    VoiceStore(tmp_path).save(voice("good"), b"")
    store = VoiceStore(tmp_path)
    assert store.load() == 1 and store.get("good") is not None


def test_memory_only_store():
    store = VoiceStore(None)
    store.save(voice(), b"")
    assert store.load() == 0 and store.get("myvoice") is not None
