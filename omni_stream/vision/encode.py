"""Pictures as the OpenAI wire carries them: a ``data:image/png;base64,...`` URL of decoded pixels (the remote text
backend sends a message's images this way). PNG keeps the pixels exactly, so the server decodes what was shown.
CPU work (an encode of a 1024-pixel picture takes tens of milliseconds): call it off the event loop."""

from __future__ import annotations

import base64
import io

import numpy as np


def png_data_url(pixels: np.ndarray) -> str:
    """uint8 RGB ``(h, w, 3)`` pixels as a base64 PNG data URL."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels), "RGB").save(buffer, "PNG", compress_level=1)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
