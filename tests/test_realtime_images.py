"""``input_image`` content in realtime conversation items (OpenAI GA's shape), in the protocol core without a
server: parsed, decoded (real PNG and JPEG pictures), checked against the frame limits and whether the text model
sees, kept in the item and handed to the text model as its message's images."""

from __future__ import annotations

import base64
import io
import itertools
import json

import numpy as np
import pytest
from PIL import Image

from omni_stream.realtime.agent.events import RealtimeError, parse_client_event
from omni_stream.realtime.agent.outputs import Capabilities, Limits, Outputs, StartResponse
from omni_stream.realtime.agent.protocol import RealtimeProtocol
from omni_stream.requests import Role
from omni_stream.vision.limits import FrameLimits

SEES = Capabilities(model="vl", text=True, sees=True)
BLIND = Capabilities(model="lm", text=True, sees=False)


def make(caps: Capabilities = SEES, limits: Limits | None = None) -> RealtimeProtocol:
    counter = itertools.count(1)
    proto = RealtimeProtocol(caps, limits, ids=lambda p: f"{p}_{next(counter)}")
    proto.start()
    send(proto, type="session.update", session={"type": "realtime", "output_modalities": ["text"],
                                                "audio": {"input": {"turn_detection": None}}})  # fmt: skip
    return proto


def send(proto: RealtimeProtocol, **event) -> Outputs:
    try:
        parsed = parse_client_event(json.dumps(event))
    except RealtimeError as exc:
        return proto.refuse(exc)
    return proto.receive(parsed)


def data_url(pixels: np.ndarray, fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def noise(w: int = 40, h: int = 30, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def image_item(*parts: dict) -> dict:
    return {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": list(parts)}}


def error_of(out: Outputs) -> dict:
    assert [e.type for e in out.events] == ["error"], [e.type for e in out.events]
    return out.events[0].body["error"]


def test_an_image_item_is_kept_and_reaches_the_text_model() -> None:
    proto = make()
    pixels = noise()
    out = send(proto, **image_item({"type": "input_image", "image_url": data_url(pixels)},
                                   {"type": "input_text", "text": "What is this?"}))  # fmt: skip
    added = [e for e in out.events if e.type == "conversation.item.added"]
    assert added and added[0].body["item"]["content"] == [
        {"type": "input_image", "image_url": None, "detail": "auto"},  # not echoed back
        {"type": "input_text", "text": "What is this?"},
    ]
    item = proto.conversation.items[-1]
    assert np.array_equal(item.content[0].image, pixels)  # PNG: the very pixels
    out = send(proto, type="response.create")
    (start,) = [c for c in out.commands if isinstance(c, StartResponse)]
    user = start.messages[-1]
    assert user.role is Role.USER and user.content == "What is this?"
    assert len(user.images) == 1 and np.array_equal(user.images[0], pixels)


def test_an_image_alone_and_several_images() -> None:
    proto = make()
    send(proto, **image_item({"type": "input_image", "image_url": data_url(noise(seed=1), "JPEG")}))
    send(proto, **image_item(*({"type": "input_image", "image_url": data_url(noise(seed=s)), "detail": "low"}
                               for s in (2, 3))))  # fmt: skip
    out = send(proto, type="response.create")
    (start,) = [c for c in out.commands if isinstance(c, StartResponse)]
    users = [m for m in start.messages if m.role is Role.USER]
    assert [(m.content, len(m.images)) for m in users] == [("", 1), ("", 2)]
    assert users[0].images[0].shape == (30, 40, 3)


def test_resolution_cap_scales_pictures_down() -> None:
    proto = make(limits=Limits(frames=FrameLimits(max_side=20)))
    send(proto, **image_item({"type": "input_image", "image_url": data_url(noise(80, 40))}))
    assert proto.conversation.items[-1].content[0].image.shape == (10, 20, 3)


@pytest.mark.parametrize(
    ("part", "words"),
    [
        ({"type": "input_image", "image_url": "https://example.com/cat.png"}, "data: URL"),
        ({"type": "input_image"}, "data: URL"),
        ({"type": "input_image", "image_url": "data:image/png;base64," + base64.b64encode(b"hello").decode()},
         "not a JPEG, PNG or WebP image"),
        ({"type": "input_image", "image_url": "data:image/png;base64,@@@"}, "not valid base64"),
    ],
)  # fmt: skip
def test_not_an_image_names_the_field(part: dict, words: str) -> None:
    proto = make()
    error = error_of(send(proto, **image_item({"type": "input_text", "text": "look"}, part)))
    assert error["code"] == "invalid_value" and error["param"] == "item.content[1].image_url"
    assert words in error["message"]
    assert len(proto.conversation) == 0  # nothing half-added


def test_too_large_names_the_field() -> None:
    proto = make(limits=Limits(frames=FrameLimits(max_bytes=500, max_pixels=50 * 50)))
    error = error_of(send(proto, **image_item({"type": "input_image", "image_url": data_url(noise(30, 30))})))
    assert error["param"] == "item.content[0].image_url" and "larger than 500 bytes" in error["message"]
    flat = np.zeros((60, 60, 3), np.uint8)  # a small file, 3600 pixels
    error = error_of(send(proto, **image_item({"type": "input_image", "image_url": data_url(flat)})))
    assert error["param"] == "item.content[0].image_url" and "60x60" in error["message"]
    error = error_of(send(proto, **image_item({"type": "input_image", "image_url": data_url(flat), "detail": "max"})))
    assert error["param"] == "item.content[0].detail"


def test_a_text_model_that_does_not_see_is_a_clear_error() -> None:
    proto = make(BLIND)
    error = error_of(send(proto, **image_item({"type": "input_image", "image_url": data_url(noise())})))
    assert error["code"] == "invalid_value" and error["param"] == "item.content[0].image_url"
    assert "does not take images" in error["message"] and "'lm'" in error["message"]
    assert len(proto.conversation) == 0


def test_only_user_items_show_images() -> None:
    proto = make()
    item = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "input_image", "image_url": data_url(noise())}],
    }
    error = error_of(send(proto, type="conversation.item.create", item=item))
    assert error["param"] == "item.content[0].type"


