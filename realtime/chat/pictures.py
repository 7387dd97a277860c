"""A chat request's images: the ``image_url`` parts its fields named (:class:`~.params.PictureRef`), decoded under
the server's frame limits (JPEG, PNG or WebP; the byte and pixel caps; scaled to the resolution cap) and shown in
their user turns (``ChatMessage.images``, in the order they came). Blocking (image decodes): run it off the event
loop. A picture that is not one, or too large, is an InvalidRequestError naming its part
(``messages[i].content[j].image_url.url``)."""

from __future__ import annotations

import dataclasses

import numpy as np

from omni_stream.realtime.chat.params import PictureRef
from omni_stream.requests import ChatMessage
from omni_stream.vision.frames import decode_base64
from omni_stream.vision.limits import FrameLimits


def show(
    messages: tuple[ChatMessage, ...], pictures: tuple[PictureRef, ...], limits: FrameLimits
) -> tuple[ChatMessage, ...]:
    """``messages`` with each picture decoded into its user turn."""
    shown: dict[int, list[np.ndarray]] = {}
    for picture in pictures:
        shown.setdefault(picture.message, []).append(decode_base64(picture.payload, limits, picture.param).pixels)
    return tuple(dataclasses.replace(m, images=tuple(shown[i])) if i in shown else m for i, m in enumerate(messages))
