"""What a session admits of the images and video frames a client sends: the policy, pure and unit-tested.

Two halves, so that the expensive one runs off the event loop and the cheap one holds the session's state:

- :func:`decode_frame` (call it in a worker thread: PIL decodes there) turns an encoded image into pixels. It
  refuses what is not a JPEG, PNG or WebP image, an encoding over ``FrameLimits.max_bytes`` bytes and a picture over
  ``FrameLimits.max_pixels`` pixels (read from the header, before any pixel is decoded), each as an
  :class:`~omni_stream.errors.InvalidRequestError` naming the field. A picture whose longer side is over
  ``FrameLimits.max_side`` is scaled down to it (aspect kept): the resolution cap. It also makes the frame's grey
  thumbnail for the near-duplicate filter. :func:`decode_base64` is the same from base64 text, its size checked
  before the base64 is decoded; :func:`frame_from_pixels` the same from pixels already decoded (a camera track's).
- :class:`FrameWindow` is one session's frames: a rate cap (:meth:`FrameWindow.check_rate`, before decoding, so a
  flood costs nothing), a near-duplicate filter and a bounded window (:meth:`FrameWindow.offer`).

Rate cap: a token bucket of ``FrameLimits.burst`` frames refilled at ``FrameLimits.max_fps`` per second. A frame
that finds the bucket empty is refused (an error naming the field; the frame is not kept), never silently dropped:
a client learns that it sends too fast. A burst (a client that sends a recorded clip at once) is taken up to
``burst`` frames.

Near-duplicate filter (the idea of vLLM-Omni's EVS filter; our own code): each kept frame's picture is reduced to a
``THUMB`` x ``THUMB`` grey thumbnail; a new frame whose thumbnail differs from the last *kept* one by a mean
absolute difference of at most ``(1 - threshold) * 255`` grey levels is a near duplicate and is dropped (not an
error: the scene did not change). ``threshold`` is a similarity in [0, 1], as vLLM-Omni's
``frame_filter_threshold`` (default 0.95: frames within 12.75 grey levels on average of the last kept one are
dropped); higher keeps more frames (1.0 drops only frames whose thumbnails match exactly); None turns the filter
off.

Window: at most ``max_frames`` frames are kept, and at most ``FrameLimits.max_window_pixels`` decoded pixels in
all; a frame kept beyond either evicts the oldest (the newest always stays: the window never grows).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from omni_stream.errors import InvalidRequestError
from omni_stream.vision.limits import FrameLimits

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

FORMATS = ("JPEG", "PNG", "WEBP")  # what PIL calls the image formats a frame may come in
THUMB = 32  # the near-duplicate filter's thumbnail side, in pixels


@dataclass(slots=True, frozen=True, eq=False)
class Frame:
    """A decoded frame: ``pixels`` uint8 RGB ``(h, w, 3)`` (within the resolution cap), ``thumb`` its float32 grey
    ``THUMB`` x ``THUMB`` thumbnail, ``source`` the encoded picture's size ``(w, h)`` before any scaling."""

    pixels: np.ndarray
    thumb: np.ndarray
    source: tuple[int, int]


class FrameTooLargeError(InvalidRequestError):
    """A frame over the byte or pixel cap."""


def decode_base64(text: object, limits: FrameLimits, param: str) -> Frame:
    """:func:`decode_frame` of base64 text (a data URL's payload, or bare base64); its size is checked first."""
    if not isinstance(text, str) or not text:
        raise InvalidRequestError(f"{param} must be a non-empty base64 string (a JPEG, PNG or WebP image)", param)
    if len(text) // 4 * 3 > limits.max_bytes + 2:
        raise FrameTooLargeError(f"{param} is larger than {limits.max_bytes} bytes (one image at most)", param)
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequestError(f"{param} is not valid base64", param) from None
    return decode_frame(data, limits, param)


def split_data_url(url: object, param: str) -> str:
    """The base64 payload of a ``data:image/...;base64,`` URL (the only image URLs taken: nothing is fetched)."""
    if not isinstance(url, str) or not url.startswith("data:"):
        raise InvalidRequestError(
            f"{param} must be a data: URL (data:image/png;base64,...): remote images are not fetched", param
        )
    header, sep, payload = url.partition(",")
    if not sep or not header.endswith(";base64"):
        raise InvalidRequestError(f"{param} must be a base64 data: URL (data:image/png;base64,...)", param)
    return payload


def decode_frame(data: bytes, limits: FrameLimits, param: str) -> Frame:
    """Pixels and thumbnail of an encoded JPEG, PNG or WebP image (see the module docstring). CPU-heavy: call it
    off the event loop."""
    from PIL import Image, UnidentifiedImageError

    if len(data) > limits.max_bytes:
        raise FrameTooLargeError(f"{param} is larger than {limits.max_bytes} bytes (one image at most)", param)
    try:
        with Image.open(io.BytesIO(data), formats=FORMATS) as image:
            width, height = image.size
            if width * height > limits.max_pixels:
                raise FrameTooLargeError(f"{param} is {width}x{height}: more than {limits.max_pixels} pixels", param)
            scale = limits.max_side / max(width, height)
            size = (width, height)
            if scale < 1:
                size = (max(1, round(width * scale)), max(1, round(height * scale)))
                image.draft("RGB", size)  # JPEG: decode at a reduced scale when it can (the sizes it gives are >=)
            rgb = image.convert("RGB")
    except Image.DecompressionBombError:
        raise FrameTooLargeError(f"{param} has more than {limits.max_pixels} pixels", param) from None
    except UnidentifiedImageError:  # its message shows the buffer object, not the data: say what was expected
        raise InvalidRequestError(f"{param} is not a JPEG, PNG or WebP image", param) from None
    except OSError as exc:  # truncated or corrupt data
        raise InvalidRequestError(f"{param} could not be decoded as an image: {exc}", param) from None
    return _framed(rgb, size, (width, height))


