"""Image requests' checks that need no model: an edit's fewest steps (the model's default included), and the
rewriting text stage's refusals named by the image request's own fields."""

from __future__ import annotations

import numpy as np
import pytest

from omni_stream.context import RequestContext
from omni_stream.errors import InvalidRequestError
from omni_stream.family import ModelKind
from omni_stream.images.spec import ImageInfo, ImageMode, ImageRequest, check_request, prompt_blamed
from omni_stream.validation.text import fit_prompt

PIXELS = np.zeros((64, 64, 3), np.uint8)


def sd_info(default_steps: int = 30) -> ImageInfo:
    return ImageInfo("sd", "diffusers", ModelKind.IMAGE, modes=(ImageMode.GENERATE, ImageMode.EDIT),
                     default_steps=default_steps, min_edit_steps=2)  # fmt: skip


def test_an_edit_takes_at_least_the_models_fewest_steps_its_default_included():
    info = sd_info()
    with pytest.raises(InvalidRequestError, match="at least 2") as refused:
        check_request(info, ImageRequest("x", images=(PIXELS,), steps=1))
    assert refused.value.param == "num_inference_steps"
    assert check_request(info, ImageRequest("x", images=(PIXELS,), steps=2))
    assert check_request(info, ImageRequest("x", steps=1))  # text to image denoises every step asked
    with pytest.raises(InvalidRequestError, match=r"got 1 \(its default\)"):  # a turbo-style default of 1
        check_request(sd_info(default_steps=1), ImageRequest("x", images=(PIXELS,)))


async def _refusal(stage, request: ImageRequest) -> InvalidRequestError:
    async def nothing():
        return
        yield

    with pytest.raises(InvalidRequestError) as info:
        async for _ in prompt_blamed(stage, request)(RequestContext(), nothing()):
            pass
    return info.value


@pytest.mark.parametrize(
    ("prompt_tokens", "max_text_tokens", "param"),
    [
        (5000, 256, "prompt"),  # the prompt alone does not fit the text model's context
        (1900, 256, "prompt"),  # it fits, but leaves less than the rewrite's default room (over HTTP: its only cause)
        (100, 4000, "max_text_tokens"),  # a Python caller raised the rewrite's room past what is left
    ],
)
async def test_the_rewrites_refusals_name_the_image_requests_fields(prompt_tokens, max_text_tokens, param):
    request = ImageRequest("x", max_text_tokens=max_text_tokens)

    async def rewrite(ctx, upstream):  # what the text families' prepare does with the rewrite's request
        fit_prompt(prompt_tokens, request.max_text_tokens, 2048, "messages")
        yield None

    refused = await _refusal(rewrite, request)
    assert refused.param == param and "rewrites the image prompt" in refused.message, refused


async def test_other_refusals_of_the_rewrite_pass_unchanged():
    async def rewrite(ctx, upstream):
        raise InvalidRequestError("seed out of range", "seed")
        yield None

    refused = await _refusal(rewrite, ImageRequest("x"))
    assert (refused.param, refused.message) == ("seed", "seed out of range")
