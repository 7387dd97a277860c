"""POST /v1/images/edits and /v1/images/generations on a real server: the unchanged openai SDK, httpx on the
vLLM-Omni dialect, in-band errors, a client leaving mid-denoise, random aborts, and every bad input a 400.

The edit server puts the tiny Qwen3 chat model (random weights: it rewrites the prompt into babble, bounded by what
the image model's text encoder reads) before InstructPix2Pix-tiny, so the checks are on the stream's shape and on
the rewrite's deltas joining to the revised prompt; the engine tests of ``test_image_engine.py`` check that the
diffusion paints from the rewritten prompt, with the synthetic echo LM (an exact rewrite)."""

from __future__ import annotations

import base64
import io
import json
import threading
import time

import httpx
import numpy as np
import openai
import pytest
from image_helpers import (
    call_hooks,
    calls_of,
    decode_b64_image,
    load_engine,
    picture,
    png_bytes,
)
from serving_helpers import running_server
from starlette.requests import Request
from tiny_models import tiny_lm

from omni_stream.family import ModelKind
from omni_stream.realtime.common.body_limit import BodyTooLarge
from omni_stream.realtime.common.form_stream import FormLimits, read_form

pytest_plugins = ("image_fixtures",)

MODEL = "instruct-pix2pix-tiny"
PNG = png_bytes(picture())


@pytest.fixture(scope="module")
def ar_server(pix2pix_checkpoint):
    """The tiny Qwen3 chat model in front of InstructPix2Pix-tiny (the AR + diffusion pipeline)."""

    async def load():
        return await load_engine(pix2pix_checkpoint, tiny_lm())

    with running_server(None, load=load) as live:
        yield live


@pytest.fixture(scope="module")
def plain_server(sd_checkpoint):
    """Stable-Diffusion-tiny alone: text to image and img2img edits, no AR stage."""

    async def load():
        return await load_engine(sd_checkpoint)

    with running_server(None, load=load) as live:
        yield live


def image_family(live):
    return live.engine.models.get(ModelKind.IMAGE)


def wait_clean(live, timeout: float = 10.0) -> None:
    """Until no image job, pipeline row or text sequence is held."""
    family = image_family(live)
    text = live.engine.models.text() if ModelKind.TEXT in live.engine.models else None
    deadline = time.monotonic() + timeout
    while any(family.live().values()) or (text is not None and any(text.scheduler.live().values())):
        assert time.monotonic() < deadline, family.live()
        time.sleep(0.01)


def sse_events(lines):
    """(event name or None, data) of each SSE event; ``[DONE]`` as the string."""
    events, name = [], None
    for line in lines:
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            payload = line[len("data: ") :]
            events.append((name, payload if payload == "[DONE]" else json.loads(payload)))
            name = None
        else:
            assert line == "", line
    return events


def client(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)


# --- the openai SDK -------------------------------------------------------------------------------------------


def test_the_openai_sdk_streams_text_deltas_then_two_previews_then_the_image(ar_server):
    stream = client(ar_server).images.edit(
        model=MODEL,
        image=("in.png", PNG, "image/png"),
        prompt="make it snowy",
        stream=True,
        partial_images=2,
        size="64x48",
    )
    events = list(stream)
    types = [e.type for e in events]
    n_text = types.count("image_edit.text_delta")
    assert types == ["image_edit.text_delta"] * n_text + ["image_edit.partial_image"] * 2 + ["image_edit.completed"]
    assert n_text >= 1 and "".join(e.delta for e in events[:n_text]).strip()  # the rewrite streamed first
    assert [e.partial_image_index for e in events[n_text:-1]] == [0, 1]
    done = events[-1]
    assert decode_b64_image(done.b64_json).size == (64, 48) and done.size == "64x48" and done.output_format == "png"
    assert done.usage.output_tokens > 0 and done.usage.input_tokens_details.image_tokens == 8 * 6
    for event in events[n_text:]:
        assert decode_b64_image(event.b64_json).size == (64, 48)
    wait_clean(ar_server)