def frame_from_pixels(rgb: np.ndarray, limits: FrameLimits, param: str) -> Frame:
    """:func:`decode_frame` of pixels already decoded (a camera track's frame: uint8 RGB ``(h, w, 3)``): refused
    over ``limits.max_pixels``, scaled down to ``limits.max_side``, with its thumbnail. CPU work: call it off the
    event loop."""
    from PIL import Image

    height, width = rgb.shape[:2]
    if width * height > limits.max_pixels:
        raise FrameTooLargeError(f"{param} is {width}x{height}: more than {limits.max_pixels} pixels", param)
    scale = limits.max_side / max(width, height)
    size = (max(1, round(width * scale)), max(1, round(height * scale))) if scale < 1 else (width, height)
    return _framed(Image.fromarray(np.ascontiguousarray(rgb, dtype=np.uint8), "RGB"), size, (width, height))


def _framed(rgb: PILImage, size: tuple[int, int], source: tuple[int, int]) -> Frame:
    """The Frame of an RGB picture scaled to ``size`` (the resolution cap), with its grey thumbnail."""
    from PIL import Image

    if rgb.size != size:
        rgb = rgb.resize(size, Image.Resampling.BILINEAR, reducing_gap=2.0)
    grey = rgb.convert("L").resize((THUMB, THUMB), Image.Resampling.BOX)
    pixels = np.asarray(rgb, dtype=np.uint8).copy()
    return Frame(pixels, np.asarray(grey, dtype=np.float32), source)


def pixels(frame: Frame) -> int:
    """A frame's decoded pixels (width x height)."""
    return int(frame.pixels.shape[0] * frame.pixels.shape[1])


def difference(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute difference of two thumbnails, in grey levels (0-255)."""
    return float(np.mean(np.abs(a - b)))


class FrameRateError(InvalidRequestError):
    """A frame came while the session's rate cap had no room for it."""


@dataclass(slots=True)
class FrameWindow:
    """One session's frames (see the module docstring): ``max_frames`` kept at most (1 to ``limits.max_window``),
    near duplicates dropped against ``threshold`` (None: no filter). Counters: ``kept``, ``duplicates`` (dropped as
    near duplicates), ``refused`` (over the rate cap), ``evicted`` (left the window for newer ones)."""

    limits: FrameLimits
    max_frames: int
    threshold: float | None = 0.95
    kept: int = 0
    duplicates: int = 0
    refused: int = 0
    evicted: int = 0
    _frames: deque[Frame] = field(default_factory=deque)
    _last: Frame | None = None  # the last frame kept (it may have left the window since)
    _tokens: float = -1.0  # the rate bucket (-1: full, before the first frame)
    _at: float = 0.0  # when the bucket was last filled
    _pixels: int = 0  # the window's decoded pixels

    def __post_init__(self) -> None:
        if not 1 <= self.max_frames <= self.limits.max_window:
            bound = self.limits.max_window
            raise InvalidRequestError(f"max_frames must be 1-{bound}, got {self.max_frames}", "max_frames")
        if self.threshold is not None and not (0.0 <= self.threshold <= 1.0 and math.isfinite(self.threshold)):
            raise InvalidRequestError(f"the frame filter threshold must be 0.0-1.0, got {self.threshold}", "threshold")

    def __len__(self) -> int:
        return len(self._frames)

    @property
    def frames(self) -> tuple[Frame, ...]:
        """The frames kept, oldest first."""
        return tuple(self._frames)

    def check_rate(self, now: float, param: str) -> None:
        """Take a frame's place in the rate bucket at ``now`` (monotonic seconds); FrameRateError naming ``param``
        when there is none (the frame must then be left alone)."""
        limits = self.limits
        if self._tokens < 0:
            self._tokens = float(limits.burst)
        else:
            self._tokens = min(float(limits.burst), self._tokens + max(0.0, now - self._at) * limits.max_fps)
        self._at = now
        if self._tokens < 1.0:
            self.refused += 1
            raise FrameRateError(
                f"{param}: frames come faster than {limits.max_fps:g} per second (bursts of {limits.burst}): "
                "this one was not kept",
                param,
            )
        self._tokens -= 1.0

    def offer(self, frame: Frame) -> bool:
        """Keep ``frame`` unless it is a near duplicate of the last frame kept; True when kept (the oldest frame
        leaves when the window is full)."""
        if self.threshold is not None and self._last is not None:
            if difference(frame.thumb, self._last.thumb) <= (1.0 - self.threshold) * 255.0:
                self.duplicates += 1
                return False
        self._frames.append(frame)
        self._pixels += pixels(frame)
        self._last = frame
        self.kept += 1
        while len(self._frames) > 1 and (
            len(self._frames) > self.max_frames or self._pixels > self.limits.max_window_pixels
        ):
            self._pixels -= pixels(self._frames.popleft())
            self.evicted += 1
        return True

    def sample(self, count: int) -> tuple[Frame, ...]:
        """At most ``count`` frames of the window spread over it, oldest first, the newest always among them
        (vLLM-Omni's stride: every ``len // count``-th frame from the oldest, then the newest)."""
        frames = self.frames
        if count < 1:
            return ()
        if len(frames) <= count:
            return frames
        stride = max(1, len(frames) // count)
        return (*(frames[i * stride] for i in range(count - 1)), frames[-1])
