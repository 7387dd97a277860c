"""A WebRTC round trip on loopback, run inside a private network namespace (``unshare -n``) by the webrtc tests.

Starts the server (the voice agent with the test doubles, or with ``--real`` on the real tiny families) and an
aiortc client that opens a data channel, sends espeak-ng speech as its microphone track and records the agent audio
and data-channel logs it gets back; then closes and checks that the server freed everything. The server runs behind
an API key, which the client sends with its offer (an offer without it is refused first). Prints one JSON line of
findings.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import aioice.ice
import httpx
import numpy as np
import soundfile as sf

# Only 127.0.0.1 exists in the namespace, and aioice skips loopback addresses when it gathers host candidates.
aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"] if use_ipv4 else []

sys.path.insert(0, str(Path(__file__).parent))
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription  # noqa: E402
from aiortc.contrib.media import MediaPlayer  # noqa: E402
from realtime_fixtures import agent_checkpoints, agent_loader, espeak, framed, vad_factory  # noqa: E402
from serving_helpers import running_server  # noqa: E402
from synthetic import register as register_synthetic  # noqa: E402

from omni_stream.codecs.resample import resample  # noqa: E402
from omni_stream.realtime.settings import Settings  # noqa: E402

KEY = "rtc-loopback-key"
ASKS = 3  # times the real tiny families' call asks its question (8 s apart) until the agent's speech comes back


async def call(url: str, wav: Path, want_frames: int, wait_s: float) -> dict:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    logs: list[str] = []
    loud = 0
    pulls: list[asyncio.Future] = []
    got_enough = asyncio.Event()
    channel = pc.createDataChannel("text")  # fastrtc's tracks wait for a data channel

    @channel.on("message")
    def on_message(message: str) -> None:
        data = json.loads(message)
        if data.get("type") == "log":
            logs.append(data["data"])

    async def pull(track) -> None:
        nonlocal loud
        while True:
            try:
                frame = await track.recv()
            except Exception:
                return
            if np.abs(frame.to_ndarray()).max() > 1000:
                loud += 1
                if loud >= want_frames:
                    got_enough.set()

    @pc.on("track")
    def on_track(track) -> None:
        pulls.append(asyncio.ensure_future(pull(track)))

    pc.addTrack(MediaPlayer(str(wav)).audio)
    await pc.setLocalDescription(await pc.createOffer())
    async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {KEY}"}) as http:
        body = {"sdp": pc.localDescription.sdp, "type": "offer", "webrtc_id": uuid.uuid4().hex}
        unkeyed = await http.post(f"{url}/rtc/webrtc/offer", json=body, headers={"Authorization": ""})
        answer = (await http.post(f"{url}/rtc/webrtc/offer", json=body)).json()
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
        try:
            await asyncio.wait_for(got_enough.wait(), wait_s)
        except TimeoutError:
            pass
        state = pc.connectionState
        second = {"sdp": pc.localDescription.sdp, "type": "offer", "webrtc_id": uuid.uuid4().hex}
        refused = (await http.post(f"{url}/rtc/webrtc/offer", json=second)).json()
    await pc.close()
    found = {"connection": state, "loud_frames": loud, "logs": logs, "second_offer": refused}
    return {**found, "offer_without_key": unkeyed.status_code}


def wait_until(check, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)
    return check()


def real_checkpoints(root: Path) -> dict[str, Path]:
    """The real tiny families: Qwen3-TTS CustomVoice, Qwen3, Whisper (random weights)."""
    from omni_stream.models.causal_lm.checkpoint import write_tiny_checkpoint as tiny_lm
    from omni_stream.models.qwen3_tts.checkpoint import write_tiny_checkpoint as tiny_tts
    from omni_stream.models.whisper.checkpoint import write_tiny_checkpoint as tiny_whisper

    return {"tts": tiny_tts(root / "tts"), "lm": tiny_lm(root / "lm"), "asr": tiny_whisper(root / "asr")}


register_synthetic()  # a plain subprocess: the test session's conftest did not declare the doubles here


def main() -> None:
    real = "--real" in sys.argv  # the real tiny families, Silero and Smart Turn (the handler picks semantic_vad)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        question = espeak("Hello there, how are you today?")
        speech = framed(question, lead_ms=500, tail_ms=2500)
        if real:  # random weights may answer with nothing or a word: a user who hears no answer asks again
            speech = np.concatenate([framed(question, lead_ms=500, tail_ms=8000)] * (ASKS - 1) + [speech])
        wav = root / "mic48k.wav"
        sf.write(wav, resample(speech.astype(np.float32) / 32768, 24000, 48000), 48000, subtype="PCM_16")
        if real:
            settings = Settings(rtc_concurrency_limit=1, api_key=KEY)
            assert settings.turn_model_factory is not None, "Smart Turn (pipecat-ai) and onnxruntime are needed"
            checkpoints = real_checkpoints(root)
        else:
            settings = Settings(vad_factory=vad_factory(), rtc_concurrency_limit=1, api_key=KEY)
            checkpoints = agent_checkpoints(root)
        with running_server(None, settings, load=agent_loader(checkpoints)) as live:
            seen: set[str] = set()
            calling = threading.Event()

            def watch() -> None:  # the turn detection of the sessions the call opens
                while not calling.is_set():
                    for session in list(live.state.sessions):
                        td = session.protocol.config.turn_detection
                        seen.add(td.type.value if td is not None else "none")
                    time.sleep(0.05)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            found = asyncio.run(call(live.url, wav, want_frames=25, wait_s=60 if real else 25))
            calling.set()
            watcher.join()
            found["turn_detection"] = sorted(seen)
            found["sessions_freed"] = wait_until(lambda: not live.state.sessions)
            found["connections_freed"] = wait_until(lambda: not live.state.rtc.connections and not live.state.rtc.pcs)
            models = live.engine.models
            found["schedulers_idle"] = not any(live.wait_idle().values()) and not any(
                models.text().scheduler.live().values()
            )
    print(json.dumps(found))


if __name__ == "__main__":
    main()