def test_the_openai_sdk_without_stream_gets_one_decodable_image(ar_server):
    result = client(ar_server).images.edit(model=MODEL, image=("in.png", PNG, "image/png"), prompt="make it snowy")
    assert len(result.data) == 1 and result.data[0].revised_prompt.strip()  # what the text model wrote
    assert decode_b64_image(result.data[0].b64_json).size == (64, 64)
    assert result.usage.total_tokens == result.usage.input_tokens + result.usage.output_tokens > 0
    jpeg = client(ar_server).images.edit(
        model=MODEL, image=("in.png", PNG, "image/png"), prompt="x", output_format="jpeg", n=2
    )
    assert [decode_b64_image(d.b64_json).format for d in jpeg.data] == ["JPEG", "JPEG"]


# --- vLLM-Omni's dialect --------------------------------------------------------------------------------------


def post_stream(live, data, files=None):
    files = files or {"image": ("in.png", PNG, "image/png")}
    with httpx.stream("POST", f"{live.url}/v1/images/edits", files=files, data=data, timeout=30) as response:
        return response.status_code, response.headers.get("content-type", ""), list(response.iter_lines())


def test_the_vllm_dialect_streams_ar_deltas_one_image_then_done(ar_server):
    status, content_type, lines = post_stream(ar_server, {"prompt": "make it snowy", "stream": "true"})
    assert status == 200 and content_type.startswith("text/event-stream")
    assert not [line for line in lines if line.startswith("event:")]  # data: lines only
    events = sse_events(lines)
    assert all(name is None for name, _ in events)
    datas = [d for _, d in events]
    assert datas[-1] == "[DONE]" and datas.count("[DONE]") == 1
    kinds = [d["type"] for d in datas[:-1]]
    n = kinds.count("ar_delta")
    assert n >= 2 and kinds == ["ar_delta"] * n + ["image"]
    for delta in datas[:n]:
        assert set(delta) == {"object", "type", "delta", "index", "created", "model"}
        assert delta["object"] == "image.edit.chunk" and delta["index"] == 0 and delta["model"] == MODEL
    assert "".join(d["delta"] for d in datas[:n]).strip()  # the rewrite, streamed before the image
    image = datas[n]
    assert set(image) == {"object", "type", "data", "output_format", "size", "created", "model"}
    assert [set(item) for item in image["data"]] == [{"b64_json", "url", "revised_prompt"}]
    assert decode_b64_image(image["data"][0]["b64_json"]).size == (64, 64) and image["size"] == "64x64"
    text = "\n".join(lines)
    assert "token" not in text.replace("b64_json", "")  # no token ids, ratio tokens or KV data anywhere


def test_rewrite_false_skips_the_text_model(ar_server):
    """The extension field ``rewrite=false``: the diffusion paints the prompt as sent, no text events stream."""
    _, _, lines = post_stream(ar_server, {"prompt": "make it snowy", "stream": "true", "rewrite": "false",
                                         "partial_images": "0"})  # fmt: skip
    names = [name for name, _ in sse_events(lines)]
    assert names == ["image_edit.completed"], names
    refused = httpx.post(f"{ar_server.url}/v1/images/edits", files={"image": IMG},
                         data={"prompt": "x", "rewrite": "perhaps"})  # fmt: skip
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "rewrite"


def test_the_vllm_dialect_carries_previews_when_asked(ar_server):
    data = {"prompt": "x", "stream": "true", "stream_format": "vllm", "partial_images": "2"}
    _, _, lines = post_stream(ar_server, data)
    kinds = [d if d == "[DONE]" else d["type"] for _, d in sse_events(lines)]
    n = kinds.count("ar_delta")
    assert kinds == ["ar_delta"] * n + ["partial_image", "partial_image", "image", "[DONE]"]