def test_a_response_input_takes_images_by_reference_only() -> None:
    proto = make()
    part = {"type": "input_image", "image_url": data_url(noise())}
    inline = {"type": "message", "role": "user", "content": [part]}
    error = error_of(send(proto, type="response.create", response={"conversation": "none", "input": [inline]}))
    assert error["param"] == "response.input[0].content[0].type" and "item_reference" in error["message"]
    send(proto, **image_item(part, {"type": "input_text", "text": "this one"}))
    item_id = proto.conversation.items[-1].id
    ref = {"type": "item_reference", "id": item_id}
    out = send(proto, type="response.create", response={"conversation": "none", "input": [ref]})
    (start,) = [c for c in out.commands if isinstance(c, StartResponse)]
    assert [(m.content, len(m.images)) for m in start.messages if m.role is Role.USER] == [("this one", 1)]


def test_the_conversation_keeps_a_bounded_number_of_pictures() -> None:
    proto = make(limits=Limits(frames=FrameLimits(max_conversation_pictures=3)))
    send(proto, **image_item({"type": "input_text", "text": "words"}))
    ids = []
    for seed in range(4):
        two = [{"type": "input_image", "image_url": data_url(noise(seed=s))} for s in (seed, seed + 10)]
        out = send(proto, **image_item(*two))
        ids.append(proto.conversation.items[-1].id)
        deleted = [e.body["item_id"] for e in out.events if e.type == "conversation.item.deleted"]
        # two pictures an item: each new item makes the one before it leave (the text item stays)
        assert deleted == ([] if seed == 0 else [ids[seed - 1]])
    assert [len(i.content) for i in proto.conversation.items] == [1, 2]
    error = error_of(send(proto, **image_item(*({"type": "input_image", "image_url": data_url(noise(seed=s))}
                                                for s in range(4)))))  # fmt: skip
    assert error["param"] == "item.content" and "at most 3 pictures" in error["message"]
