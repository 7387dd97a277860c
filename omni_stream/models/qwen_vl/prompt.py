"""A request's prompt as the runner takes it: ids with each image's pads expanded, the images' patches and the
multimodal positions (blocking: tokenization and image preprocessing run on the loop's preparation threads)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from omni_stream.errors import InvalidRequestError
from omni_stream.models.causal_lm.tokenizer import ChatTokenizer
from omni_stream.models.qwen_vl.config import ImageSpec, QwenVLConfig
from omni_stream.models.qwen_vl.vision import PreparedImage, expand_image_pads, prepare_image, rope_positions
from omni_stream.requests import TextRequest
from omni_stream.validation.text import prompt_field


@dataclass(slots=True, frozen=True)
class VLPrompt:
    """``ids`` with each image's pad repeated per merged patch, the ``images`` in prompt order, ``positions``
    ``[3, n]`` (None: text only, positions 0..n-1) and the decode positions' ``rope_delta``."""

    ids: tuple[int, ...]
    images: tuple[PreparedImage, ...]
    positions: np.ndarray | None
    rope_delta: int


def encode_prompt(tokenizer: ChatTokenizer, config: QwenVLConfig, spec: ImageSpec, request: TextRequest) -> VLPrompt:
    """The chat template's ids of ``request``, its user turns' images prepared (errors name ``messages``)."""
    ids = tokenizer.encode(request)
    images = tuple(prepare_image(image, spec) for m in request.messages for image in m.images)
    if not images:
        if config.image_token_id in ids:
            raise InvalidRequestError("the prompt holds image tokens but no images", prompt_field(request))
        return VLPrompt(tuple(ids), (), None, 0)
    ids = expand_image_pads(ids, config.image_token_id, [im.tokens for im in images])
    positions, delta = rope_positions(ids, config.image_token_id, [im.grid for im in images], spec.merge_size)
    return VLPrompt(tuple(ids), images, positions, delta)
