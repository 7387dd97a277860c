"""POST /v1/audio/transcriptions on a real server over the tiny Whisper: the unchanged openai SDK (JSON, text, the
SSE stream), a recording longer than the model's window, every bad input a 400 naming its field, and a client that
leaves mid-stream freeing every window."""

from __future__ import annotations

import io
import math
import time
import wave

import httpx
import numpy as np
import openai
import pytest
from serving_helpers import running_server

from omni_stream.family import ModelKind
from omni_stream.realtime.settings import Settings
from omni_stream.transcription.long_form import split_windows

pytest_plugins = ("asr_fixtures",)

RATE = 16000
MODEL = "whisper-tiny"  # the test checkpoint's name
LIMITS = Settings(max_transcription_seconds=100.0, max_transcription_bytes=4 * 1024 * 1024)


def wav(samples: np.ndarray) -> bytes:
    """16-bit mono WAV at 16 kHz."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(samples.astype("<i2").tobytes())
    return out.getvalue()


def noise(seconds: float, seed: int = 0, gaps: tuple[float, ...] = ()) -> np.ndarray:
    """int16 noise with 0.2 s of silence at each of ``gaps``."""
    x = (np.random.default_rng(seed).standard_normal(int(seconds * RATE)) * 3000).astype(np.int16)
    for at in gaps:
        x[int(at * RATE) : int((at + 0.2) * RATE)] = 0
    return x


@pytest.fixture(scope="module")
def server(tiny_whisper):
    with running_server(tiny_whisper, LIMITS) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def family(server):
    return server.engine.models.get(ModelKind.TRANSCRIPTION)


def wait_clean(server, timeout: float = 10.0) -> None:
    """Until no transcription row is held (the server's worker applies releases between its steps)."""
    sched = family(server).scheduler
    deadline = time.monotonic() + timeout
    while any(sched.live().values()) or family(server).runner.live:
        assert time.monotonic() < deadline, sched.live()
        time.sleep(0.01)


def test_the_model_list_gives_the_transcription_models_rate_and_languages(server):
    (entry,) = [m for m in httpx.get(f"{server.url}/v1/models").json()["data"] if m["kind"] == "transcription"]
    assert entry["id"] == MODEL and entry["sample_rate"] == 16000
    assert entry["languages"] == list(family(server).info.languages) and "de" in entry["languages"]


def test_json_text_and_the_stream_carry_one_transcript(client, server):
    audio = wav(noise(2.5, seed=1))
    whole = client.audio.transcriptions.create(model=MODEL, file=("a.wav", audio, "audio/wav"), language="en")
    assert whole.text and whole.usage.type == "tokens"
    usage = whole.usage
    assert usage.input_token_details.audio_tokens == 125  # 50 encoder frames a second
    assert usage.input_tokens == 125 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    text = client.audio.transcriptions.create(model=MODEL, file=("a.wav", audio), language="en", response_format="text")
    assert text == whole.text
    events = list(client.audio.transcriptions.create(model=MODEL, file=("a.wav", audio), language="en", stream=True))
    deltas = [e for e in events if e.type == "transcript.text.delta"]
    assert len(deltas) > 1 and all(e.delta for e in deltas)
    assert events[-1].type == "transcript.text.done" and events[:-1] == deltas
    assert "".join(e.delta for e in deltas) == events[-1].text == whole.text
    assert events[-1].usage.output_tokens == usage.output_tokens
    wait_clean(server)


def test_a_prompt_guides_the_decoder(client):
    audio = wav(noise(1.5, seed=2))
    plain = client.audio.transcriptions.create(model=MODEL, file=("a.wav", audio), language="en")
    prompted = client.audio.transcriptions.create(model=MODEL, file=("a.wav", audio), language="en", prompt="dudu")
    assert prompted.usage.input_tokens > plain.usage.input_tokens  # the prompt's tokens are read


def test_a_recording_longer_than_the_window_is_its_windows_in_order(client, server):
    x = noise(65.0, seed=4, gaps=(29.0, 58.0))
    windows = split_windows(x.astype(np.float32) / 32768, RATE, 30.0)
    assert len(windows) == 3
    long = client.audio.transcriptions.create(model=MODEL, file=("long.wav", wav(x)), language="en")
    parts = [
        client.audio.transcriptions.create(model=MODEL, file=("part.wav", wav(x[a:b])), language="en").text
        for a, b in windows
    ]
    expected = parts[0]
    for part in parts[1:]:
        expected += part if expected[-1:].isspace() or part[:1].isspace() else " " + part
    assert long.text == expected
    # 50 encoder frames a second, each window's rounded up
    assert long.usage.input_token_details.audio_tokens == sum(math.ceil((b - a) * 50 / RATE) for a, b in windows)
    wait_clean(server)


def post(server, files=None, **fields):
    files = files if files is not None else {"file": ("a.wav", wav(noise(0.5)), "audio/wav")}
    return httpx.post(f"{server.url}/v1/audio/transcriptions", data=fields, files=files, timeout=30)


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"response_format": "srt"}, "response_format", "timestamps"),
        ({"response_format": "verbose_json"}, "response_format", "timestamps"),
        ({"response_format": "xml"}, "response_format", "'json' or 'text'"),
        ({"response_format": "diarized_json"}, "response_format", "speaker labels"),
        ({"temperature": "0.4"}, "temperature", "greedily"),
        ({"temperature": "2"}, "temperature", "between 0.0 and 1.0"),
        ({"timestamp_granularities[]": "word"}, "timestamp_granularities", "timestamps"),
        ({"include[]": "logprobs"}, "include", "log-probabilities"),
        ({"chunking_strategy": '{"type": "server_vad"}'}, "chunking_strategy", "'auto'"),
        ({"chunking_strategy[type]": "server_vad"}, "chunking_strategy", "'auto'"),  # the SDK's spelling
        ({"known_speaker_names[]": "ann"}, "known_speaker_names", "speaker"),
        ({"language": "xx"}, "language", "Unsupported language"),
        ({"stream": "maybe"}, "stream", "boolean"),
        ({"speed": "2"}, "speed", "Unknown field"),
        ({"model": "whisper-1"}, "model", "does not exist"),
    ],
)
def test_bad_fields_are_a_400_naming_the_field(server, fields, param, words):
    response = post(server, **fields)
    assert response.status_code == (404 if param == "model" else 400), response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"]


