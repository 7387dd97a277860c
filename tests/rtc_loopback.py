"""A WebRTC round trip on loopback, run inside a private network namespace (``unshare -n``) by the webrtc tests.

Starts the server (the voice agent with the test doubles, or with ``--real`` on the real tiny families) and an
aiortc client that opens a data channel, sends espeak-ng speech as its microphone track and records the agent audio
and data-channel logs it gets back; then closes and checks that the server freed everything. The server runs behind
an API key, which the client sends with its offer (an offer without it is refused first). Prints one JSON line of
findings.

``--camera``: the camera route ``/rtc/camera``; the client sends a synthetic camera track (:class:`Camera`) beside
its microphone, and the findings say what the sessions' conversations held (pictures, whether one came before the
user's speech, the last one's size and how much of it is the camera's bright square) and how many self-view frames
came back. With ``--real`` the text model is the one that sees (the tiny Qwen2.5-VL); the doubles' is blind.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription, VideoStreamTrack  # noqa: E402
from aiortc.contrib.media import MediaPlayer  # noqa: E402
from av import VideoFrame  # noqa: E402
from realtime_fixtures import agent_checkpoints, agent_loader, espeak, framed, vad_factory  # noqa: E402
from serving_helpers import running_server  # noqa: E402
from synthetic import register as register_synthetic  # noqa: E402

from omni_stream.codecs.resample import resample  # noqa: E402
from omni_stream.realtime.agent.items import ContentType  # noqa: E402
from omni_stream.realtime.settings import Settings  # noqa: E402

KEY = "rtc-loopback-key"
ASKS = 3  # times the real tiny families' call asks its question (8 s apart) until the agent's speech comes back


class Camera(VideoStreamTrack):
    """A synthetic camera: 160x120 at aiortc's 30 frames a second, a bright square on a coloured ground that moves
    and changes colour every half second (so the near-duplicate filter keeps a new picture then, and drops the
    frames between)."""

    async def recv(self) -> VideoFrame:
        pts, time_base = await self.next_timestamp()
        step = int(pts * time_base * 2)  # half seconds since the start
        pixels = np.zeros((120, 160, 3), np.uint8)
        pixels[:] = ((step * 70) % 256, (step * 130) % 256, 90)
        x = (step * 23) % 120
        pixels[30:90, x : x + 40] = 255
        frame = VideoFrame.from_ndarray(pixels, format="rgb24")
        frame.pts, frame.time_base = pts, time_base
        return frame


async def call(url: str, wav: Path, want_frames: int, wait_s: float, camera: bool = False) -> dict:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    logs: list[str] = []
    loud = 0
    views = 0  # self-view frames that came back on the camera route
    pulls: list[asyncio.Future] = []
    got_enough = asyncio.Event()
    channel = pc.createDataChannel("text")  # fastrtc's tracks wait for a data channel

    @channel.on("message")
    def on_message(message: str) -> None:
        data = json.loads(message)
        if data.get("type") == "log":
            logs.append(data["data"])

    async def pull(track) -> None:
        nonlocal loud, views
        while True:
            try:
                frame = await track.recv()
            except Exception:
                return
            if track.kind == "video":
                views += 1
            elif np.abs(frame.to_ndarray()).max() > 1000:
                loud += 1
                if loud >= want_frames:
                    got_enough.set()

    @pc.on("track")
    def on_track(track) -> None:
        pulls.append(asyncio.ensure_future(pull(track)))

    pc.addTrack(MediaPlayer(str(wav)).audio)
    if camera:
        pc.addTrack(Camera())
    offer_url = f"{url}/rtc/camera/webrtc/offer" if camera else f"{url}/rtc/webrtc/offer"
    await pc.setLocalDescription(await pc.createOffer())
    async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {KEY}"}) as http:
        body = {"sdp": pc.localDescription.sdp, "type": "offer", "webrtc_id": uuid.uuid4().hex}
        unkeyed = await http.post(offer_url, json=body, headers={"Authorization": ""})
        answer = (await http.post(offer_url, json=body)).json()
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
        try:
            await asyncio.wait_for(got_enough.wait(), wait_s)
        except TimeoutError:
            pass
        state = pc.connectionState
        second = {"sdp": pc.localDescription.sdp, "type": "offer", "webrtc_id": uuid.uuid4().hex}
        refused = (await http.post(offer_url, json=second)).json()
    await pc.close()
    found = {"connection": state, "loud_frames": loud, "logs": logs, "second_offer": refused, "views": views}
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


def conversation_pictures(session, into: dict) -> None:
    """What a session's conversation holds of pictures (see the module docstring), noted ``into``."""
    items = list(session.protocol.conversation.items)
    shown = [i for i, item in enumerate(items) if any(c.type is ContentType.INPUT_IMAGE for c in item.content)]
    spoken = [i for i, item in enumerate(items) if any(c.type is ContentType.INPUT_AUDIO for c in item.content)]
    into["held"] = max(into["held"], len(shown))
    into["before_speech"] |= bool(shown and spoken and shown[0] < spoken[-1])
    if shown:
        image = next(c.image for c in items[shown[-1]].content if c.type is ContentType.INPUT_IMAGE)
        into["shape"] = list(image.shape)
        into["bright"] = round(float(np.mean(image.min(axis=2) > 200)), 3)  # the square: 60x40 of 160x120
        into["rgb"] = [round(float(v)) for v in image.reshape(-1, 3).mean(axis=0)]  # its mean colour


def webrtc_streams(url: str) -> float:
    """The server's open WebRTC sessions, as /metrics counts them."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith('omni_stream_active_streams{transport="webrtc"}'):
            return float(line.split()[-1])
    return 0.0


def main() -> None:
    camera = "--camera" in sys.argv  # a camera track, on the camera route
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
            if camera:
                from omni_stream.models.qwen_vl.checkpoint import write_tiny_checkpoint as tiny_vl

                checkpoints["lm"] = tiny_vl(root / "vl")
        else:
            settings = Settings(vad_factory=vad_factory(), rtc_concurrency_limit=1, api_key=KEY)
            checkpoints = agent_checkpoints(root)
        with running_server(None, settings, load=agent_loader(checkpoints)) as live:
            seen: set[str] = set()
            pictures: dict = {"held": 0, "before_speech": False}
            gauge = {"most": 0.0}
            calling = threading.Event()

            def watch() -> None:  # the turn detection of the sessions the call opens, the pictures they held
                while not calling.is_set():
                    for session in list(live.state.sessions):
                        td = session.protocol.config.turn_detection
                        seen.add(td.type.value if td is not None else "none")
                        with contextlib.suppress(RuntimeError, ValueError):  # read while the loop changes it
                            conversation_pictures(session, pictures)
                    if live.state.sessions:
                        gauge["most"] = max(gauge["most"], webrtc_streams(live.url))
                    time.sleep(0.05)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            found = asyncio.run(call(live.url, wav, want_frames=25 if real else 20, wait_s=60, camera=camera))
            calling.set()
            watcher.join()
            found["turn_detection"] = sorted(seen)
            found["pictures"] = pictures
            found["sessions_freed"] = wait_until(lambda: not live.state.sessions)
            found["metrics_webrtc"] = [gauge["most"], webrtc_streams(live.url)]  # during the call, after it
            stream = live.state.rtc_camera if camera else live.state.rtc
            found["connections_freed"] = wait_until(lambda: not stream.connections and not stream.pcs)
            models = live.engine.models
            found["schedulers_idle"] = not any(live.wait_idle().values()) and not any(
                models.text().scheduler.live().values()
            )
    print(json.dumps(found))


if __name__ == "__main__":
    main()
