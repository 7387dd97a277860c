"""The demo page at ``/`` in headless Chromium: it speaks over the WebSocket and plays through its AudioWorklet.

The server is the tiny Qwen3-TTS (the tests' greedy checkpoint: each sentence is a unit of 9 frames).

The page tests need Debian's Chromium at /usr/bin/chromium and the ``playwright`` Python package (no
downloaded browsers); the worklet's sample-exact tests run its source under Node.js with stub audio globals.
Set ``OMNI_STREAM_DEMO_SCREENSHOT=path.png`` to keep a screenshot of the page after speaking.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from browser_helpers import chromium, skip_without_browser
from serving_helpers import FRAME, RATE, TTS_FRAMES, LiveServer, running_server, tts_checkpoint

from omni_stream.realtime.app import STATIC_DIR
from omni_stream.realtime.settings import Settings
from omni_stream.speech.text_split import Granularity, split_text

pytestmark = pytest.mark.browser

TIMEOUT_MS = 20_000
WORKLET = STATIC_DIR / "pcm-player-worklet.js"

# --- the page in Chromium ---


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with running_server(tts_checkpoint(), Settings(ws_idle_timeout=10.0)) as server:
        yield server


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    skip_without_browser()
    with chromium(tmp_path_factory.mktemp("chromium-profile")) as context:
        yield context


class Page:
    """A fresh tab on the demo page that records console errors and uncaught exceptions."""

    def __init__(self, context: Any, url: str, wait_for_voices: bool = True) -> None:
        self.page = context.new_page()
        self.problems: list[str] = []
        self.page.on("console", lambda m: self.problems.append(f"console: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.problems.append(f"pageerror: {e}"))
        self.page.goto(url, wait_until="load")
        if wait_for_voices:
            self.wait_for_voices()

    def wait_for_voices(self) -> None:
        # The voice list arrives from GET /v1/audio/voices after load.
        self.page.wait_for_function("window.__demo && window.__demo.voices.length > 0", timeout=TIMEOUT_MS)

    def demo(self) -> dict[str, Any]:
        return self.page.evaluate("() => JSON.parse(JSON.stringify(window.__demo))")

    def wait(self, condition: str) -> dict[str, Any]:
        """Wait until ``condition`` (a JS expression over ``d = window.__demo``) holds; returns the counters."""
        self.page.wait_for_function(f"(d => {condition})(window.__demo)", timeout=TIMEOUT_MS)
        return self.demo()

    def text(self, selector: str) -> str:
        return self.page.locator(selector).inner_text()

    def speak(self, text: str) -> None:
        self.page.get_by_label("Text to speak").fill(text)
        self.page.get_by_role("button", name="Speak").click()


@pytest.fixture
def open_page(browser: Any, live: LiveServer) -> Iterator[Any]:
    pages: list[Page] = []

    def open_(query: str = "") -> Page:
        pages.append(Page(browser, f"{live.url}/{query}"))
        return pages[-1]

    yield open_
    for page in pages:
        page.page.close()


def expected_bytes(text: str) -> int:
    """PCM16 bytes the tests' Qwen3-TTS speaks for ``text`` split into sentences (9 frames a sentence)."""
    units, _ = split_text(text, Granularity.SENTENCE, final=True)
    return len(units) * TTS_FRAMES * FRAME * 2


def test_page_lists_model_and_voices(open_page: Any, live: LiveServer) -> None:
    page = open_page()
    assert live.engine.speech_info.model_name in page.text("#model")
    options = page.page.locator("#voice option").evaluate_all("els => els.map(e => e.value)")
    assert options == ["", *sorted(live.engine.speech_info.voices)]
    assert page.page.get_by_label("Voice").input_value() == options[1]  # the first voice listed
    assert page.page.get_by_role("button", name="Stop").is_disabled()
    assert page.problems == []


