"""What a new user meets on ``omni-stream serve`` with no arguments (every kind's embedded tiny model): every
route answers, and bad input gets a message that names what is wrong, never an internal detail."""

from __future__ import annotations

import base64
import json
import logging
import re
import struct
import zlib
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
from image_helpers import decode_b64_image, png_bytes
from serving_helpers import LiveServer, default_server
from video_helpers import wait_until
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from omni_stream.family import ModelKind
from omni_stream.realtime.settings import Settings

pytest.importorskip("diffusers", reason="needs the [image] and [video] extras (diffusers)")


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    with default_server(Settings(video_start_timeout=5.0)) as server:
        yield server


def text_model(live: LiveServer) -> str:
    return live.engine.models.get(ModelKind.TEXT).info.model_name


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header says ``width`` x ``height`` (its one row of pixel data is all a decoder would reach)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b"")


def multipart(fields: dict[str, str], files: dict[str, bytes], boundary: str = "b0undary") -> bytes:
    out = b""
    for name, value in fields.items():
        out += f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
    for name, data in files.items():
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="x.png"\r\n'
        out += (head + "Content-Type: image/png\r\n\r\n").encode() + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def realtime_events(ws, until: str, limit: int = 50) -> list[dict]:
    events = []
    for _ in range(limit):
        events.append(json.loads(ws.recv(timeout=20)))
        if events[-1]["type"] == until:
            return events
    raise AssertionError(f"no {until} in {[e['type'] for e in events]}")


# --- messages that named the wrong thing -----------------------------------------------------------------------------


def test_a_nan_temperature_is_named_as_nan_not_as_a_number(live):
    body = '{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'
    response = httpx.post(f"{live.url}/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "temperature"
    assert "NaN" in error["message"] and "got number" not in error["message"], error


def test_an_empty_realtime_event_says_its_type_is_missing(live):
    with connect(f"{live.ws_url}/v1/realtime") as ws:
        realtime_events(ws, "conversation.created")
        ws.send("{}")
        error = realtime_events(ws, "error")[-1]["error"]
    assert error["param"] == "type" and "NoneType" not in error["message"], error
    assert "'type'" in error["message"]


def test_a_bad_video_image_reference_shows_no_python_object(live):
    with connect(f"{live.ws_url}/v1/realtime/video") as ws:
        url = "data:image/png;base64," + base64.b64encode(b"not a picture at all").decode()
        ws.send(json.dumps({"type": "session.start", "prompt": "a kite", "image_reference": url}))
        error = json.loads(ws.recv(timeout=20))
    assert error["type"] == "error" and error["param"] == "image_reference", error
    assert "object at 0x" not in error["message"] and "BytesIO" not in error["message"], error


def test_an_image_over_the_pixel_limit_is_named_as_such(live):
    limit = live.state.settings.max_image_pixels
    body = multipart({"prompt": "snow"}, {"image": png_header_only(30000, 30000)})
    headers = {"content-type": "multipart/form-data; boundary=b0undary"}
    response = httpx.post(f"{live.url}/v1/images/edits", content=body, headers=headers)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "image", error
    assert "not a PNG" not in error["message"] and str(limit) in error["message"], error


def test_a_multipart_body_cut_inside_a_file_says_it_was_truncated(live):
    png = png_header_only(64, 64) + b"\0" * 4096
    body = multipart({"prompt": "snow"}, {"image": png})
    cut = body[: body.index(b"\0" * 64) + 100]  # inside the image's bytes
    headers = {"content-type": "multipart/form-data; boundary=b0undary"}
    response = httpx.post(f"{live.url}/v1/images/edits", content=cut, headers=headers)
    error = response.json()["error"]
    assert response.status_code == 400 and "truncated" in error["message"], error
    assert "is required" not in error["message"]


def test_a_huge_realtime_text_item_is_refused_with_its_limit(live):
    limit = live.state.settings.realtime_max_text_chars
    with connect(f"{live.ws_url}/v1/realtime", max_size=None) as ws:
        realtime_events(ws, "conversation.created")
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a" * 1_000_000}]}
        ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        error = realtime_events(ws, "error")[-1]["error"]
        item["content"][0]["text"] = "a" * limit  # at the limit: accepted
        ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        assert realtime_events(ws, "conversation.item.added")[-1]["type"] == "conversation.item.added"
    assert error["code"] == "invalid_value" and error["param"] == "item.content[0].text", error
    assert str(limit) in error["message"]


def test_an_unknown_realtime_model_is_model_not_found(live):
    with connect(f"{live.ws_url}/v1/realtime?model=no-such-model") as ws:
        event = json.loads(ws.recv(timeout=20))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=20)
    assert event["type"] == "error" and event["error"]["code"] == "model_not_found", event
    assert event["error"]["param"] == "model" and text_model(live) in event["error"]["message"]
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    with connect(f"{live.ws_url}/v1/realtime?model={text_model(live)}") as ws:
        created = json.loads(ws.recv(timeout=20))
    assert created["type"] == "session.created" and created["session"]["model"] == text_model(live)
    with connect(f"{live.ws_url}/v1/realtime") as ws:  # omitted: the agent's text model
        assert json.loads(ws.recv(timeout=20))["session"]["model"] == text_model(live)