def test_a_diffusion_failure_after_the_first_delta_is_an_error_event_then_done(ar_server, monkeypatch):
    def broken(rows, shape, callback):
        raise RuntimeError("the denoiser broke")

    monkeypatch.setattr(image_family(ar_server).adapter, "call", broken)
    status, _, lines = post_stream(ar_server, {"prompt": "make it snowy", "stream": "true"})
    datas = [d for _, d in sse_events(lines)]
    assert status == 200 and datas[0]["type"] == "ar_delta"
    error, done = datas[-2:]
    assert done == "[DONE]" and [d for d in datas if d == "[DONE]"] == ["[DONE]"]
    assert error["object"] == "error" and error["model"] == MODEL and isinstance(error["created"], int)
    assert error["error"]["type"] == "server_error" and error["error"]["code"] == 500
    assert "the denoiser broke" in error["error"]["message"]
    assert all(d["type"] == "ar_delta" for d in datas[:-2])
    wait_clean(ar_server)


def test_without_an_ar_stage_vllm_streaming_is_a_400_and_openai_streaming_works(plain_server):
    status, _, lines = post_stream(plain_server, {"prompt": "x", "stream": "true", "stream_format": "vllm"})
    assert status == 400 and json.loads(lines[0])["error"]["param"] == "stream_format"
    status, _, lines = post_stream(plain_server, {"prompt": "x", "stream": "true"})  # default: OpenAI's
    assert status == 200 and [name for name, _ in sse_events(lines)] == ["image_edit.completed"]


def test_generations_stream_through_the_sdk(plain_server):
    events = list(
        client(plain_server).images.generate(
            model="stable-diffusion-tiny", prompt="a cat", stream=True, partial_images=1, size="64x32"
        )
    )
    assert [e.type for e in events] == ["image_generation.partial_image", "image_generation.completed"]
    assert decode_b64_image(events[-1].b64_json).size == (64, 32)
    status, _, _ = post_stream(plain_server, {"prompt": "x", "stream": "true"})  # edits on SD: img2img
    assert status == 200


# --- cancellation ---------------------------------------------------------------------------------------------


def test_a_client_that_leaves_mid_denoise_is_not_stepped_again(ar_server):
    family = image_family(ar_server)
    victim: list[str] = []

    def inside_step(module, args):  # a second step that starts before the release: held until the server releases
        labels = family.runner.model.current_call()
        if labels and calls_of(family, labels[0]) == 2 and not victim:
            victim.extend(labels)
            deadline = time.monotonic() + 10
            while family.scheduler.live()["sessions"]:
                assert time.monotonic() < deadline
                time.sleep(0.005)

    hook = family.pipe.unet.down_blocks[0].register_forward_pre_hook(inside_step)
    try:
        data = {"prompt": "x", "stream": "true", "partial_images": "3", "num_inference_steps": "8"}
        files = {"image": ("in.png", PNG, "image/png")}
        with httpx.stream("POST", f"{ar_server.url}/v1/images/edits", files=files, data=data) as response:
            for line in response.iter_lines():
                if "image_edit.partial_image" in line:
                    break  # the first preview (after step 1): leave
        wait_clean(ar_server)
    finally:
        hook.remove()
    released = [e for e in family.runner.log.events() if e.kind == "release"]
    request_id = released[-1].labels[0]
    kinds = [e.kind for e in family.runner.log.of(request_id)]
    # of 8 steps: the one before the preview it saw, the one in progress when it left (if any), no further one
    started = ["join", "text", "text", "encode"]  # its prompt (and the negative one) and its input, as it starts
    assert kinds in ([*started, "denoise", "release"], [*started, *["denoise"] * 2, "release"])
    assert victim in ([], [request_id])


def test_random_client_aborts_leave_no_state(ar_server):
    rng = np.random.default_rng(1)
    for _ in range(8):
        read = int(rng.integers(0, 9))
        data = {"prompt": "make it snowy", "stream": "true", "partial_images": str(rng.integers(0, 4))}
        with httpx.stream(
            "POST", f"{ar_server.url}/v1/images/edits", files={"image": ("a.png", PNG, "image/png")}, data=data
        ) as response:
            for i, _ in enumerate(response.iter_lines()):
                if i >= read:
                    break
    wait_clean(ar_server)


# --- bad input ------------------------------------------------------------------------------------------------


