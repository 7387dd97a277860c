"""Image policy of Qwen2.5-VL as pure functions: resize to whole merged patches, normalize, patchify, and the
multimodal rotary positions of a prompt (what transformers' image processor and ``get_rope_index`` compute).

An image of ``h x w`` pixels is resized (bicubic) to sides that are multiples of ``patch * merge`` with an area
within ``[min_pixels, max_pixels]``, aspect kept as near as possible (:func:`smart_resize`); scaled to 0..1 and
normalized per channel; cut into ``patch x patch`` squares, each repeated ``temporal_patch_size`` times (a still
image is a clip of identical frames), ordered so that each ``merge x merge`` block of patches is contiguous
(:func:`patchify`). The LM sees one token per merged block: ``grid_h * grid_w / merge**2`` ``<|image_pad|>`` tokens
per image (:func:`expand_image_pads`). Positions (:func:`rope_positions`): text tokens count up on all three
axes; an image's tokens sit at (start, start + row, start + col) of its merged grid; text after an image resumes
at ``start + max(rows, cols)``; decode positions continue at ``length + delta``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from omni_stream.errors import InvalidRequestError
from omni_stream.models.qwen_vl.config import ImageSpec

MAX_ASPECT = 200  # transformers' bound on the ratio of an image's sides


@dataclass(slots=True, frozen=True)
class PreparedImage:
    """One image as the vision tower takes it: ``patches`` float32 ``[grid_h * grid_w, C * T * P * P]`` and its
    ``grid`` (t, h, w) in patches; ``tokens``: the LM tokens it becomes."""

    patches: np.ndarray
    grid: tuple[int, int, int]
    tokens: int


def image_prompt_tokens(tokens: int) -> int:
    """Prompt tokens (and a frame session's cache rows) of an image of ``tokens`` pads: the pads and the
    ``<|vision_start|>`` and ``<|vision_end|>`` markers around them."""
    return tokens + 2


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Sides that are multiples of ``factor``, area within ``[min_pixels, max_pixels]``, aspect kept (pixels)."""
    if min(height, width) < 1:
        raise InvalidRequestError(f"an image of {width}x{height} pixels: a side is zero", "messages")
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise InvalidRequestError(
            f"an image of {width}x{height} pixels: its sides' ratio must be at most {MAX_ASPECT}", "messages"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bicubic resize of a uint8 RGB ``[h, w, 3]`` image (through PIL, as transformers' PIL backend does)."""
    if image.shape[:2] == (height, width):
        return image
    from PIL import Image

    return np.asarray(Image.fromarray(image).resize((width, height), Image.Resampling.BICUBIC))


def patchify(chw: np.ndarray, patch: int, merge: int, temporal: int) -> np.ndarray:
    """``[C, H, W]`` float32 -> ``[gh * gw, C * temporal * patch * patch]``, merged blocks contiguous."""
    c, h, w = chw.shape
    gh, gw = h // patch, w // patch
    x = chw.reshape(c, gh // merge, merge, patch, gw // merge, merge, patch)
    x = np.transpose(x, (1, 4, 2, 5, 0, 3, 6))  # (gh/m, gw/m, m, m, C, P, P)
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], temporal, *x.shape[5:]))
    return np.ascontiguousarray(x.reshape(gh * gw, c * temporal * patch * patch), dtype=np.float32)


def prepare_image(image: np.ndarray, spec: ImageSpec) -> PreparedImage:
    """A uint8 RGB ``[h, w, 3]`` image as patches for the vision tower (blocking: run it off the event loop)."""
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise InvalidRequestError(
            f"an image must be uint8 RGB of shape (h, w, 3), got {image.dtype} {tuple(image.shape)}", "messages"
        )
    h, w = smart_resize(image.shape[0], image.shape[1], spec.factor, spec.min_pixels, spec.max_pixels)
    x: np.ndarray = resize(image, h, w).astype(np.float32) * np.float32(1 / 255)
    x = (x - np.asarray(spec.mean, dtype=np.float32)) / np.asarray(spec.std, dtype=np.float32)
    patches = patchify(np.transpose(x, (2, 0, 1)), spec.patch_size, spec.merge_size, spec.temporal_patch_size)
    grid = (1, h // spec.patch_size, w // spec.patch_size)
    return PreparedImage(patches, grid, grid[1] * grid[2] // spec.merge_size**2)


def expand_image_pads(ids: Sequence[int], image_token_id: int, counts: Sequence[int]) -> list[int]:
    """Each ``image_token_id`` of the templated prompt (one per image, in order) repeated ``counts[i]`` times."""
    pads = sum(1 for i in ids if i == image_token_id)
    if pads != len(counts):
        raise InvalidRequestError(f"the chat template placed {pads} image tokens for {len(counts)} images", "messages")
    out: list[int] = []
    it = iter(counts)
    for i in ids:
        out.extend([i] * next(it) if i == image_token_id else [i])
    return out


def rope_positions(
    ids: Sequence[int], image_token_id: int, grids: Sequence[tuple[int, int, int]], merge: int
) -> tuple[np.ndarray, int]:
    """Multimodal rotary positions ``[3, len(ids)]`` (int64) of a prompt whose images' pads are expanded, and the
    delta that decode positions add to the sequence length (``max + 1 - len(ids)``; 0 without images)."""
    n = len(ids)
    pos = np.zeros((3, n), dtype=np.int64)
    arr = np.asarray(ids, dtype=np.int64)
    is_image = arr == image_token_id
    grid_iter = iter(grids)
    i, current = 0, 0
    while i < n:
        j = i
        while j < n and is_image[j] == is_image[i]:
            j += 1
        if not is_image[i]:
            pos[:, i:j] = np.arange(current, current + j - i)
            current += j - i
        else:
            t, h, w = next(grid_iter)
            gh, gw = h // merge, w // merge
            if t * gh * gw != j - i:
                raise ValueError(f"an image run of {j - i} tokens does not match its grid {(t, h, w)}")
            tt, hh, ww = np.meshgrid(np.arange(t), np.arange(gh), np.arange(gw), indexing="ij")
            pos[0, i:j] = tt.reshape(-1) + current
            pos[1, i:j] = hh.reshape(-1) + current
            pos[2, i:j] = ww.reshape(-1) + current
            current += max(gh, gw)
        i = j
    delta = int(pos.max()) + 1 - n if n else 0
    return pos, delta