@pytest.mark.parametrize("context_rate", [RATE, 48000], ids=["native-24k", "resampled-48k"])
def test_speak_plays_every_frame_through_the_worklet(open_page: Any, context_rate: int) -> None:
    page = open_page("" if context_rate == RATE else f"?rate={context_rate}")
    text = "Hello there. How are you today?"
    page.speak(text)
    done = page.wait("d.state === 'done' && d.framesToWorklet === d.framesReceived")
    assert done["errors"] == []
    assert done["contextRate"] == context_rate
    assert done["bytesReceived"] == expected_bytes(text)
    assert done["framesReceived"] > 1
    assert done["ttfaMs"] is not None and done["ttfaMs"] >= 0

    # The worklet plays the whole utterance out (about 1.2 s of audio) and stops on an empty buffer.
    played = page.wait("!d.playing && d.bufferedMs === 0 && d.samplesPlayed > 0")
    expected_played = done["bytesReceived"] // 2 * context_rate / RATE
    assert played["samplesPlayed"] == pytest.approx(expected_played, abs=2)
    assert page.text("#ttfa") == f"{done['ttfaMs']} ms"
    assert page.text("#bytes").replace(",", "") == str(done["bytesReceived"])
    assert page.text("#frames") == f"{done['framesReceived']} / {done['framesReceived']}"
    assert page.page.get_by_role("status").inner_text() == "done"
    if context_rate == RATE and (shot := os.environ.get("OMNI_STREAM_DEMO_SCREENSHOT")):
        page.page.screenshot(path=shot, full_page=True)
    print(f"\ndemo page at {context_rate} Hz: ttfa {done['ttfaMs']} ms, {played['underruns']} underruns")
    assert page.problems == []


def test_stop_cancels_the_utterance_and_silences_playback(open_page: Any, live: LiveServer) -> None:
    page = open_page()
    text = " ".join(f"This is sentence number {i} of a long passage." for i in range(30))
    page.speak(text)
    page.wait("d.framesReceived > 0")
    page.page.get_by_role("button", name="Stop").click()
    stopped = page.wait("d.state === 'cancelled' && !d.playing && d.bufferedMs === 0")
    assert stopped["errors"] == []
    assert 0 < stopped["bytesReceived"] < expected_bytes(text)
    assert page.page.get_by_role("button", name="Speak").is_enabled()
    assert not any(live.wait_idle().values())  # the server freed the request's batch slot
    assert page.problems == []


# --- the worklet, sample by sample, under Node.js ---