def _rgba(pixels_alpha: int, size=(64, 64)) -> bytes:
    from PIL import Image

    image = Image.new("RGBA", size, (10, 20, 30, pixels_alpha))
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def _big_png(side: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (side, side)).save(buf, "PNG")
    return buf.getvalue()


IMG = ("in.png", PNG, "image/png")
BAD = [
    ({"image": ("x.png", b"not an image at all", "image/png")}, {"prompt": "x"}, "image"),
    ({"image": ("x.gif", base64.b64decode("R0lGODlhAQABAAAAACw="), "image/gif")}, {"prompt": "x"}, "image"),
    ({"image": ("big.png", _big_png(4100), "image/png")}, {"prompt": "x"}, "image"),  # over the pixel limit
    ({"image": IMG}, {"prompt": "x", "size": "64x"}, "size"),
    ({"image": IMG}, {"prompt": "x", "size": "60x64"}, "size"),  # not a multiple of 8
    ({"image": IMG}, {"prompt": "x", "size": "4096x4096"}, "size"),  # over the model's largest side
    ({"image": IMG}, {"prompt": "x", "n": "0"}, "n"),
    ({"image": IMG}, {"prompt": "x", "n": "5"}, "n"),
    ({"image": IMG}, {"prompt": "x", "output_format": "gif"}, "output_format"),
    ({"image": IMG}, {"size": "64x64"}, "prompt"),
    ({"image": IMG}, {"prompt": "   "}, "prompt"),
    ({"mask": ("m.png", _rgba(0), "image/png")}, {"prompt": "x"}, "image"),  # no image to edit
    ({"image": IMG}, {"prompt": "x", "response_format": "url"}, "response_format"),
    ({"image": IMG}, {"prompt": "x", "partial_images": "4", "stream": "true"}, "partial_images"),
    ({"image": IMG}, {"prompt": "x", "stream": "maybe"}, "stream"),
    ({"image": IMG}, {"prompt": "x", "num_inference_steps": "100000"}, "num_inference_steps"),
    ({"image": IMG}, {"prompt": "x", "colour": "red"}, "colour"),
    ({"image": IMG, "mask": ("m.png", PNG, "image/png")}, {"prompt": "x"}, "mask"),  # no alpha
    ({"image": IMG, "mask": ("m.png", _rgba(0, (32, 32)), "image/png")}, {"prompt": "x"}, "mask"),  # wrong size
]


@pytest.mark.parametrize(("files", "data", "param"), BAD, ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD)])
def test_bad_input_is_a_400_naming_the_field(ar_server, files, data, param):
    response = httpx.post(f"{ar_server.url}/v1/images/edits", files=files, data=data)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400 and error["param"] == param, error
    assert not any(image_family(ar_server).live().values())


def test_size_and_file_messages_say_what_is_wrong(ar_server):
    """A size out of range gets the model's range (whatever its digits or multiple), a zero side its own message,
    and a text part named ``image`` is told to be a file rather than called unknown."""
    url = f"{ar_server.url}/v1/images/edits"
    for size in ("100000x100000", "9999x9999", "4096x4096"):
        message = httpx.post(url, files={"image": IMG}, data={"prompt": "x", "size": size}).json()["error"]["message"]
        assert "each side must be between" in message, (size, message)
    zero = httpx.post(url, files={"image": IMG}, data={"prompt": "x", "size": "0x64"}).json()["error"]
    assert zero["param"] == "size" and "above 0" in zero["message"], zero
    text = httpx.post(url, files={"mask": ("m.png", _rgba(0), "image/png")}, data={"prompt": "x", "image": "a.png"})
    error = text.json()["error"]
    assert text.status_code == 400 and error["param"] == "image" and "uploaded file" in error["message"], error


