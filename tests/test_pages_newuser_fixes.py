"""What a new user of the pages ran into, in headless Chromium against the agent's test doubles behind an API key:
a long text on the speech page, a blank one, an answer the user talks over, the state while the answer still
plays, a refused key named once per attempt, a WebRTC option the server lacks, and a phone-width window.

Needs Debian's Chromium at /usr/bin/chromium and the ``playwright`` package (no downloaded browsers).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from browser_helpers import chromium, skip_without_browser
from realtime_doubles import spoken_words
from realtime_fixtures import agent_checkpoints, agent_loader, vad_factory
from serving_helpers import LiveServer, running_server

from omni_stream.realtime.settings import Settings

pytestmark = pytest.mark.browser

KEY = "newuser-key"
TIMEOUT_MS = 60_000
# The agent says this before echoing the turn: about ten seconds of the synthetic voice (40 ms a character).
PREFIX = " ".join(["here is a rather long answer that keeps going"] * 6)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, Path]]:
    skip_without_browser()
    root = tmp_path_factory.mktemp("newuser-pages")
    settings = Settings(vad_factory=vad_factory(), api_key=KEY)
    load = agent_loader(agent_checkpoints(root, reply_prefix=PREFIX))
    with running_server(None, settings, load=load) as live:
        yield live, root


def microphone(root: Path, name: str, audio: np.ndarray) -> tuple[str, ...]:
    path = root / f"{name}.wav"
    sf.write(path, audio.astype(np.float32) / 32768, 24000, subtype="PCM_16")
    return (
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={path}%noloop",
    )


class Tab:
    """A page with the key typed in and its model line loaded; console errors and uncaught exceptions recorded."""

    def __init__(self, context: Any, url: str, loaded: str, key: str = KEY, width: int = 1000) -> None:
        self.page = context.new_page()
        self.page.set_viewport_size({"width": width, "height": 900})
        self.problems: list[str] = []
        self.page.on("console", lambda m: self.problems.append(f"console: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.problems.append(f"pageerror: {e}"))
        self.page.goto(url, wait_until="load")
        self.page.get_by_label("API key").fill(key)
        self.page.wait_for_function(loaded, timeout=TIMEOUT_MS)
        self.problems.clear()  # the loads before the key was typed were refused (401), as they should be

    def js(self, expression: str) -> Any:
        return self.page.evaluate(f"() => JSON.parse(JSON.stringify({expression}))")

    def wait(self, condition: str) -> None:
        self.page.wait_for_function(condition, timeout=TIMEOUT_MS)


SPEECH_LOADED = "window.__demo.model !== null"
AGENT_LOADED = "window.agent.model !== null && window.agent.rtcAvailable !== null"


def test_the_speech_page_speaks_a_text_longer_than_a_sessions_queue(env: tuple[LiveServer, Path]) -> None:
    # The server queues at most 64 sentences a session and refused the whole text past that: the page said "done"
    # beside the refusal, having spoken nothing. It sends a long text as utterances the queue takes.
    live, root = env
    sentences = 70
    text = " ".join(f"Sentence number {i} is here." for i in range(sentences))
    assert sentences > Settings().max_ws_queued_units
    with chromium(root / "profile-speech") as context:
        tab = Tab(context, f"{live.url}/", SPEECH_LOADED)
        tab.page.get_by_label("Text to speak").fill(text)
        tab.page.get_by_role("button", name="Speak").click()
        tab.wait("['done', 'error', 'cancelled'].includes(window.__demo.state)")
        demo = tab.js("window.__demo")
        assert demo["state"] == "done" and demo["errors"] == []
        assert demo["sentences"] == sentences  # every sentence's audio.done
        assert tab.problems == []


def test_the_speech_page_says_a_blank_text_needs_typing(env: tuple[LiveServer, Path]) -> None:
    # "required" lets spaces through: Speak did nothing at all, saying nothing.
    live, root = env
    with chromium(root / "profile-blank") as context:
        tab = Tab(context, f"{live.url}/", SPEECH_LOADED)
        field = tab.page.get_by_label("Text to speak")
        field.fill("   ")
        tab.page.get_by_role("button", name="Speak").click()
        assert field.evaluate("f => f.validationMessage") != ""
        assert tab.js("window.__demo.state") == "idle"
        field.fill("Hello.")  # typing clears it
        assert field.evaluate("f => f.validationMessage") == ""


def test_an_answer_the_user_talks_over_is_marked_interrupted(env: tuple[LiveServer, Path]) -> None:
    # The user says "three", then "five" three seconds later, while the ten-second answer still plays. The page
    # forgot the answer's turn when it heard the user, so the server's response.done (cancelled) never reached it:
    # the turn stayed an answer like any other, without "(interrupted)".
    live, root = env
    audio = np.concatenate(
        [spoken_words(["three"], lead_ms=800, tail_ms=3000), spoken_words(["five"], lead_ms=0, tail_ms=20000)]
    )
    with chromium(root / "profile-barge", *microphone(root, "barge", audio)) as context:
        tab = Tab(context, f"{live.url}/realtime", AGENT_LOADED)
        tab.page.get_by_role("button", name="Start talking").click()
        tab.wait("window.agent.turns.filter(t => t.role === 'assistant').length >= 2")
        tab.wait("window.agent.turns.filter(t => t.role === 'assistant')[0].status !== null")
        first = tab.js("window.agent.turns.filter(t => t.role === 'assistant')[0]")
        assert first["cancelled"] is True and first["status"] == "cancelled"
        label = tab.page.locator("#turns li.assistant").first.evaluate(
            "li => li.classList.contains('cancelled') && getComputedStyle(li, '::after').content"
        )
        assert label == '" (interrupted)"'
        tab.page.get_by_role("button", name="Stop").click()
        assert tab.js("window.agent.errors") == [] and tab.problems == []


def test_the_agent_is_speaking_until_its_answer_has_played_out(env: tuple[LiveServer, Path]) -> None:
    # The server sends the answer up to two seconds ahead of playback; the page said "listening" at response.done,
    # while the agent could still be heard.
    live, root = env
    audio = spoken_words(["three"], lead_ms=800, tail_ms=30000)
    with chromium(root / "profile-drain", *microphone(root, "drain", audio)) as context:
        tab = Tab(context, f"{live.url}/realtime", AGENT_LOADED)
        tab.page.evaluate(
            """() => {
              window.__states = [];
              new MutationObserver(() => window.__states.push({
                state: window.agent.state, played: window.agent.samplesPlayed, received: window.agent.receivedSamples,
              })).observe(document.getElementById('state'), { childList: true, characterData: true, subtree: true });
            }"""
        )
        tab.page.get_by_role("button", name="Start talking").click()
        tab.wait("window.agent.events.includes('response.done') && window.agent.state === 'listening'")
        states = tab.js("window.__states")
        spoke = next(i for i, s in enumerate(states) if s["state"] == "speaking")
        back = next(s for s in states[spoke:] if s["state"] == "listening")
        assert back["received"] > 0 and back["played"] >= back["received"]
        tab.page.get_by_role("button", name="Stop").click()
        assert tab.js("window.agent.errors") == [] and tab.problems == []


def test_a_refused_key_is_named_once_per_attempt(env: tuple[LiveServer, Path]) -> None:
    # Typing a wrong key named it refused; Start then named it again beside the first (errors were never cleared).
    live, root = env
    quiet = np.zeros(24000 * 5, np.int16)
    with chromium(root / "profile-key", *microphone(root, "quiet", quiet)) as context:
        tab = Tab(context, f"{live.url}/realtime", "window.agent.errors.length > 0", key="wrong")
        assert "refused" in tab.page.locator("#model").inner_text()
        tab.page.get_by_role("button", name="Start talking").click()
        tab.wait("window.agent.state === 'idle'")
        errors = tab.js("window.agent.errors")
        assert len(errors) == 1 and "refused this API key" in errors[0]


def test_the_agent_page_fits_a_phone_and_says_why_webrtc_is_off(env: tuple[LiveServer, Path]) -> None:
    # At 375 px the four fields of one row were squeezed to a few letters each ("(r", "WebSc").
    live, root = env
    with chromium(root / "profile-phone") as context:
        tab = Tab(context, f"{live.url}/realtime", AGENT_LOADED, width=375)
        for field in ("Voice", "Transport", "API key"):
            assert tab.page.get_by_label(field).bounding_box()["width"] >= 140, field
        option = tab.page.locator("#transport option[value=rtc]")
        if option.evaluate("o => o.disabled"):  # no fastrtc on this server: the option says so
            assert "not on this server" in option.inner_text()
        else:
            assert option.inner_text() == "WebRTC (/rtc)"
        assert tab.problems == []


def test_a_server_shutting_down_mid_answer_is_one_error_line(tmp_path: Path) -> None:
    # A shutdown sends the running response's response.done (failed: server_shutdown), an error with the same
    # reason, then closes with 1001: the page listed three lines for one cause.
    skip_without_browser()
    settings = Settings(vad_factory=vad_factory(), api_key=KEY)
    audio = spoken_words(["three"], lead_ms=800, tail_ms=30000)
    with running_server(None, settings, load=agent_loader(agent_checkpoints(tmp_path, reply_prefix=PREFIX))) as live:
        with chromium(tmp_path / "profile-shutdown", *microphone(tmp_path, "shutdown", audio)) as context:
            tab = Tab(context, f"{live.url}/realtime", AGENT_LOADED)
            tab.page.get_by_role("button", name="Start talking").click()
            tab.wait("window.agent.events.includes('response.output_audio.delta')")  # the answer is running
            live.server.should_exit = True  # the server shuts down (as on Ctrl-C)
            tab.wait("window.agent.state === 'idle'")
            errors = tab.js("window.agent.errors")
    assert len(errors) == 1 and "failed" in errors[0] and "shutting down" in errors[0], errors