HARNESS = r"""
// Runs pcm-player-worklet.js with stub AudioWorklet globals: steps are {msg} (to the port) or {render: quanta}.
const fs = require("fs");
const [source, spec] = [fs.readFileSync(process.argv[2], "utf8"), JSON.parse(fs.readFileSync(0, "utf8"))];
globalThis.sampleRate = spec.contextRate;
globalThis.currentTime = 0;
const posted = [];
globalThis.AudioWorkletProcessor = class { constructor() { this.port = { postMessage: (m) => posted.push(m) }; } };
let Processor;
globalThis.registerProcessor = (name, cls) => { Processor = cls; };
new Function(source)();
const player = new Processor();
const out = [];
for (const step of spec.steps) {
  if (step.msg) {
    const msg = { ...step.msg };
    if (msg.hex !== undefined) msg.data = Uint8Array.from(Buffer.from(msg.hex, "hex")).buffer;
    player.port.onmessage({ data: msg });
  }
  for (let q = 0; q < (step.render || 0); q++) {
    const left = new Float32Array(128), right = new Float32Array(128);
    if (!player.process([], [[left, right]])) throw new Error("process() asked to stop");
    if (!left.every((v, i) => v === right[i])) throw new Error("channels differ");
    out.push(...left);
    globalThis.currentTime += 128 / sampleRate;
  }
}
process.stdout.write(JSON.stringify({ out, stats: posted.at(-1) }));
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("node") is None:
        pytest.skip("needs Node.js (node) to run the worklet source")
    path = tmp_path_factory.mktemp("worklet") / "harness.js"
    path.write_text(HARNESS)
    return path


def run_worklet(harness: Path, context_rate: int, steps: list[dict[str, Any]]) -> tuple[np.ndarray, dict[str, Any]]:
    result = subprocess.run(
        ["node", str(harness), str(WORKLET)],
        input=json.dumps({"contextRate": context_rate, "steps": steps}),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    body = json.loads(result.stdout)
    return np.asarray(body["out"], dtype=np.float32), body["stats"]


def pcm_chunks(samples: np.ndarray, sizes: list[int]) -> list[dict[str, Any]]:
    """PCM16 LE bytes of ``samples`` cut at the given byte sizes (odd sizes split samples), as pcm messages."""
    data = samples.astype("<i2").tobytes()
    steps, at = [], 0
    for size in [*sizes, len(data)]:
        if at >= len(data):
            break
        steps.append({"msg": {"type": "pcm", "hex": data[at : at + size].hex()}})
        at += size
    return steps


def tone(n: int, hz: float = 300.0, rate: int = RATE) -> np.ndarray:
    return np.round(8000 * np.sin(2 * np.pi * hz * np.arange(n) / rate)).astype(np.int16)


def test_worklet_plays_chunks_gaplessly_across_odd_splits(harness: Path) -> None:
    samples = tone(5000)
    steps = [{"msg": {"type": "reset", "run": 7}}, {"msg": {"type": "format", "sampleRate": RATE}}]
    steps += pcm_chunks(samples, [1, 1001, 3, 2222, 7, 1])
    steps += [{"msg": {"type": "end"}}, {"render": 50}]
    out, stats = run_worklet(harness, RATE, steps)
    np.testing.assert_array_equal(out[:5000], samples / np.float32(32768))
    assert not out[5000:].any()
    assert stats["run"] == 7 and stats["samplesPlayed"] == 5000 and stats["underruns"] == 0
    assert stats["frames"] == len(steps) - 4 and not stats["playing"]


def test_worklet_prebuffers_and_counts_an_underrun_when_the_stream_stalls(harness: Path) -> None:
    samples = tone(6000)
    steps = [*pcm_chunks(samples[:1000], []), {"render": 4}]  # 1000 samples < the 60 ms prebuffer: silence
    steps += [*pcm_chunks(samples[1000:2000], []), {"render": 20}]  # plays 2000, then runs dry mid-stream
    steps += [*pcm_chunks(samples[2000:], []), {"msg": {"type": "end"}}, {"render": 40}]
    out, stats = run_worklet(harness, RATE, steps)
    assert not out[:512].any()
    np.testing.assert_array_equal(out[512:2512], samples[:2000] / np.float32(32768))
    resumed = 512 + 20 * 128  # the first quantum after the rest arrived; silence until then
    assert not out[2512:resumed].any()
    np.testing.assert_array_equal(out[resumed : resumed + 4000], samples[2000:] / np.float32(32768))
    assert stats["underruns"] == 1 and stats["samplesPlayed"] == 6000


def test_worklet_resamples_to_the_context_rate_without_seams(harness: Path) -> None:
    samples = tone(4800)  # 200 ms at 24 kHz
    steps = [{"msg": {"type": "format", "sampleRate": RATE}}, *pcm_chunks(samples, [333, 1, 4000, 97, 2])]
    out, stats = run_worklet(harness, 48000, [*steps, {"msg": {"type": "end"}}, {"render": 100}])
    played = stats["samplesPlayed"]
    assert abs(played - 2 * 4800) <= 2
    ideal = 8000 / 32768 * np.sin(2 * np.pi * 300 * np.arange(played) / 48000)
    assert np.max(np.abs(out[:played] - ideal)) < 2e-3  # linear interpolation of a 300 Hz tone, no seams
    assert not out[played:].any()


def test_worklet_buffer_grows_past_ten_seconds_and_flush_silences_it(harness: Path) -> None:
    rate = 8000  # the ring starts at ten seconds of the context rate
    samples = tone(rate * 12, rate=rate)
    steps = [{"msg": {"type": "format", "sampleRate": rate}}, *pcm_chunks(samples, [rate * 6 - 1])]
    out, stats = run_worklet(harness, rate, [*steps, {"render": 10}, {"msg": {"type": "flush"}}, {"render": 5}])
    np.testing.assert_array_equal(out[:1280], samples[:1280] / np.float32(32768))
    assert not out[1280:].any()
    assert stats["bufferedMs"] == 0 and not stats["playing"] and stats["samplesPlayed"] == 1280


def test_api_key_goes_in_the_header_and_the_websocket_subprotocol(browser: Any, tmp_path: Path) -> None:
    with running_server(tts_checkpoint(), Settings(api_key="s3cret-key")) as server:
        page = Page(browser, server.url + "/", wait_for_voices=False)
        try:
            # before the key: the page says the server needs one, and lists no error
            said = "() => document.querySelector('#model').textContent.includes('enter the API key')"
            page.page.wait_for_function(said, timeout=TIMEOUT_MS)
            assert page.text("#errors") == ""
            page.page.get_by_label("API key (optional)").fill("s3cret-key")
            page.page.get_by_label("API key (optional)").press("Tab")  # change event: reload model and voices
            page.wait_for_voices()
            assert page.text("#errors") == ""
            page.speak("Secret speech.")
            done = page.wait("d.state === 'done'")
            assert done["errors"] == [] and done["bytesReceived"] == expected_bytes("Secret speech.")
            # Only the browser's own reports of the two refused requests before the key was entered.
            assert len(page.problems) == 2
            assert all("401" in problem for problem in page.problems), page.problems
        finally:
            page.page.close()