def test_more_bad_input(ar_server, plain_server):
    url = f"{ar_server.url}/v1/images"
    assert httpx.post(f"{url}/edits", json={"prompt": "x"}).status_code == 400  # not multipart
    unknown = httpx.post(f"{url}/edits", files={"image": IMG}, data={"prompt": "x", "model": "dall-e-2"})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    generation = httpx.post(f"{url}/generations", json={"prompt": "a cat"})  # an edit-only model
    assert generation.status_code == 400 and generation.json()["error"]["param"] == "image"
    for body in (b"{", b"[1]", json.dumps({"prompt": "x", "n": "two"}).encode()):
        assert httpx.post(f"{plain_server.url}/v1/images/generations", content=body).status_code == 400
    # JSON values are of their own types (a form's strings are read as numbers, a JSON body's are not)
    for body, param in (
        ({"prompt": 5}, "prompt"),
        ({"prompt": "x", "n": "2"}, "n"),
        ({"prompt": "x", "seed": "7"}, "seed"),
    ):
        refused = httpx.post(f"{plain_server.url}/v1/images/generations", json=body)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param, refused.text
    multipart = httpx.post(f"{plain_server.url}/v1/images/generations", files={"image": IMG}, data={"prompt": "x"})
    assert multipart.status_code == 400 and "JSON body" in multipart.json()["error"]["message"]
    # img2img denoises 80 % of the steps asked: one step would be none (it failed inside diffusers with a 500)
    one = httpx.post(f"{plain_server.url}/v1/images/edits", files={"image": IMG},
                     data={"prompt": "x", "num_inference_steps": "1", "size": "64x64"})  # fmt: skip
    assert one.status_code == 400 and one.json()["error"]["param"] == "num_inference_steps", one.text
    assert "at least 2" in one.json()["error"]["message"]
    two = httpx.post(f"{plain_server.url}/v1/images/edits", files={"image": IMG},
                     data={"prompt": "x", "num_inference_steps": "2", "size": "64x64"}, timeout=120)  # fmt: skip
    assert two.status_code == 200 and two.json()["data"][0]["b64_json"], two.text
    # a prompt longer than the rewriting text model's context is blamed on the field the client sent: prompt
    long = httpx.post(f"{ar_server.url}/v1/images/edits", files={"image": IMG}, data={"prompt": "snow " * 6000})
    assert long.status_code == 400 and long.json()["error"]["param"] == "prompt", long.text
    assert "does not fit the context" in long.json()["error"]["message"]
    # OpenAI's options for its own service are checked, then ignored; those for outputs made nowhere here are refused
    generate = f"{plain_server.url}/v1/images/generations"
    base = {"prompt": "a cat", "size": "64x64", "num_inference_steps": 2}
    for extra in (
        {"moderation": "low", "style": "natural", "user": "u1", "safety_identifier": "s"},
        {"moderation": None, "user": None, "svg": None, "frame_count": None},  # null: the SDK's unset option
    ):
        served = httpx.post(generate, json={**base, **extra}, timeout=120)
        assert served.status_code == 200 and served.json()["data"][0]["b64_json"], served.text
    for extra, param in (({"moderation": "none"}, "moderation"), ({"style": 3}, "style"), ({"svg": True}, "svg"),
                         ({"frame_count": 4}, "frame_count")):  # fmt: skip
        refused = httpx.post(generate, json={**base, **extra})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param, refused.text
    assert "does not support" in httpx.post(generate, json={**base, "svg": True}).json()["error"]["message"]
    wait_clean(ar_server)
    wait_clean(plain_server)


def test_a_20_mb_upload_is_refused(ar_server):
    blob = b"\x89PNG" + bytes(20 * 1024 * 1024)

    def chunks():  # chunked transfer: no Content-Length to refuse it by
        boundary = b"b0undary"
        yield b"--" + boundary + b'\r\nContent-Disposition: form-data; name="prompt"\r\n\r\nx\r\n'
        yield b"--" + boundary + b'\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n'
        yield b"Content-Type: image/png\r\n\r\n"
        for i in range(0, len(blob), 256 * 1024):
            yield blob[i : i + 256 * 1024]
        yield b"\r\n--" + boundary + b"--\r\n"

    headers = {"content-type": "multipart/form-data; boundary=b0undary"}
    response = httpx.post(f"{ar_server.url}/v1/images/edits", content=chunks(), headers=headers, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": "File 'image' exceeds the maximum of 10485760 bytes",
        "type": "BadRequestError",
        "param": "image",
        "code": 400,
    }


