"""The voice-agent page at ``/realtime`` in headless Chromium: a fake microphone (a WAV file) speaks a turn, the
agent answers through WS /v1/realtime and the page plays it, with no console errors.

Needs Debian's Chromium at /usr/bin/chromium and the ``playwright`` package (no downloaded browsers). Set
``OMNI_STREAM_REALTIME_SCREENSHOT=path.png`` to keep a screenshot of the page after the answer.

Why the doubles (``realtime_doubles``, ``tests/synthetic``): the page asks for no reply bound, so a random LM would
answer at length before the page could play the answer out, and the turn and answer are checked word for word.
The agent's route on the real families is in ``test_realtime_sdk.py``; the page over WebRTC on them in the WebRTC
tier.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import soundfile as sf
from browser_helpers import chromium, skip_without_browser
from realtime_doubles import spoken_words
from realtime_fixtures import REAL_MODELS, agent_checkpoints, agent_loader, vad_factory
from serving_helpers import expected_tone, running_server

from omni_stream.realtime.settings import Settings

pytestmark = pytest.mark.browser

TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def page_env(tmp_path_factory):
    skip_without_browser()
    root = tmp_path_factory.mktemp("realtime-page")
    mic = root / "mic.wav"
    # The user says "three five" (tones the test ASR names), then stays quiet; %noloop plays the file once.
    words = spoken_words(["three", "five"], lead_ms=800, tail_ms=4000)
    sf.write(mic, words.astype(np.float32) / 32768, 24000, subtype="PCM_16")
    settings = Settings(vad_factory=vad_factory())
    with running_server(None, settings, load=agent_loader(agent_checkpoints(root))) as live:
        yield live, mic, root


def test_the_page_hears_a_turn_and_plays_the_agents_answer(page_env):
    live, mic, root = page_env
    fake_mic = (
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={mic}%noloop",
    )
    problems: list[str] = []
    with chromium(root / "profile", *fake_mic) as context:
        page = context.new_page()
        page.on("console", lambda m: problems.append(f"console: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
        page.goto(f"{live.url}/realtime", wait_until="load")
        # the model's name and /rtc/config arrive one after the other: wait for both
        page.wait_for_function("window.agent.model !== null && window.agent.rtcAvailable !== null", timeout=TIMEOUT_MS)
        assert "synthetic-lm" in page.locator("#model").inner_text()  # the agent's text model
        rtc_offered = page.locator("#transport option[value=rtc]").evaluate("o => !o.disabled")
        assert rtc_offered == page.evaluate("window.agent.rtcAvailable")
        assert rtc_offered == (importlib.util.find_spec("fastrtc") is not None)  # /rtc/config says
        page.get_by_role("button", name="Start talking").click()
        page.wait_for_function(
            "window.agent.turns.some(t => t.role === 'assistant' && t.text) && "
            "window.agent.events.includes('response.done') && window.agent.samplesPlayed > 0",
            timeout=TIMEOUT_MS,
        )
        page.wait_for_function("window.agent.samplesPlayed >= window.agent.receivedSamples", timeout=TIMEOUT_MS)
        state = page.evaluate("() => JSON.parse(JSON.stringify(window.agent))")
        if shot := os.environ.get("OMNI_STREAM_REALTIME_SCREENSHOT"):
            page.screenshot(path=shot, full_page=True)
        page.get_by_role("button", name="Stop").click()
        page.wait_for_function("window.agent.state === 'idle'", timeout=TIMEOUT_MS)
    for kind in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "response.done"):
        assert kind in state["events"]
    assert state["errors"] == [] and problems == []
    user = [t["text"] for t in state["turns"] if t["role"] == "user"]
    answer = [t["text"] for t in state["turns"] if t["role"] == "assistant"]
    if not REAL_MODELS:
        assert user[0] == "three five" and answer[0] == "three five"
        assert state["receivedSamples"] == expected_tone("alice", "three five").size
    assert state["latencyMs"] is not None
    assert not any(live.wait_idle().values())
