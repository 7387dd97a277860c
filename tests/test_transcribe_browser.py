"""The transcription page at ``/transcribe`` in headless Chromium over the tiny Whisper: a chosen file and a
recording from Chromium's fake microphone are transcribed as the SSE deltas arrive, and a refused file shows the
server's message. Needs Debian's Chromium and the ``playwright`` package (no downloaded browsers)."""

from __future__ import annotations

import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from browser_helpers import chromium, skip_without_browser
from serving_helpers import LiveServer, running_server

pytestmark = pytest.mark.browser
pytest_plugins = ("asr_fixtures",)

TIMEOUT_MS = 30_000
FAKE_MIC = ("--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream")


@pytest.fixture(scope="module")
def live(tiny_whisper: Path) -> Iterator[LiveServer]:
    with running_server(tiny_whisper) as server:
        yield server


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    skip_without_browser()
    with chromium(tmp_path_factory.mktemp("chromium-profile"), *FAKE_MIC) as context:
        yield context


@pytest.fixture
def page(browser: Any, live: LiveServer) -> Iterator[Any]:
    tab = browser.new_page()
    problems: list[str] = []
    tab.on("pageerror", lambda e: problems.append(str(e)))
    tab.goto(f"{live.url}/transcribe", wait_until="load")
    tab.wait_for_function("window.__transcribe && window.__transcribe.model", timeout=TIMEOUT_MS)
    yield tab
    tab.close()
    assert not problems


def wav_file(tmp_path: Path, seconds: float, seed: int) -> Path:
    samples = (np.random.default_rng(seed).standard_normal(int(seconds * 16000)) * 3000).astype("<i2")
    path = tmp_path / "clip.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(samples.tobytes())
    return path


def state(tab: Any) -> dict[str, Any]:
    return tab.evaluate("() => JSON.parse(JSON.stringify(window.__transcribe))")


def test_a_chosen_file_streams_the_transcript_the_api_returns(page, live, tmp_path):
    path = wav_file(tmp_path, 2.0, seed=1)
    page.set_input_files("#file", str(path))
    page.get_by_role("button", name="Transcribe").click()
    page.wait_for_function("window.__transcribe.state === 'done'", timeout=TIMEOUT_MS)
    shown = state(page)
    api = httpx.post(
        f"{live.url}/v1/audio/transcriptions", files={"file": ("clip.wav", path.read_bytes(), "audio/wav")}, timeout=60
    ).json()
    assert shown["text"] == api["text"] and shown["deltas"] > 1 and not shown["errors"]
    assert page.locator("#transcript").inner_text().strip() == api["text"].strip()
    assert shown["usage"]["input_token_details"]["audio_tokens"] == 100 and shown["ttftMs"] is not None


def test_a_recording_from_the_microphone_is_transcribed(page):
    page.get_by_role("button", name="Record").click()
    page.wait_for_function("window.__transcribe.state === 'recording'", timeout=TIMEOUT_MS)
    page.wait_for_timeout(1500)  # Chromium's fake microphone beeps into the recording
    page.get_by_role("button", name="Stop recording").click()
    page.wait_for_function("window.__transcribe.recordedBytes > 0", timeout=TIMEOUT_MS)
    page.get_by_role("button", name="Transcribe").click()
    page.wait_for_function("['done', 'error'].includes(window.__transcribe.state)", timeout=TIMEOUT_MS)
    shown = state(page)
    assert shown["state"] == "done", shown["errors"]
    assert shown["text"] and shown["usage"]["input_token_details"]["audio_tokens"] > 0


def test_a_file_the_server_refuses_shows_its_message(page, tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not audio")
    page.set_input_files("#file", str(path))
    page.get_by_role("button", name="Transcribe").click()
    page.wait_for_function("window.__transcribe.state === 'error'", timeout=TIMEOUT_MS)
    errors = state(page)["errors"]
    assert len(errors) == 1 and errors[0].startswith("Could not decode 'file'")
    assert "Could not decode 'file'" in page.locator("#errors").inner_text()
