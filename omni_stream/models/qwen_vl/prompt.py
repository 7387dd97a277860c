"""A request's prompt as the runner takes it: ids with each image's pads expanded, the images' patches and the
multimodal positions (blocking: tokenization and image preprocessing run on the loop's preparation threads).

A request whose images are exactly a frame session's frames (its stored read-only arrays, or the same pixels) takes the
session's encoded frames instead of new patches, and when its ids start with the session's ids, the session's view:
the runner then copies the session's rows and prefills only the rest (:mod:`.runner`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from omni_stream.errors import InvalidRequestError
from omni_stream.models.causal_lm.runner import Prompt
from omni_stream.models.causal_lm.tokenizer import ChatTokenizer
from omni_stream.models.qwen_vl.config import ImageSpec, QwenVLConfig
from omni_stream.models.qwen_vl.frames import EncodedFrame, SessionView
from omni_stream.models.qwen_vl.vision import (
    PreparedImage,
    expand_image_pads,
    image_prompt_tokens,
    prepare_image,
    rope_positions,
)
from omni_stream.requests import ChatMessage, Role, TextRequest
from omni_stream.validation.text import prompt_field


@dataclass(slots=True, frozen=True)
class VLPrompt(Prompt):
    """``ids`` with each image's pad repeated per merged patch, the ``images`` in prompt order, ``positions``
    ``[3, n]`` (None: text only, positions 0..n-1), the decode positions' ``rope_delta`` and the session view
    whose rows the prompt starts with (``cached``)."""

    images: tuple[PreparedImage | EncodedFrame, ...]
    positions: np.ndarray | None
    rope_delta: int
    cached: SessionView | None = None


def matching_view(images: list[np.ndarray], views: tuple[SessionView, ...]) -> SessionView | None:
    """The view of the session whose first frames are ``images``, in order, cut to those frames (a question asked
    while later frames arrived still continues the rows of the ones it shows); None: no session's."""
    for view in views:
        k = len(images)
        if 0 < k <= len(view.frames) and all(f.matches(im) for f, im in zip(view.frames, images, strict=False)):
            rows = view.length - sum(image_prompt_tokens(f.tokens) for f in view.frames[k:])
            return SessionView(view.sid, view.generation, view.ids[:rows], view.frames[:k])
    return None


def encode_prompt(
    tokenizer: ChatTokenizer,
    config: QwenVLConfig,
    spec: ImageSpec,
    request: TextRequest,
    views: tuple[SessionView, ...] = (),
) -> VLPrompt:
    """The chat template's ids of ``request``, its user turns' images prepared or found among ``views``' frames
    (errors name ``messages``)."""
    ids = tokenizer.encode(request)
    raw = [image for m in request.messages for image in m.images]
    if not raw:
        if config.image_token_id in ids:
            raise InvalidRequestError("the prompt holds image tokens but no images", prompt_field(request))
        return VLPrompt(tuple(ids), (), None, 0)
    view = matching_view(raw, views)
    images = view.frames if view is not None else tuple(prepare_image(image, spec) for image in raw)
    ids = expand_image_pads(ids, config.image_token_id, [im.tokens for im in images])
    positions, delta = rope_positions(ids, config.image_token_id, [im.grid for im in images], spec.merge_size)
    cached = view if view is not None and tuple(ids[: view.length]) == view.ids else None
    return VLPrompt(tuple(ids), images, positions, delta, cached)


def session_prefix(tokenizer: ChatTokenizer, config: QwenVLConfig, system: str | None) -> tuple[int, ...]:
    """Ids of a frame session's prompt up to its user turn's first frame: what the template renders before the
    first ``<|vision_start|>`` of a question (a special token, so the ids before it never depend on what follows)."""
    probe = np.zeros((28, 28, 3), dtype=np.uint8)  # rendered as its template part only, never prepared
    turns = (ChatMessage(Role.SYSTEM, system),) if system is not None else ()
    ids = tokenizer.encode(TextRequest(messages=(*turns, ChatMessage(Role.USER, "", images=(probe,)))))
    return tuple(ids[: ids.index(config.vision_start_token_id)])
