"""Plain Gradio TTS demo against a running omni-stream server (vLLM-Omni's ``gradio_demo.py`` shape).

Type text, pick a voice, press Speak: the page streams ``POST /v1/audio/speech`` (raw PCM, ``stream_format:
"audio"``) into a streaming ``gr.Audio`` player. Needs ``pip install gradio`` (the ``[webrtc]`` extra has it).

    omni-stream serve &  python demos/gradio_tts.py --server http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import httpx
import numpy as np

RATE = 24000


def speech_chunks(server: str, text: str, voice: str | None, api_key: str | None = None) -> Iterator[np.ndarray]:
    """int16 chunks of the server's raw PCM stream for ``text`` (whole samples only)."""
    body = {"input": text, "response_format": "pcm", "stream_format": "audio"}
    if voice:
        body["voice"] = voice
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    carry = b""
    with httpx.stream("POST", f"{server}/v1/audio/speech", json=body, headers=headers, timeout=120) as response:
        if response.status_code != 200:
            response.read()
            raise RuntimeError(response.json()["error"]["message"])
        for data in response.iter_bytes():
            data, carry = carry + data, b""
            if len(data) % 2:
                data, carry = data[:-1], data[-1:]
            if data:
                yield np.frombuffer(data, dtype="<i2")


def voices(server: str, api_key: str | None = None) -> list[str]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.get(f"{server}/v1/audio/voices", headers=headers, timeout=30).json()["voices"]


def build(server: str, api_key: str | None = None):  # -> gr.Blocks
    import gradio as gr

    names = voices(server, api_key)

    def speak(text: str, voice: str) -> Iterator[tuple[int, np.ndarray]]:
        for chunk in speech_chunks(server, text, voice or None, api_key):
            yield RATE, chunk

    with gr.Blocks(title="omni-stream TTS") as demo:
        gr.Markdown("# omni-stream: streaming text to speech")
        text = gr.Textbox(label="Text", value="Hello! This is omni-stream, streaming speech as it is made.", lines=3)
        voice = gr.Dropdown(names, value=names[0] if names else None, label="Voice")
        audio = gr.Audio(label="Speech", streaming=True, autoplay=True)
        gr.Button("Speak").click(speak, [text, voice], audio)
    return demo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--port", type=int, default=7860)
    args = ap.parse_args()
    build(args.server, args.api_key).launch(server_port=args.port)


if __name__ == "__main__":
    main()
