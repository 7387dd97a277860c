"""The video page at ``/video`` in headless Chromium: it streams fMP4 chunks into Media Source Extensions and plays.

Needs Debian's Chromium at /usr/bin/chromium and the ``playwright`` package (no downloaded browsers); skipped
without them. Set ``OMNI_STREAM_VIDEO_SCREENSHOT=path.png`` to keep a screenshot of the page after playing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("diffusers", reason="needs the [video] extra (diffusers)")

from browser_helpers import chromium, skip_without_browser
from serving_helpers import LiveServer
from video_helpers import video_server, wait_until

from omni_stream.realtime.settings import Settings

pytestmark = pytest.mark.browser
pytest_plugins = ("video_fixtures",)

TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def live(video_checkpoint: Path) -> Iterator[LiveServer]:
    with video_server(video_checkpoint, Settings()) as server:
        yield server


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    skip_without_browser()
    with chromium(tmp_path_factory.mktemp("chromium-video")) as context:
        yield context


def test_the_page_plays_the_stream_and_a_second_prompt_steers_it(browser: Any, live: LiveServer) -> None:
    page = browser.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
    try:
        page.goto(f"{live.url}/video", wait_until="load")
        page.wait_for_function("window.__video.model !== null", timeout=TIMEOUT_MS)
        assert "HeliosPipeline" in page.locator("#model").inner_text()
        page.get_by_label("Frames").fill(str(8 * 33))
        page.get_by_role("button", name="Generate").click()
        page.wait_for_function("window.__video.chunks >= 1", timeout=TIMEOUT_MS)
        page.get_by_role("button", name="Steer").click()
        page.wait_for_function("window.__video.state === 'done'", timeout=TIMEOUT_MS)
        # the video element really plays what arrived: its clock moves past the first second
        page.wait_for_function("window.__video.currentTime > 1.0", timeout=TIMEOUT_MS)
        state = page.evaluate("() => JSON.parse(JSON.stringify(window.__video))")
        assert state["errors"] == [] and state["done"]["chunks"] == 8 and state["done"]["stopped"] is False
        assert state["chunks"] == 8 and state["appended"] >= 8 and state["ttfcMs"] is not None
        assert state["queued"] == ["steer-1"] and state["applied"] == ["steer-1"]
        assert state["mimeType"].startswith('video/mp4; codecs="avc1.')
        assert page.evaluate("document.getElementById('video').videoWidth") == 64
        if shot := os.environ.get("OMNI_STREAM_VIDEO_SCREENSHOT"):
            page.screenshot(path=shot, full_page=True)
        assert problems == []
    finally:
        page.close()
    family = live.engine.models.get("video")
    wait_until(lambda: not any(family.live().values()), what="the request to be released")


def test_stop_on_the_page_ends_the_stream(browser: Any, live: LiveServer) -> None:
    page = browser.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
    try:
        page.goto(f"{live.url}/video", wait_until="load")
        page.wait_for_function("window.__video.model !== null", timeout=TIMEOUT_MS)
        page.get_by_label("Frames").fill(str(30 * 33))
        page.get_by_role("button", name="Generate").click()
        page.wait_for_function("window.__video.chunks >= 1", timeout=TIMEOUT_MS)
        page.get_by_role("button", name="Stop").click()
        page.wait_for_function("window.__video.state === 'stopped'", timeout=TIMEOUT_MS)
        state = page.evaluate("() => JSON.parse(JSON.stringify(window.__video))")
        assert state["done"]["stopped"] is True and state["chunks"] < 30 and state["errors"] == []
        assert page.get_by_role("button", name="Generate").is_enabled() and problems == []
    finally:
        page.close()


def test_a_new_generate_clears_the_last_runs_numbers_and_picture(browser: Any, live: LiveServer) -> None:
    # A second Generate the server refused showed the first run's time to first chunk, chunks, bytes, steering note
    # and last picture beside its error, as if they were its own.
    page = browser.new_page()
    try:
        page.goto(f"{live.url}/video", wait_until="load")
        page.wait_for_function("window.__video.model !== null", timeout=TIMEOUT_MS)
        page.get_by_label("Frames").fill(str(8 * 33))
        page.get_by_role("button", name="Generate").click()
        page.wait_for_function("window.__video.chunks >= 1", timeout=TIMEOUT_MS)
        page.get_by_role("button", name="Steer").click()
        page.wait_for_function("window.__video.state === 'done'", timeout=TIMEOUT_MS)
        page.wait_for_function("window.__video.applied.length === 1", timeout=TIMEOUT_MS)
        assert page.locator("#chunks").inner_text() == "8" and page.locator("#steer-state").inner_text()
        page.get_by_label("Frames").fill("100000")  # past the model's limit: refused
        page.get_by_role("button", name="Generate").click()
        page.wait_for_function("window.__video.state === 'error'", timeout=TIMEOUT_MS)
        assert "num_frames" in page.locator("#errors").inner_text()
        shown = {name: page.locator(f"#{name}").inner_text() for name in ("ttfc", "chunks", "bytes", "steer-state")}
        assert shown == {"ttfc": "–", "chunks": "0", "bytes": "0", "steer-state": ""}
        assert page.evaluate("document.getElementById('video').readyState") == 0  # HAVE_NOTHING: no old picture
    finally:
        page.close()


def test_the_page_opens_its_socket_under_the_path_it_is_served_at(browser: Any, live: LiveServer) -> None:
    # Behind a proxy that serves the server under /app/, the page's fetches went there but its socket to the root.
    page = browser.new_page()
    sockets: list[str] = []

    def unprefixed(route: Any) -> None:  # the proxy: /app/x is the server's /x
        route.fulfill(response=route.fetch(url=route.request.url.replace("/app/", "/", 1)))

    def socket(ws: Any) -> None:
        sockets.append(ws.url)
        ws.close()

    page.route("**/app/**", unprefixed)
    page.route_web_socket("**/realtime/video", socket)
    try:
        page.goto(f"{live.url}/app/video", wait_until="load")
        page.wait_for_function("window.__video.model !== null", timeout=TIMEOUT_MS)  # its fetches under /app/
        page.get_by_role("button", name="Generate").click()
        for _ in range(300):
            if sockets:
                break
            page.wait_for_timeout(100)  # lets the routes' handlers run
        assert sockets == [f"{live.ws_url}/app/v1/realtime/video"]
    finally:
        page.close()
