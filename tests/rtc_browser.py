"""The voice-agent page over WebRTC in headless Chromium, run inside a private network namespace by the webrtc
tests: a fake microphone (a WAV file) speaks, the page's peer connection reaches the fastrtc stream under /rtc,
and the agent's audio comes back; the server runs behind an API key, typed into the page. Prints one JSON line of
findings; an argument other than ``--camera``, if given, is a screenshot path.

``--camera``: the real tiny families with the text model that sees (Qwen2.5-VL, Qwen3-TTS, Whisper, Silero and
Smart Turn from their wheels); Chromium's fake camera is on, the page's camera toggle is switched on, and the
findings say whether the sessions' conversations held its picture. The fake microphone repeats an espeak question
(random weights may answer with nothing: the user asks again).
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import aioice.ice
import numpy as np
import soundfile as sf

aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"] if use_ipv4 else []  # only lo exists

sys.path.insert(0, str(Path(__file__).parent))
from browser_helpers import chromium  # noqa: E402
from realtime_doubles import spoken_words  # noqa: E402
from realtime_fixtures import agent_checkpoints, agent_loader, espeak, framed, vad_factory  # noqa: E402
from rtc_loopback import conversation_pictures, real_checkpoints  # noqa: E402
from serving_helpers import running_server  # noqa: E402
from synthetic import register as register_synthetic  # noqa: E402

from omni_stream.codecs.resample import resample  # noqa: E402
from omni_stream.realtime.settings import Settings  # noqa: E402

KEY = "rtc-page-key"


register_synthetic()  # a plain subprocess: the test session's conftest did not declare the doubles here


def open_page(context, url: str, problems: list[str]):
    """The page of ``url``'s server, its API key typed, the WebRTC transport chosen."""
    page = context.new_page()
    # the browser's own reports of the requests refused before the key was typed are expected
    page.on(
        "console",
        lambda m: problems.append(f"console: {m.text}") if m.type == "error" and "401" not in m.text else None,
    )
    page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
    page.goto(f"{url}/realtime", wait_until="load")
    page.get_by_label("API key (optional)").fill(KEY)
    page.get_by_label("API key (optional)").press("Tab")
    page.wait_for_function("window.agent.model !== null && window.agent.rtcAvailable !== null", timeout=20_000)
    page.select_option("#transport", "rtc")
    return page


def refused_camera(live, root: Path, flags: tuple[str, ...]) -> dict:
    """The camera toggle on in a browser that lets the page have the microphone but not the camera (no fake
    permission prompt: playwright grants the microphone alone): the page says so and calls without it."""
    problems: list[str] = []
    flags = tuple(f for f in flags if f != "--use-fake-ui-for-media-stream")
    url = live.url
    with chromium(root / "profile-no-camera", *flags) as context:
        context.grant_permissions(["microphone"], origin=url)
        page = open_page(context, url, problems)
        page.get_by_label("Camera", exact=True).check()
        page.get_by_role("button", name="Start talking").click()
        try:
            page.wait_for_function("window.agent.rtcState === 'connected'", timeout=20_000)
        except Exception as exc:
            problems.append(type(exc).__name__)
        state = page.evaluate("() => JSON.parse(JSON.stringify(window.agent))")
        audio_route = bool(live.state.rtc.connections) and not live.state.rtc_camera.connections
        page.get_by_role("button", name="Stop").click()
    found = {"errors": state["errors"], "rtc_state": state["rtcState"], "camera": state["camera"]}
    return {**found, "audio_route": audio_route, "problems": problems}


def main() -> None:
    camera = "--camera" in sys.argv[1:]
    shot = next((a for a in sys.argv[1:] if a != "--camera"), None)
    found: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        mic = root / "mic.wav"
        if camera:  # asked again and again (the file loops) until the random weights say something
            question = framed(espeak("Hello there, what do you see?"), lead_ms=500, tail_ms=6000)
            sf.write(mic, resample(question.astype(np.float32) / 32768, 24000, 48000), 48000, subtype="PCM_16")
        else:
            words = spoken_words(["three", "five"], lead_ms=1000, tail_ms=5000)
            sf.write(mic, words.astype(np.float32) / 32768, 48000)
        flags = (
            "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream",  # a fake camera too: a moving test pattern
            f"--use-file-for-fake-audio-capture={mic}{'' if camera else '%noloop'}",
            "--allow-loopback-in-peer-connection",  # the namespace has only 127.0.0.1
            "--disable-features=WebRtcHideLocalIpsWithMdns",  # aiortc cannot resolve .local candidates
        )
        problems: list[str] = []
        if camera:
            settings = Settings(api_key=KEY)  # Silero and Smart Turn from their wheels
            checkpoints = real_checkpoints(root)
            from omni_stream.models.qwen_vl.checkpoint import write_tiny_checkpoint as tiny_vl

            checkpoints["lm"] = tiny_vl(root / "vl")
        else:
            settings = Settings(vad_factory=vad_factory(), api_key=KEY)  # the page sends the key with its offer
            checkpoints = agent_checkpoints(root)
        pictures: dict = {"held": 0, "before_speech": False}
        with running_server(None, settings, load=agent_loader(checkpoints)) as live:
            calling = threading.Event()

            def watch() -> None:  # the pictures the sessions' conversations hold
                while not calling.is_set():
                    for session in list(live.state.sessions):
                        with contextlib.suppress(RuntimeError, ValueError):
                            conversation_pictures(session, pictures)
                    time.sleep(0.05)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            with chromium(root / "profile", *flags) as context:
                page = open_page(context, live.url, problems)
                toggle = page.locator("#camera-on")
                found["camera_toggle"] = {"disabled": toggle.is_disabled(), "note": page.inner_text("#camera-note")}
                if camera:
                    page.get_by_label("Camera", exact=True).check()
                page.get_by_role("button", name="Start talking").click()
                try:
                    page.wait_for_function(
                        "window.agent.logs.includes('response_starting') && window.agent.loudFrames >= 10",
                        timeout=90_000 if camera else 30_000,
                    )
                except Exception as exc:  # report what was seen instead of a bare timeout
                    found["wait_error"] = type(exc).__name__
                state = page.evaluate("() => JSON.parse(JSON.stringify(window.agent))")
                if shot:
                    page.screenshot(path=shot, full_page=True)
                preview = page.locator("#preview").is_visible()
                page.get_by_role("button", name="Stop").click()
            if camera:
                found["refused"] = refused_camera(live, root, flags)
            calling.set()
            watcher.join()
            streams = (live.state.rtc, live.state.rtc_camera)
            deadline = time.monotonic() + 20
            while (live.state.sessions or any(s.connections for s in streams)) and time.monotonic() < deadline:
                time.sleep(0.05)
            found.update(
                logs=state["logs"],
                loud_frames=state["loudFrames"],
                rtc_state=state["rtcState"],
                errors=state["errors"],
                problems=problems,
                camera=state["camera"],
                preview=preview,
                pictures=pictures,
                freed=not live.state.sessions and not any(s.connections for s in streams),
                idle=not any(live.wait_idle().values()),
            )
    print(json.dumps(found))


if __name__ == "__main__":
    main()
