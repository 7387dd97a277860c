"""The audio path of responses: reported sample rates match the bytes, encoders are closed on every exit (the
shared server on the tiny Qwen3-TTS)."""

from __future__ import annotations

import io
import json

import av
import httpx
import numpy as np
import pytest
from serving_helpers import RATE
from websockets.sync.client import connect

from omni_stream import codecs
from omni_stream.codecs import EncoderState
from omni_stream.realtime.common import audio_out
from omni_stream.realtime.common.audio_out import AudioOut, encode_whole

pytest_plugins = ("serving_fixtures",)


def decoded_rate(data: bytes) -> int:
    """What an independent decoder (PyAV/FFmpeg) gives for the file, checked on every decoded frame."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        rates = {frame.sample_rate for frame in container.decode(stream)}
    assert len(rates) == 1, rates
    return rates.pop()


@pytest.mark.parametrize(
    ("fmt", "asked"),
    [("opus", 22050), ("opus", 8000), ("mp3", 11000), ("mp3", 22000), ("aac", 22000), ("flac", 22050), ("wav", 9000)],
)
def test_http_sample_rate_header_is_what_a_decoder_reports(live_server, fmt, asked):
    body = {"input": "Rates.", "voice": "vivian", "response_format": fmt, "sample_rate": asked}
    r = httpx.post(f"{live_server.url}/v1/audio/speech", json=body, timeout=60)
    assert r.status_code == 200
    assert int(r.headers["x-sample-rate"]) == decoded_rate(r.content)


@pytest.mark.parametrize("fmt", ["opus", "mp3"])
def test_websocket_audio_start_reports_the_decoded_rate(live_server, fmt):
    with connect(f"{live_server.ws_url}/v1/audio/speech/stream", open_timeout=10) as ws:
        ws.send(json.dumps({"type": "session.config", "voice": "ryan", "response_format": fmt, "sample_rate": 22000}))
        ws.send(json.dumps({"type": "input.text", "text": "Rates over the socket."}))
        ws.send(json.dumps({"type": "input.done"}))
        start, data = None, b""
        while True:
            message = ws.recv(timeout=10)
            if isinstance(message, bytes):
                data += message
                continue
            event = json.loads(message)
            if event["type"] == "audio.start":
                start = event
            if event["type"] == "session.done":
                break
    assert start is not None and start["sample_rate"] == decoded_rate(data)


def test_audio_out_reports_the_encoders_rate_not_the_requested_one():
    assert AudioOut("mp3", RATE, 11000).sample_rate == 11025
    assert AudioOut("opus", RATE, 22050).sample_rate == 48000
    assert AudioOut("pcm", RATE, 22050).sample_rate == 22050


class Boom(RuntimeError):
    pass


@pytest.fixture
def exploding_encoders(monkeypatch):
    """Encoders whose first chunk raises; the list collects every encoder opened."""
    opened = []
    real_open = codecs.encoders.open_encoder

    def open_encoder(*args, **kwargs):
        encoder = real_open(*args, **kwargs)

        def fail(x):
            raise Boom("mid-encode failure")

        encoder._encode = fail
        opened.append(encoder)
        return encoder

    monkeypatch.setattr(codecs.encoders, "open_encoder", open_encoder)
    monkeypatch.setattr(codecs, "open_encoder", open_encoder)
    return opened


@pytest.mark.parametrize("fmt", ["opus", "aac", "flac", "mp3", "wav"])
def test_encode_whole_closes_the_encoder_when_encoding_fails(exploding_encoders, fmt):
    samples = np.zeros(RATE // 2, np.float32)
    with pytest.raises(Boom):
        encode_whole(fmt, samples, RATE, 16000 if fmt != "opus" else None, speed=1.5)
    (encoder,) = exploding_encoders
    assert encoder.state is EncoderState.CLOSED
    if hasattr(encoder, "_closed"):  # PyAV-backed: the container is released
        assert encoder._closed


def test_encode_whole_reuses_the_codecs_function(monkeypatch):
    calls = []
    real = codecs.encode_whole

    def spy(fmt, pcm, rate, *args, **kwargs):
        calls.append((fmt, rate, len(pcm)))
        return real(fmt, pcm, rate, *args, **kwargs)

    monkeypatch.setattr(audio_out.codecs, "encode_whole", spy)
    data, rate = encode_whole("wav", np.zeros(RATE, np.float32), RATE, 16000)
    assert calls == [("wav", 16000, 16000)] and rate == 16000 and data[:4] == b"RIFF"


def test_streaming_audio_out_close_releases_the_encoder(exploding_encoders):
    out = AudioOut("opus", RATE, streaming=True)
    with pytest.raises(Boom):
        out.encode_sync(np.zeros(RATE, np.float32))
    out.close()
    out.close()  # idempotent: the response and its generator may both close it
    assert exploding_encoders[0].state is EncoderState.CLOSED and exploding_encoders[0]._closed


@pytest.mark.parametrize(
    ("fmt", "dst", "on_loop"), [("pcm", None, True), ("wav", None, True), ("pcm", 16000, False), ("mp3", None, False)]
)
async def test_raw_pcm_and_wav_at_the_model_rate_are_encoded_on_the_loop_and_the_rest_in_a_thread(
    monkeypatch, fmt, dst, on_loop
):
    """Opening and encoding raw PCM or WAV at the model's rate hands nothing to a thread (a cast per chunk); anything
    resampled or compressed still goes to one. The bytes are the same either way."""
    hops = []
    run_sync = audio_out.anyio.to_thread.run_sync

    async def counted(fn, *args, **kwargs):
        hops.append(fn)
        return await run_sync(fn, *args, **kwargs)

    monkeypatch.setattr(audio_out.anyio.to_thread, "run_sync", counted)
    chunks = [np.sin(np.arange(n) / 7).astype(np.float32) * 0.5 for n in (1920, 3840, 7680)]
    out = await AudioOut.open(fmt, RATE, dst)
    data = b"".join([await out.encode(c) for c in chunks]) + await out.finish()
    out.close()
    assert (hops == []) is on_loop and out.inline is on_loop
    if not on_loop:
        assert len(hops) == 1 + len(chunks) + 1  # open, each chunk, the finish
    ref = AudioOut(fmt, RATE, dst)
    assert data == b"".join(ref.encode_sync(c) for c in chunks) + ref.finish_sync()
    ref.close()
