"""The bounds on the frames of a session (:mod:`omni_stream.vision.frames` applies them); apart, so that settings
can hold them without importing numpy."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class FrameLimits:
    """Bounds on the frames of one session. Bytes, pixels, frames per second, frames.

    ``max_bytes``: an encoded image (10 MiB, vLLM-Omni's per-frame bound); ``max_pixels``: width x height of a
    picture, refused above (4096 x 4096); ``max_side``: the longer side a picture is scaled down to (1024; the
    model's own processor may scale further); ``max_fps`` and ``burst``: the rate cap's token bucket (8 frames per
    second, bursts of 64, vLLM-Omni's client's default clip); ``max_window``: the most frames a session may ask to
    keep (256, vLLM-Omni's ``max_frames`` bound); ``max_window_pixels``: the decoded pixels a session's frames may
    hold in all (32 Mi pixels, 96 MiB of RGB: 54 frames at 1024 x 576), the oldest leaving beyond it whatever
    ``max_frames`` says; ``max_conversation_pictures``: the pictures a realtime conversation keeps (16: an item
    that brings more makes the oldest items with pictures leave, as items beyond the item cap do).
    """

    max_bytes: int = 10 * 1024 * 1024
    max_pixels: int = 4096 * 4096
    max_side: int = 1024
    max_fps: float = 8.0
    burst: int = 64
    max_window: int = 256
    max_window_pixels: int = 32 * 1024 * 1024
    max_conversation_pictures: int = 16

    def __post_init__(self) -> None:
        counts = (self.max_bytes, self.max_pixels, self.max_side, self.burst, self.max_window, self.max_window_pixels,
                  self.max_conversation_pictures)  # fmt: skip
        if min(counts) < 1 or self.max_fps <= 0:
            raise ValueError("frame limits must be positive")