def test_accepted_spellings_of_openai_options(server):
    response = post(server, temperature="0", chunking_strategy="auto", language="EN", stream="false")
    assert response.status_code == 200 and response.json()["text"]


def test_bad_files_are_a_400_naming_file(server):
    cases = [
        ({"model": (None, MODEL)}, "'file' is required"),  # a multipart body without a file
        ({"file": ("a.txt", b"hello there", "text/plain")}, "Could not decode 'file'"),
        ({"file": ("long.wav", wav(noise(110.0)), "audio/wav")}, "more than 100 s"),
        ({"file": ("big.wav", b"\0" * (5 * 1024 * 1024), "audio/wav")}, "exceeds the maximum of 4194304 bytes"),
        ({"audio": ("a.wav", wav(noise(0.5)), "audio/wav")}, "Unknown file field 'audio'"),
        ({"file": (None, "hello")}, "'file' must be an uploaded file"),  # curl -F file=hello: a text part
    ]
    for files, words in cases:
        response = post(server, files=files)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert words in error["message"] and error["param"] in ("file", "audio"), error
    form = httpx.post(f"{server.url}/v1/audio/transcriptions", data={"model": MODEL}, timeout=30)
    assert form.status_code == 400
    message = form.json()["error"]["message"]
    assert message == "/v1/audio/transcriptions takes a multipart/form-data body, got application/x-www-form-urlencoded"


def test_a_client_that_leaves_mid_stream_frees_every_window(server):
    files = {"file": ("long.wav", wav(noise(80.0, seed=9)), "audio/wav")}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", f"{server.url}/v1/audio/transcriptions", files=files, data={"stream": "true"}) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert "transcript.text.delta" in first
    wait_clean(server)
    assert server.app.state.omni.metrics.disconnects.labels("sse")._value.get() >= 1


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # the SDK marks its translations call so
def test_translations_take_the_same_file_and_write_the_translate_task(client, server):
    audio = wav(noise(2.0, seed=11))
    translated = client.audio.translations.create(model=MODEL, file=("a.wav", audio))
    transcribed = client.audio.transcriptions.create(model=MODEL, file=("a.wav", audio))
    assert translated.text and translated.text != transcribed.text  # <|translate|> in the prompt, not <|transcribe|>
    as_text = client.audio.translations.create(model=MODEL, file=("a.wav", audio), response_format="text")
    assert as_text == translated.text
    bad = httpx.post(f"{server.url}/v1/audio/translations", data={"response_format": "srt"},
                     files={"file": ("a.wav", audio, "audio/wav")}, timeout=30)  # fmt: skip
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "response_format"
    wait_clean(server)


def test_a_posted_recording_is_bulk_work_holding_at_most_half_the_slots(tiny_whisper):
    """Files sent to the route queue behind a voice agent's turns on the same model and hold at most half of its
    batch slots: a 100 s file's 4 windows start together on a 4-slot model and run 2 at a time."""
    with running_server(tiny_whisper, max_batch_size=4) as live:
        runner = family(live).runner
        runner.record = True
        response = post(live, files={"file": ("long.wav", wav(noise(100.0, seed=12)), "audio/wav")})
        assert response.status_code == 200 and response.json()["text"]
        admitted = [e for e in runner.log if e[0] == "admit"]
        assert sorted(e[2].rsplit("-", 1)[1] for e in admitted) == ["0", "1", "2", "3"]  # the 4 windows
        held = most = 0
        for event in runner.log:
            held += {"admit": 1, "release": -1}.get(event[0], 0)
            most = max(most, held)
        assert most == 2
