"""Image test helpers: engines of tiny checkpoints, test pictures, uploads, step-log queries and call hooks."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from omni_stream.engine import AsyncEngine, ModelSource

REWRITE_PREFIX = "Picture:"  # what the synthetic text model puts before the echoed instruction

# The image fixtures (tests/image_fixtures.py) skip their whole module without diffusers, so a test that takes one
# is skipped before its setup: otherwise it errors with "fixture not found" where the [image] extra is missing.
NEEDS_DIFFUSERS = pytest.mark.skipif(importlib.util.find_spec("diffusers") is None, reason="needs [image]")


async def load_engine(image: Path, lm: Path | None = None, **options: Any) -> AsyncEngine:
    sources = {"image": ModelSource(image)}
    if lm is not None:
        sources["llm"] = ModelSource(lm)
    return await AsyncEngine.load(sources, progress=False, **options)


def picture(width: int = 64, height: int = 64, seed: int = 0) -> np.ndarray:
    """A smooth RGB test picture (uint8)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / max(1, width - 1), y * 255 / max(1, height - 1), np.full_like(x, 128.0)], -1)
    return np.clip(base + rng.normal(0, 8, base.shape), 0, 255).astype(np.uint8)


def png_bytes(pixels: np.ndarray, fmt: str = "PNG") -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, fmt)
    return buf.getvalue()


def decode_b64_image(b64: str) -> Any:
    import base64

    from PIL import Image

    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    image.load()
    return image


def call_hooks(family: Any) -> list[Any]:
    """The image model's ``on_call(kind, labels)`` as a list of hooks, run on the device thread after each batched
    model call (several requests of one test watch their own calls)."""
    model = family.runner.model
    if model.on_call is None:
        hooks: list[Any] = []

        def dispatch(kind: str, labels: tuple[str, ...]) -> None:
            for hook in list(hooks):
                hook(kind, labels)

        dispatch.hooks = hooks  # type: ignore[attr-defined]
        model.on_call = dispatch
    return model.on_call.hooks  # type: ignore[no-any-return]


def calls_of(family: Any, label: str, kind: str = "denoise") -> int:
    """Batched model calls of ``kind`` that request ``label`` was in (the image step log)."""
    return sum(1 for e in family.runner.log.of(label) if e.kind == kind)