# --- /metrics and /v1/models -----------------------------------------------------------------------------------------


def disconnects(live: LiveServer, transport: str) -> float:
    """``omni_stream_client_disconnects_total`` of ``transport`` as /metrics reports it."""
    text = httpx.get(f"{live.url}/metrics").text
    found = re.search(rf'^omni_stream_client_disconnects_total{{transport="{transport}"}} (\S+)$', text, re.M)
    return float(found[1]) if found else 0.0


def sessions_ended(live: LiveServer) -> None:
    wait_until(lambda: not live.state.sessions, what="the sessions to end")


def speech_socket(live: LiveServer):
    ws = connect(f"{live.ws_url}/v1/audio/speech/stream")
    ws.send(json.dumps({"type": "session.config", "response_format": "pcm", "stream_audio": True}))
    return ws


def next_of(ws, kind: str) -> dict:
    while True:
        message = ws.recv(timeout=30)
        if isinstance(message, str) and json.loads(message)["type"] == kind:
            return json.loads(message)


def test_every_speech_socket_left_mid_utterance_is_counted(live):
    sessions_ended(live)
    before = disconnects(live, "ws")
    typing = speech_socket(live)  # text sent, the utterance not ended yet
    typing.send(json.dumps({"type": "input.text", "text": "Hello there, how are"}))
    waiting = speech_socket(live)  # the utterance ended, left before its audio began
    waiting.send(json.dumps({"type": "input.text", "text": "Hello there."}))
    waiting.send(json.dumps({"type": "input.done"}))
    playing = speech_socket(live)  # left while its audio streams
    playing.send(json.dumps({"type": "input.text", "text": "Hello there."}))
    playing.send(json.dumps({"type": "input.done"}))
    next_of(playing, "audio.start")
    for ws in (typing, waiting, playing):
        ws.close()
    finished = speech_socket(live)  # heard to the end, then left: nothing was cut short
    finished.send(json.dumps({"type": "input.text", "text": "Hi."}))
    finished.send(json.dumps({"type": "input.done"}))
    next_of(finished, "session.done")
    finished.close()
    sessions_ended(live)
    assert disconnects(live, "ws") == before + 3


def test_a_realtime_socket_left_mid_response_is_counted(live):
    sessions_ended(live)
    before = disconnects(live, "realtime")
    with connect(f"{live.ws_url}/v1/realtime") as ws:  # left between turns: not counted
        realtime_events(ws, "conversation.created")
    with connect(f"{live.ws_url}/v1/realtime") as ws:
        realtime_events(ws, "conversation.created")
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a story."}]}
        ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        ws.send(json.dumps({"type": "response.create"}))
        realtime_events(ws, "response.created")
    sessions_ended(live)
    assert disconnects(live, "realtime") == before + 1
    held = lambda: any(any(live.engine.models.get(k).scheduler.live().values()) for k in ("speech", "text"))  # noqa: E731
    wait_until(lambda: not held(), what="the response's model state to be released")


def test_the_pages_assets_are_served_and_the_folders_python_is_not(live):
    for asset in ("realtime.js", "mic-capture-worklet.js", "page.css"):
        assert httpx.get(f"{live.url}/static/{asset}").status_code == 200, asset
    for hidden in ("__init__.py", "__pycache__/__init__.cpython-311.pyc"):
        response = httpx.get(f"{live.url}/static/{hidden}")
        assert response.status_code == 404 and response.json()["error"]["code"] == 404, hidden


def test_the_model_list_names_the_voices(live):
    models = httpx.get(f"{live.url}/v1/models").json()["data"]
    speech = next(m for m in models if m["kind"] == "speech")
    voices = httpx.get(f"{live.url}/v1/audio/voices").json()["voices"]
    assert speech["voices"] == voices and len(voices) > 1
    # the tiny Qwen3-TTS CustomVoice's own voice, listed above: its DELETE says it is built in, not "not found"
    refused = httpx.delete(f"{live.url}/v1/audio/voices/{voices[0]}")
    assert refused.status_code == 404 and "built into the model" in refused.json()["error"]["message"], refused.text
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0)
    assert client.models.retrieve(speech["id"]).id == speech["id"]  # GET /v1/models/{id}: one entry
    missing = httpx.get(f"{live.url}/v1/models/dall-e-9")
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
    assert speech["id"] in missing.json()["error"]["message"]


