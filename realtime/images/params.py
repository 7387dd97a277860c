"""Field validation of POST /v1/images/edits (multipart strings) and /v1/images/generations (JSON), and the rule
that picks the SSE dialect. Pure: no I/O; every problem is a 400 naming the field.

Dialect rule (``stream=true``), first match wins:

1. ``stream_format``: ``"openai"`` or ``"vllm"`` (an extension field) picks that dialect.
2. ``partial_images`` sent (any value, 0 included): OpenAI's, which is what ``client.images.edit(stream=True,
   partial_images=N)`` reads.
3. Otherwise vLLM-Omni's when the request runs an AR text stage (a text model rewrites the prompt), else OpenAI's.

vLLM-Omni's dialect streams the AR text, so it needs a text stage: ``stream_format=vllm`` on a pipeline without
one is a 400 (vLLM-Omni answers ``stream=true`` on a single-stage pipeline the same way).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from omni_stream.realtime.common.errors import bad_request

OUTPUT_FORMATS = {"png": "png", "webp": "webp", "jpeg": "jpeg", "jpg": "jpeg"}
_SIZE = re.compile(r"^\s*(\d{1,5})\s*[xX]\s*(\d{1,5})\s*$")
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off", "")

# Fields each route reads; anything else is a 400 naming it. ``image[]`` is how some clients send several images.
EDIT_FIELDS = frozenset(
    {
        "prompt", "model", "n", "size", "output_format", "output_compression", "stream", "stream_format",
        "partial_images", "response_format", "background", "quality", "user", "num_inference_steps",
        "guidance_scale", "seed",
    }
)  # fmt: skip
EDIT_FILES = frozenset({"image", "image[]", "mask"})
GENERATION_FIELDS = EDIT_FIELDS


class Dialect(StrEnum):
    OPENAI = "openai"  # event:/data: pairs image_edit.* (the openai SDK)
    VLLM = "vllm"  # data: lines only, image.edit.chunk ... [DONE] (vLLM-Omni)


@dataclass(slots=True, frozen=True)
class ImageParams:
    """The validated fields of one images request. ``size`` None: ``auto``."""

    prompt: str
    model: str | None = None
    n: int = 1
    size: tuple[int, int] | None = None
    output_format: str = "png"
    output_compression: int = 100
    stream: bool = False
    stream_format: Dialect | None = None
    partial_images: int | None = None  # None: not sent
    background: str = "auto"
    quality: str = "auto"
    steps: int | None = None
    guidance_scale: float | None = None
    seed: int | None = None


def _text(value: Any, key: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"'{key}' must be a string", key)
    return str(value)


def _int(value: Any, key: str, lo: int, hi: int) -> int:
    if isinstance(value, bool):
        raise bad_request(f"'{key}' must be an integer", key)
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise bad_request(f"'{key}' must be an integer, got {value!r}", key) from None
    if not isinstance(value, int):
        raise bad_request(f"'{key}' must be an integer", key)
    if not lo <= value <= hi:
        raise bad_request(f"'{key}' must be between {lo} and {hi}, got {value}", key)
    return value


def _float(value: Any, key: str, lo: float, hi: float) -> float:
    if isinstance(value, bool):
        raise bad_request(f"'{key}' must be a number", key)
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise bad_request(f"'{key}' must be a number, got {value!r}", key) from None
    if not math.isfinite(number) or not lo <= number <= hi:
        raise bad_request(f"'{key}' must be between {lo} and {hi}, got {value}", key)
    return number


def _bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise bad_request(f"'{key}' must be true or false, got {value!r}", key)


def _choice(value: Any, key: str, allowed: tuple[str, ...]) -> str:
    text = _text(value, key).strip().lower()
    if text not in allowed:
        raise bad_request(f"'{key}' must be one of {', '.join(allowed)}, got {value!r}", key)
    return text


def parse_size(value: Any) -> tuple[int, int] | None:
    """``"WxH"`` -> ``(W, H)`` pixels; ``"auto"`` -> None."""
    text = _text(value, "size").strip().lower()
    if text == "auto":
        return None
    match = _SIZE.match(text)
    if match is None or 0 in (int(match[1]), int(match[2])):
        raise bad_request(f"'size' must be 'auto' or WIDTHxHEIGHT (e.g. 1024x1024), got {value!r}", "size")
    return int(match[1]), int(match[2])


def parse_params(values: Mapping[str, Any], allowed: frozenset[str]) -> ImageParams:
    """Validate the fields of one request (strings from a form, or JSON values)."""
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise bad_request(f"Unknown field '{unknown[0]}'", unknown[0])
    prompt = values.get("prompt")
    if prompt is None or not _text(prompt, "prompt").strip():
        raise bad_request("'prompt' is required", "prompt")
    get = values.get
    response_format = get("response_format")
    if response_format is not None and _text(response_format, "response_format").strip() != "b64_json":
        raise bad_request("'response_format' must be 'b64_json' (image URLs are not served)", "response_format")
    output_format = OUTPUT_FORMATS.get(_text(get("output_format", "png"), "output_format").strip().lower())
    if output_format is None:
        raise bad_request(
            f"'output_format' must be one of png, webp, jpeg, got {get('output_format')!r}", "output_format"
        )
    background = _choice(get("background", "auto"), "background", ("auto", "opaque", "transparent"))
    if background == "transparent":
        raise bad_request("'background': transparent backgrounds are not supported (auto or opaque)", "background")
    stream_format = get("stream_format")
    return ImageParams(
        prompt=_text(prompt, "prompt"),
        model=_text(get("model"), "model") if get("model") is not None else None,
        n=_int(get("n", 1), "n", 1, 4),
        size=parse_size(get("size", "auto")),
        output_format=output_format,
        output_compression=_int(get("output_compression", 100), "output_compression", 0, 100),
        stream=_bool(get("stream", False), "stream"),
        stream_format=Dialect(_choice(stream_format, "stream_format", tuple(Dialect))) if stream_format else None,
        partial_images=_int(get("partial_images"), "partial_images", 0, 3)
        if get("partial_images") is not None
        else None,
        background=background,
        quality=_choice(get("quality", "auto"), "quality", ("auto", "low", "medium", "high")),
        steps=_int(get("num_inference_steps"), "num_inference_steps", 1, 1000)
        if get("num_inference_steps") is not None
        else None,
        guidance_scale=_float(get("guidance_scale"), "guidance_scale", 0.0, 50.0)
        if get("guidance_scale") is not None
        else None,
        seed=_int(get("seed"), "seed", 0, 2**63 - 1) if get("seed") is not None else None,
    )


def form_values(fields: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """A form's text fields as one value each (400 when a field is repeated)."""
    values: dict[str, str] = {}
    for key, value in fields:
        if key in values:
            raise bad_request(f"Field '{key}' is given more than once", key)
        values[key] = value
    return values


def choose_dialect(params: ImageParams, has_text_stage: bool) -> Dialect | None:
    """The SSE dialect of a request (None: not streamed); see the module docstring for the rule."""
    if not params.stream:
        return None
    if params.stream_format is Dialect.VLLM and not has_text_stage:
        raise bad_request(
            "stream_format=vllm streams the AR text, and this pipeline has no text stage "
            "(load a text model, or use stream_format=openai)",
            "stream_format",
        )
    if params.stream_format is not None:
        return params.stream_format
    if params.partial_images is not None:
        return Dialect.OPENAI
    return Dialect.VLLM if has_text_stage else Dialect.OPENAI
