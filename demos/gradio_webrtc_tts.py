"""Gradio + fastrtc TTS demo: the server's raw PCM stream played over WebRTC (vLLM-Omni's fastrtc demo shape).

A ``WebRTC(mode="receive", modality="audio")`` component plays what the handler yields: the handler streams
``POST /v1/audio/speech`` (raw PCM16 24 kHz, ``stream_format: "audio"``) and yields ``(24000, int16[1, n])``
frames as they arrive, so speech starts playing while the rest is synthesized. Needs the ``[webrtc]`` extra.

    omni-stream serve &  python demos/gradio_webrtc_tts.py --server http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from gradio_tts import RATE, speech_chunks, voices


def frames(server: str, text: str, voice: str | None, api_key: str | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """What the WebRTC handler yields: ``(24000, int16[1, n])`` per chunk of the stream."""
    for chunk in speech_chunks(server, text, voice, api_key):
        yield RATE, chunk.reshape(1, -1)


def build(server: str, api_key: str | None = None, ice_servers: list[dict] | None = None):  # -> gr.Blocks
    import gradio as gr
    from fastrtc import WebRTC

    names = voices(server, api_key)
    rtc = {"iceServers": ice_servers or []}

    def speak(text: str, voice: str) -> Iterator[tuple[int, np.ndarray]]:
        yield from frames(server, text, voice or None, api_key)

    with gr.Blocks(title="omni-stream TTS over WebRTC") as demo:
        gr.Markdown("# omni-stream: streaming speech over WebRTC")
        text = gr.Textbox(label="Text", value="Hello! This speech reaches you over WebRTC as it is made.", lines=3)
        voice = gr.Dropdown(names, value=names[0] if names else None, label="Voice")
        audio = WebRTC(label="Speech", mode="receive", modality="audio", rtc_configuration=rtc)
        button = gr.Button("Speak")
        audio.stream(fn=speak, inputs=[text, voice], outputs=[audio], trigger=button.click)
    return demo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--port", type=int, default=7861)
    args = ap.parse_args()
    build(args.server, args.api_key).launch(server_port=args.port)


if __name__ == "__main__":
    main()