# --- images: the route every kind's default covers, and which SSE dialect a client gets ------------------------------


def sdk(live: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0)


def test_text_to_image_works_on_the_no_argument_server(live):
    result = sdk(live).images.generate(prompt="a red kite over a green hill", size="64x64")
    assert len(result.data) == 1 and decode_b64_image(result.data[0].b64_json).size == (64, 64)
    events = list(sdk(live).images.generate(prompt="a red kite", size="64x64", stream=True))
    assert events[-1].type == "image_generation.completed"


@pytest.mark.parametrize("partial_images", [None, 1])
def test_unchanged_openai_sdk_code_gets_openais_events(live, partial_images):
    """``client.images.edit(stream=True)`` as OpenAI's docs write it, on a server whose text model rewrites the
    prompt: the SDK's own headers pick OpenAI's dialect, with or without ``partial_images``."""
    extra = {} if partial_images is None else {"partial_images": partial_images}
    picture = png_bytes(np.full((64, 64, 3), 90, np.uint8))
    events = list(
        sdk(live).images.edit(image=("in.png", picture, "image/png"), prompt="make it snowy", stream=True, **extra)
    )
    kinds = [e.type for e in events]
    assert kinds[-1] == "image_edit.completed" and "image_edit.text_delta" in kinds, kinds
    assert decode_b64_image(events[-1].b64_json).size == (64, 64)
    assert kinds.count("image_edit.partial_image") == (partial_images or 0)


def test_a_client_without_the_sdk_headers_gets_vllm_omnis_events(live):
    """vLLM-Omni's client (plain HTTP, no ``stream_format``) keeps its dialect on the same server."""
    picture = png_bytes(np.full((64, 64, 3), 90, np.uint8))
    files, data = {"image": ("in.png", picture, "image/png")}, {"prompt": "make it snowy", "stream": "true"}
    with httpx.stream("POST", f"{live.url}/v1/images/edits", files=files, data=data, timeout=60) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    kinds = [json.loads(line[6:])["type"] for line in lines[:-1]]
    assert kinds[0] == "ar_delta" and kinds[-1] == "image", kinds


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_the_rewritten_prompt_fits_the_image_models_text_encoder_and_usage_says_so(live):
    """The tiny text model babbles past CLIP's 77 tokens: the rewrite stops at the encoder's limit (in CLIP's own
    tokens), the text the client sees is the prompt the encoder reads whole, and usage names the bound."""
    family = live.engine.models.get(ModelKind.IMAGE)
    tokenizer = family.pipe.tokenizer
    records = Records()
    logging.getLogger("transformers").addHandler(records)
    try:
        picture = png_bytes(np.full((64, 64, 3), 90, np.uint8))
        # seeded: the rewrite samples, and an unseeded one may end (EOS) before the encoder's limit, as one in CI did
        edit = sdk(live).images.edit
        events = list(
            edit(image=("in.png", picture, "image/png"), prompt="make it snowy", stream=True, extra_body={"seed": 1})
        )
    finally:
        logging.getLogger("transformers").removeHandler(records)
    prompt = "".join(e.delta for e in events if e.type == "image_edit.text_delta")
    used = len(tokenizer(prompt).input_ids)
    assert 0 < used <= tokenizer.model_max_length == 77
    bound = events[-1].usage.model_extra["image_prompt"]
    assert bound == {"tokens": used, "max_tokens": 77, "rewrite_stopped": True}, bound
    assert not [m for m in records.messages if "sequence length is longer" in m], records.messages
    text_model = live.engine.models.get(ModelKind.TEXT)
    wait_until(lambda: not any(text_model.scheduler.live().values()), what="the stopped rewrite to be released")


def test_the_no_argument_server_transcribes_a_file_with_the_sdk(live):
    """The embedded tiny Whisper behind OpenAI's transcription route, as a new user calls it."""
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)
    model = live.engine.models.get(ModelKind.TRANSCRIPTION).info.model_name
    assert model in [m.id for m in client.models.list().data]
    samples = (np.random.default_rng(0).standard_normal(16000) * 3000).astype("<i2")
    header = struct.pack("<4sI4s4sIHHIIHH4sI", b"RIFF", 36 + 2 * samples.size, b"WAVE", b"fmt ", 16, 1, 1, 16000,
                         32000, 2, 16, b"data", 2 * samples.size)  # fmt: skip
    reply = client.audio.transcriptions.create(model=model, file=("one.wav", header + samples.tobytes()))
    assert reply.text and reply.usage.input_token_details.audio_tokens == 50