def _request(headers: dict[str, str], receive) -> Request:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
    }
    return Request(scope, receive)


async def test_the_form_reader_stops_at_the_file_limit_without_reading_on():
    limit, chunk = 1024 * 1024, 64 * 1024
    head = b'--B\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n\r\n'
    pulled = 0

    async def receive():
        nonlocal pulled
        pulled += 1
        return {"type": "http.request", "body": head if pulled == 1 else bytes(chunk), "more_body": True}

    request = _request({"content-type": "multipart/form-data; boundary=B"}, receive)
    with pytest.raises(BodyTooLarge):
        await read_form(request, FormLimits(max_file_bytes=limit, max_files=1))
    assert (pulled - 1) * chunk <= limit + chunk  # 20 MB would have been 320 chunks

    async def never():
        raise AssertionError("a body declared too large is refused before it is read")

    declared = _request({"content-type": "multipart/form-data; boundary=B", "content-length": str(20 * 2**20)}, never)
    with pytest.raises(BodyTooLarge):
        await read_form(declared, FormLimits(max_file_bytes=limit, max_files=1))


async def test_a_field_over_its_limit_in_a_body_already_read_is_answered_without_draining():
    """A field over its own limit in a body that has all arrived: nothing is left to drain, so the 400 goes at once
    (drain() would otherwise wait its whole DRAIN_SECONDS for bytes that never come); one still arriving drains."""
    field = b'--B\r\nContent-Disposition: form-data; name="prompt"\r\n\r\n' + b"x" * 2048 + b"\r\n--B--\r\n"
    for more in (False, True):

        async def receive(more=more):
            return {"type": "http.request", "body": field, "more_body": more}

        request = _request({"content-type": "multipart/form-data; boundary=B"}, receive)
        with pytest.raises(BodyTooLarge, match="Field 'prompt' exceeds the maximum of 1024 bytes") as info:
            await read_form(request, FormLimits(max_file_bytes=4096, max_files=1, max_field_bytes=1024))
        assert info.value.more is more


async def test_serve_loads_an_image_model_beside_a_text_model(pix2pix_checkpoint):
    import argparse

    from omni_stream.engine import AsyncEngine
    from omni_stream.realtime.server import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--model", str(pix2pix_checkpoint), "--llm", str(tiny_lm())])
    async with await AsyncEngine.from_pretrained(args.model, llm=args.llm, progress=False) as engine:
        assert sorted(engine.models.kinds) == [ModelKind.IMAGE, ModelKind.TEXT]


def test_the_image_models_running_and_waiting_gauges_are_on_metrics(ar_server):
    from prometheus_client.parser import text_string_to_metric_families

    family = image_family(ar_server)
    reached, go = threading.Event(), threading.Event()

    def on_call(kind, labels):  # hold the device after the request's first step: it is running
        if kind == "denoise" and not reached.is_set():
            reached.set()
            assert go.wait(10)

    def gauges() -> dict[str, float]:
        text = httpx.get(f"{ar_server.url}/metrics").text
        return {
            sample.name: sample.value
            for metric in text_string_to_metric_families(text)
            for sample in metric.samples
            if sample.labels.get("scheduler") == "image"
        }

    call_hooks(family).append(on_call)
    try:
        data = {"prompt": "x", "num_inference_steps": "3"}
        files = {"image": ("in.png", PNG, "image/png")}
        worker = threading.Thread(
            target=lambda: httpx.post(f"{ar_server.url}/v1/images/edits", files=files, data=data, timeout=60)
        )
        worker.start()
        assert reached.wait(30)
        held = gauges()
        go.set()
        worker.join(60)
    finally:
        call_hooks(family).remove(on_call)
        go.set()
    assert held["omni_stream_requests_running"] == 1.0 and held["omni_stream_requests_waiting"] == 0.0
    wait_clean(ar_server)
    assert gauges()["omni_stream_requests_running"] == 0.0
