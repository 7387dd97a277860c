"""Image uploads and results as bytes: decode (PNG, JPEG, WebP) within a pixel limit, encode, base64.

Blocking (Pillow): callers run these with ``anyio.to_thread``. The pixel count is checked from the header before
any pixel is decoded, so a small file that inflates to a huge image (a decompression bomb) costs nothing.
"""

from __future__ import annotations

import base64
import io
import warnings
from typing import Any

import numpy as np

from omni_stream.realtime.common.errors import bad_request

FORMATS = ("PNG", "JPEG", "WEBP")
_SAVE = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}


def _open(data: bytes, param: str, max_pixels: int) -> Any:
    from PIL import Image as PILImage  # the [image] extra; imported when an upload arrives

    if not data:
        raise bad_request(f"'{param}' is empty", param)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PILImage.DecompressionBombWarning)
            image = PILImage.open(io.BytesIO(data), formats=FORMATS)
            width, height = image.size
            if width * height > max_pixels:
                raise bad_request(
                    f"'{param}' is {width}x{height} pixels: more than the limit of {max_pixels} pixels", param
                )
            image.load()
    except (PILImage.DecompressionBombError, PILImage.DecompressionBombWarning):
        # Pillow refuses a huge header before we read its size: the limit named is ours
        raise bad_request(f"'{param}' has more pixels than the limit of {max_pixels} pixels", param) from None
    except PILImage.UnidentifiedImageError:
        raise bad_request(f"'{param}' is not a PNG, JPEG or WebP image", param) from None
    except (OSError, ValueError, SyntaxError) as exc:  # truncated or corrupt data
        raise bad_request(f"'{param}' could not be decoded: {exc}", param) from None
    return image


def decode_image(data: bytes, param: str, max_pixels: int) -> np.ndarray:
    """An upload as uint8 RGB ``(h, w, 3)`` (transparency dropped); 400 naming ``param`` when it is not one."""
    image = _open(data, param, max_pixels)
    return np.asarray(image.convert("RGB"), dtype=np.uint8)


def decode_mask(data: bytes, size: tuple[int, int], max_pixels: int) -> np.ndarray:
    """An OpenAI mask (a PNG with alpha, the size of the first image) as float32 ``(h, w)``: 1 where it is
    transparent (the picture may change there), 0 where it is opaque (the input is kept)."""
    image = _open(data, "mask", max_pixels)
    if image.size != size:
        raise bad_request(
            f"'mask' is {image.size[0]}x{image.size[1]}: it must have the size of the image ({size[0]}x{size[1]})",
            "mask",
        )
    if "A" not in image.getbands() and "transparency" not in image.info:
        raise bad_request("'mask' must have an alpha channel (transparent where the image is edited)", "mask")
    alpha = np.asarray(image.convert("RGBA"), dtype=np.float32)[..., 3]
    return (1.0 - alpha / 255.0).astype(np.float32)


def encode_image(pixels: np.ndarray, output_format: str, compression: int = 100) -> bytes:
    """uint8 ``(h, w, 3)`` -> file bytes; ``compression`` 0-100 is the JPEG/WebP quality (PNG: lossless)."""
    from PIL import Image as PILImage

    image = PILImage.fromarray(pixels, "RGB")
    buffer = io.BytesIO()
    fmt = _SAVE[output_format]
    if fmt == "PNG":
        image.save(buffer, fmt, compress_level=1)  # fast; these are streamed, often previews
    else:
        image.save(buffer, fmt, quality=max(1, compression))
    return buffer.getvalue()


def encode_b64(pixels: np.ndarray, output_format: str, compression: int = 100) -> str:
    return base64.b64encode(encode_image(pixels, output_format, compression)).decode("ascii")
