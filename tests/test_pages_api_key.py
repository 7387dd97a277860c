"""Every page on a server behind ``--api-key``, in headless Chromium: the no-argument server's embedded models, the
key typed into the page. Each page reaches its socket with the key (the key-free subprotocol it offers beside the key
is the one echoed), loads its model line and lists once the key is typed, and names a refused key and a failed
response as such.

Needs Debian's Chromium at /usr/bin/chromium and the ``playwright`` package (no downloaded browsers).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from browser_helpers import chromium, skip_without_browser
from serving_helpers import LiveServer, default_server

from omni_stream.family import ModelKind
from omni_stream.realtime.settings import Settings

pytest.importorskip("diffusers", reason="needs the [image] and [video] extras (diffusers)")

pytestmark = pytest.mark.browser

KEY = "page-key-123"
TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def keyed() -> Iterator[LiveServer]:
    with default_server(Settings(api_key=KEY)) as server:
        yield server


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    skip_without_browser()
    root = tmp_path_factory.mktemp("pages-keyed")
    quiet = root / "quiet.wav"  # the fake microphone: silence, so no turn starts by itself
    sf.write(quiet, np.zeros(24000 * 30, np.float32), 24000, subtype="PCM_16")
    mic = (
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={quiet}",
    )
    with chromium(root / "profile", *mic) as context:
        yield context


class Tab:
    """A page in a new tab, with the browser's console errors and uncaught exceptions recorded."""

    def __init__(self, context: Any, url: str, state: str) -> None:
        self.page = context.new_page()
        self.state = state
        self.problems: list[str] = []
        self.page.on("console", lambda m: self.problems.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.problems.append(f"pageerror: {e}"))
        self.url = url

    def open(self) -> Tab:
        self.page.goto(self.url, wait_until="load")
        return self

    def type_key(self, key: str) -> None:
        self.page.get_by_label("API key (optional)").press_sequentially(key)  # typed; no change event needed

    def wait(self, condition: str) -> dict[str, Any]:
        self.page.wait_for_function(f"(s => {condition})(window.{self.state})", timeout=TIMEOUT_MS)
        return self.page.evaluate(f"() => JSON.parse(JSON.stringify(window.{self.state}))")

    def text(self, selector: str) -> str:
        return self.page.locator(selector).inner_text()

    def unexpected(self) -> list[str]:
        """Console errors other than the browser's own reports of requests refused before the key was typed."""
        return [p for p in self.problems if "401" not in p]

    def close(self) -> None:
        self.page.close()


def model_id(live: LiveServer, kind: str) -> str:
    return live.state.served_models(kind)[0]


def test_the_speech_page_speaks_with_the_key(browser, keyed):
    tab = Tab(browser, f"{keyed.url}/", "__demo").open()
    try:
        # before the key, the page says what it needs (as the realtime and video pages do), with no error listed
        said = "() => document.querySelector('#model').textContent.includes('enter the API key (the server needs one)')"
        tab.page.wait_for_function(said, timeout=TIMEOUT_MS)
        assert tab.page.locator("#errors li").count() == 0
        tab.type_key(KEY)
        tab.wait("s.voices.length > 0")
        tab.page.get_by_label("Text to speak").fill("Hello there.")
        tab.page.get_by_role("button", name="Speak").click()
        done = tab.wait("s.state === 'done'")
        assert done["errors"] == [] and done["bytesReceived"] > 0
        assert model_id(keyed, ModelKind.SPEECH) in tab.text("#model")
        assert tab.unexpected() == []
    finally:
        tab.close()


def test_the_speech_page_names_a_refused_key(browser, keyed):
    tab = Tab(browser, f"{keyed.url}/", "__demo").open()
    try:
        tab.type_key("not-the-key")
        tab.page.get_by_label("Text to speak").fill("Hello there.")
        tab.page.get_by_role("button", name="Speak").click()
        failed = tab.wait("s.state === 'error'")
        assert any("refused this API key" in e for e in failed["errors"]), failed["errors"]
        tab.page.get_by_label("API key (optional)").fill(KEY)  # the right key: the refusal is the old key's
        tab.wait("s.errors.length === 0 && s.state === 'idle'")
        assert tab.page.locator("#state").inner_text() == "idle"
    finally:
        tab.close()


def test_the_video_page_streams_with_the_key(browser, keyed):
    tab = Tab(browser, f"{keyed.url}/video", "__video").open()
    try:
        tab.type_key(KEY)
        tab.wait("s.model !== null")
        tab.page.get_by_label("Frames").fill("33")
        tab.page.get_by_role("button", name="Generate").click()
        done = tab.wait("s.state === 'done' || s.state === 'error'")
        assert done["state"] == "done" and done["errors"] == [] and done["chunks"] == 1, done
        assert tab.unexpected() == []
    finally:
        tab.close()


