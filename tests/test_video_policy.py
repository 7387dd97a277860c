"""Video requests and the prompt-steering policy (pure: no model)."""

from __future__ import annotations

import numpy as np
import pytest

from omni_stream.errors import InvalidRequestError
from omni_stream.family import ModelKind
from omni_stream.video.spec import (
    MAX_MIX_TERMS,
    PromptSchedule,
    PromptSteering,
    PromptUpdate,
    VideoInfo,
    VideoRequest,
    blend,
    chunk_count,
    resolve_request,
)

INFO = VideoInfo(
    "tiny", "HeliosPipeline", ModelKind.VIDEO, frames_per_chunk=33,
    default_width=64, default_height=32, max_width=256, max_height=256,
    max_num_frames=264, default_num_frames=66, default_steps=2, default_guidance=1.0,
)  # fmt: skip


def test_chunk_count_covers_every_frame():
    assert [chunk_count(n, 33) for n in (1, 32, 33, 34, 66, 99, 100)] == [1, 1, 1, 2, 2, 3, 4]


def test_resolve_fills_the_model_defaults():
    r = resolve_request(INFO, VideoRequest("a cat"))
    assert (r.width, r.height, r.fps, r.num_frames, r.num_inference_steps, r.guidance_scale) == (64, 32, 16, 66, 2, 1.0)
    r = resolve_request(INFO, VideoRequest("a cat", width=128, num_frames=5, guidance_scale=0))
    assert (r.width, r.num_frames, r.guidance_scale) == (128, 5, 0.0)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"width": 60}, "width"),  # not a multiple of 16
        ({"height": 272}, "height"),  # above the maximum
        ({"fps": 61}, "fps"),
        ({"num_frames": 265}, "num_frames"),
        ({"num_inference_steps": 101}, "num_inference_steps"),
    ],
)
def test_resolve_refuses_values_the_model_cannot_serve(fields, param):
    with pytest.raises(InvalidRequestError) as info:
        resolve_request(INFO, VideoRequest("a cat", **fields))
    assert info.value.param == param


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": " "}, "prompt"),
        ({"width": 0}, "width"),
        ({"fps": -1}, "fps"),
        ({"num_frames": 1.5}, "num_frames"),
        ({"num_inference_steps": True}, "num_inference_steps"),
        ({"guidance_scale": float("nan")}, "guidance_scale"),
        ({"image": np.zeros((4, 4), np.uint8)}, "image_reference"),
    ],
)
def test_request_fields_are_checked_when_built(fields, param):
    with pytest.raises(InvalidRequestError) as info:
        VideoRequest(**{"prompt": "a cat", **fields})
    assert info.value.param == param


def test_steering_is_bounded_and_closes():
    steering = PromptSteering(capacity=2)
    assert steering.offer(PromptUpdate("a", "x")) and steering.offer(PromptUpdate("b", "y"))
    assert not steering.offer(PromptUpdate("c", "z"))  # full: refused, not dropped silently
    assert [u.event_id for u in steering.take()] == ["a", "b"] and len(steering) == 0
    steering.close()
    assert not steering.offer(PromptUpdate("d", "w"))


def test_a_hard_update_applies_to_the_next_chunk_only_from_then_on():
    schedule = PromptSchedule("cat")
    first = schedule.next_chunk()
    assert first.mix == (("cat", 1.0),) and not (first.started or first.active or first.completed)
    second = schedule.next_chunk([PromptUpdate("e1", "dog")])
    assert second.mix == (("dog", 1.0),)
    assert (second.started, second.active, second.completed) == (("e1",), ("e1",), ("e1",))
    third = schedule.next_chunk()
    assert third.mix == (("dog", 1.0),) and not (third.started or third.active or third.completed)


def test_a_transition_blends_linearly_and_reaches_the_target_in_its_last_chunk():
    schedule = PromptSchedule("cat")
    chunks = [schedule.next_chunk([PromptUpdate("e1", "dog", transition_chunks=3)])]
    chunks += [schedule.next_chunk(), schedule.next_chunk(), schedule.next_chunk()]
    weights = [dict(c.mix).get("dog") for c in chunks]
    assert weights[:3] == pytest.approx([1 / 3, 2 / 3, 1.0]) and weights[3] == 1.0
    assert dict(chunks[0].mix)["cat"] == pytest.approx(2 / 3)
    assert [c.started for c in chunks] == [("e1",), (), (), ()]
    assert [c.active for c in chunks] == [("e1",), ("e1",), ("e1",), ()]
    assert [c.completed for c in chunks] == [(), (), ("e1",), ()]


def test_a_newer_update_supersedes_and_starts_from_the_blend_reached():
    schedule = PromptSchedule("cat")
    schedule.next_chunk([PromptUpdate("e1", "dog", transition_chunks=2)])  # cat 1/2, dog 1/2
    c = schedule.next_chunk([PromptUpdate("e2", "owl"), PromptUpdate("e3", "fox", transition_chunks=2)])
    assert c.started == ("e3",) and set(c.completed) == {"e1", "e2"}
    mix = dict(c.mix)
    assert mix == pytest.approx({"cat": 0.25, "dog": 0.25, "fox": 0.5}) and c.prompt == "fox"
    assert schedule.next_chunk().mix == (("fox", 1.0),)


def test_blends_stay_small_and_sum_to_one():
    mix = (("p0", 1.0),)
    for i in range(1, 20):
        mix = blend(mix, f"p{i}", 0.1)
    assert len(mix) <= MAX_MIX_TERMS and sum(w for _, w in mix) == pytest.approx(1.0)
    assert mix[-1][0] == "p19"
