"""vLLM-Omni's two TTS demo shapes in demos/: plain Gradio and Gradio + fastrtc WebRTC(mode="receive").

Both read the server's raw PCM stream; the test checks what their handlers yield against the audio the tiny Qwen3-TTS
gives the speech route itself (the tests' greedy checkpoint) and that both pages build (without launching them).
Skipped without gradio / fastrtc.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from serving_helpers import spoken

pytest.importorskip("gradio")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "demos"))

import gradio_tts

pytest_plugins = ("serving_fixtures",)
TEXT = "Hello there. How are you?"


def test_the_plain_gradio_demo_streams_the_servers_pcm(live_server):
    chunks = list(gradio_tts.speech_chunks(live_server.url, TEXT, "ryan"))
    assert len(chunks) > 1 and all(c.dtype == np.dtype("<i2") for c in chunks)
    assert np.concatenate(chunks).tobytes() == spoken(live_server, "ryan", TEXT)
    demo = gradio_tts.build(live_server.url)
    assert demo is not None
    with pytest.raises(RuntimeError, match="voice"):
        list(gradio_tts.speech_chunks(live_server.url, TEXT, "nobody"))


@pytest.mark.webrtc
def test_the_webrtc_receive_demo_yields_mono_frames_of_the_stream(live_server):
    pytest.importorskip("fastrtc")
    import gradio_webrtc_tts

    frames = list(gradio_webrtc_tts.frames(live_server.url, TEXT, "serena"))
    assert all(rate == 24000 and f.ndim == 2 and f.shape[0] == 1 for rate, f in frames)
    assert np.concatenate([f[0] for _, f in frames]).tobytes() == spoken(live_server, "serena", TEXT)
    assert gradio_webrtc_tts.build(live_server.url) is not None