def test_the_video_page_names_a_refused_key(browser, keyed):
    tab = Tab(browser, f"{keyed.url}/video", "__video").open()
    try:
        tab.type_key("not-the-key")
        tab.page.get_by_role("button", name="Generate").click()
        failed = tab.wait("s.state === 'error'")
        assert any("refused this API key" in e for e in failed["errors"]), failed["errors"]
        tab.page.get_by_label("API key (optional)").fill(KEY)
        tab.wait("s.errors.length === 0 && s.state === 'idle'")
        assert tab.page.locator("#state").inner_text() == "idle"
    finally:
        tab.close()


def test_the_realtime_page_loads_the_text_model_and_voices_once_the_key_is_typed(browser, keyed):
    tab = Tab(browser, f"{keyed.url}/realtime", "agent").open()
    try:
        tab.wait("s.rtcAvailable !== null")
        assert "API key" in tab.text("#model")
        tab.type_key(KEY)
        state = tab.wait("s.model !== null && s.voices.length > 0")
        text, speech = model_id(keyed, ModelKind.TEXT), model_id(keyed, ModelKind.SPEECH)
        assert state["model"] == text and text in tab.text("#model") and speech in tab.text("#model")
        assert state["voices"] == sorted(keyed.engine.models.speech().info.voices)
        tab.page.get_by_role("button", name="Start talking").click()
        state = tab.wait("s.state === 'listening' || s.errors.length > 0")
        assert state["errors"] == [] and "session.created" in state["events"], state
        tab.page.get_by_role("button", name="Stop").click()
        assert tab.unexpected() == []
    finally:
        tab.close()


def test_the_realtime_page_names_a_refused_key(browser, keyed):
    tab = Tab(browser, f"{keyed.url}/realtime", "agent").open()
    try:
        tab.wait("s.rtcAvailable !== null")
        tab.type_key("not-the-key")
        tab.page.get_by_role("button", name="Start talking").click()
        state = tab.wait("s.errors.some(e => e.includes('Authentication failed')) && s.state === 'idle'")
        assert not any("1006" in e for e in state["errors"]), state["errors"]
    finally:
        tab.close()


def test_the_realtime_page_shows_a_failed_response(browser, keyed):
    """A response the server fails (here one asked for with no instructions and an empty conversation: nothing to
    answer) is shown as failed, with the server's reason; the page stays listening. The test sits between the page
    and the server only to send that ``response.create`` once the session is set up."""
    tab = Tab(browser, f"{keyed.url}/realtime", "agent")

    def relay(route: Any) -> None:
        server = route.connect_to_server()

        def from_server(message: Any) -> None:
            route.send(message)
            if isinstance(message, str) and json.loads(message)["type"] == "session.updated":
                server.send(json.dumps({"type": "response.create", "response": {"instructions": ""}}))

        server.on_message(from_server)
        route.on_message(server.send)

    tab.page.route_web_socket(re.compile(r".*/v1/realtime(\?.*)?$"), relay)
    tab.open()
    try:
        tab.type_key(KEY)
        tab.wait("s.model !== null")
        tab.page.get_by_role("button", name="Start talking").click()
        state = tab.wait("s.events.includes('response.done')")
        tab.wait("s.state === 'listening'")
        assert any(e.startswith("The response failed: ") and "empty" in e for e in state["errors"]), state["errors"]
        assert state["turns"][-1]["status"] == "failed"
        assert "failed" in tab.page.locator("#turns li").last.get_attribute("class")
        tab.page.get_by_role("button", name="Stop").click()
    finally:
        tab.close()


def test_the_transcription_page_posts_a_recording_with_the_key(browser, keyed):
    tab = Tab(browser, f"{keyed.url}/transcribe", "__transcribe").open()
    try:
        refused = tab.wait("s.model === null")  # before the key: the model line asks for it
        assert refused["state"] == "idle" and "API key" in tab.text("#model")
        tab.type_key(KEY)
        tab.wait("s.model !== null")
        tab.page.get_by_role("button", name="Record").click()
        tab.wait("s.state === 'recording'")
        tab.page.wait_for_timeout(1000)  # a second of the fake microphone's silence
        tab.page.get_by_role("button", name="Stop recording").click()
        tab.wait("s.recordedBytes > 0")
        tab.page.get_by_role("button", name="Transcribe").click()
        done = tab.wait("s.state === 'done' || s.state === 'error'")
        assert done["state"] == "done" and done["errors"] == [], done
        assert done["usage"]["input_token_details"]["audio_tokens"] > 0
        assert tab.unexpected() == []
    finally:
        tab.close()
