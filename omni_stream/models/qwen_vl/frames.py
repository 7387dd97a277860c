"""What a frame session holds and publishes (plain data; the device work is the runner's, the async API the
family's :class:`~omni_stream.models.qwen_vl.session.FrameSession`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import torch


def frozen(image: np.ndarray) -> np.ndarray:
    """A read-only copy of ``image`` that nobody can make writable again (a view of a read-only base): what a
    session keeps, so a caller that reuses its buffer for the next frame changes no stored frame."""
    base = np.array(image, copy=True)
    base.flags.writeable = False
    return base.view()


def image_key(image: np.ndarray) -> bytes:
    """A digest of an image's dtype, shape and pixels (a frame sent again as another array still matches)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{image.dtype.str} {image.shape}".encode())
    h.update(np.ascontiguousarray(image).data)
    return h.digest()


@dataclass(slots=True, frozen=True, eq=False)
class EncodedFrame:
    """A frame through the vision tower: ``features`` ``[tokens, H]`` on the device, its ``grid`` (t, h, w) in
    patches, the ``image`` it came from (:func:`frozen`: never changes) and that image's :func:`image_key`."""

    image: np.ndarray = field(repr=False)
    key: bytes
    grid: tuple[int, int, int]
    features: torch.Tensor = field(repr=False)

    @property
    def tokens(self) -> int:
        return int(self.features.shape[0])

    def matches(self, image: np.ndarray) -> bool:
        """Whether ``image`` is this frame (the stored read-only array itself, or the same dtype, shape and
        pixels)."""
        if image is self.image:
            return True
        return image.shape == self.image.shape and image.dtype == self.image.dtype and image_key(image) == self.key


@dataclass(slots=True, frozen=True, eq=False)
class SessionView:
    """A session's cache as of one change: slot ``sid`` holds K/V rows for ``ids`` (the template's turns up to the
    user turn's start, then each frame's ``<|vision_start|>`` pads ``<|vision_end|>``) over ``frames``, oldest
    first. ``generation`` changes when the rows are rebuilt (frames evicted): a query that matched an older view
    then prefills its whole prompt from the frames' features instead."""

    sid: int
    generation: int
    ids: tuple[int, ...] = field(repr=False)
    frames: tuple[EncodedFrame, ...] = field(repr=False)

    @property
    def length(self) -> int:
        return len(self.ids)
