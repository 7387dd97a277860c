"""The voice-agent page over WebRTC in headless Chromium, run inside a private network namespace by the webrtc
tests: a fake microphone (a WAV file) speaks, the page's peer connection reaches the fastrtc stream under /rtc,
and the agent's audio comes back; the server runs behind an API key, typed into the page. Prints one JSON line of
findings; ``argv[1]``, if given, is a screenshot path.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import aioice.ice
import numpy as np
import soundfile as sf

aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"] if use_ipv4 else []  # only lo exists

sys.path.insert(0, str(Path(__file__).parent))

from browser_helpers import chromium  # noqa: E402
from realtime_doubles import spoken_words  # noqa: E402
from realtime_fixtures import agent_checkpoints, agent_loader, vad_factory  # noqa: E402
from serving_helpers import running_server  # noqa: E402
from synthetic import register as register_synthetic  # noqa: E402

from omni_stream.realtime.settings import Settings  # noqa: E402

KEY = "rtc-page-key"


register_synthetic()  # a plain subprocess: the test session's conftest did not declare the doubles here


def main() -> None:
    shot = sys.argv[1] if len(sys.argv) > 1 else None
    found: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        mic = root / "mic.wav"
        sf.write(mic, spoken_words(["three", "five"], lead_ms=1000, tail_ms=5000).astype(np.float32) / 32768, 48000)
        flags = (
            "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={mic}%noloop",
            "--allow-loopback-in-peer-connection",  # the namespace has only 127.0.0.1
            "--disable-features=WebRtcHideLocalIpsWithMdns",  # aiortc cannot resolve .local candidates
        )
        problems: list[str] = []
        settings = Settings(vad_factory=vad_factory(), api_key=KEY)  # the page sends the key with its offer
        with running_server(None, settings, load=agent_loader(agent_checkpoints(root))) as live:
            with chromium(root / "profile", *flags) as context:
                page = context.new_page()
                # the browser's own reports of the requests refused before the key was typed are expected
                page.on(
                    "console",
                    lambda m: (
                        problems.append(f"console: {m.text}") if m.type == "error" and "401" not in m.text else None
                    ),
                )
                page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
                page.goto(f"{live.url}/realtime", wait_until="load")
                page.get_by_label("API key (optional)").fill(KEY)
                page.get_by_label("API key (optional)").press("Tab")
                page.wait_for_function("window.agent.model !== null", timeout=20_000)
                page.select_option("#transport", "rtc")
                page.get_by_role("button", name="Start talking").click()
                try:
                    page.wait_for_function(
                        "window.agent.logs.includes('response_starting') && window.agent.loudFrames >= 10",
                        timeout=30_000,
                    )
                except Exception as exc:  # report what was seen instead of a bare timeout
                    found["wait_error"] = type(exc).__name__
                state = page.evaluate("() => JSON.parse(JSON.stringify(window.agent))")
                if shot:
                    page.screenshot(path=shot, full_page=True)
                page.get_by_role("button", name="Stop").click()
            deadline = time.monotonic() + 20
            while (live.state.sessions or live.state.rtc.connections) and time.monotonic() < deadline:
                time.sleep(0.05)
            found.update(
                logs=state["logs"],
                loud_frames=state["loudFrames"],
                rtc_state=state["rtcState"],
                errors=state["errors"],
                problems=problems,
                freed=not live.state.sessions and not live.state.rtc.connections,
                idle=not any(live.wait_idle().values()),
            )
    print(json.dumps(found))


if __name__ == "__main__":
    main()
