"""Field validation of POST /v1/images/edits (multipart strings) and /v1/images/generations (JSON), and the rule
that picks the SSE dialect. Pure: no I/O; every problem is a 400 naming the field.

Dialect rule (``stream=true``), first match wins:

1. ``stream_format``: ``"openai"`` or ``"vllm"`` (an extension field) picks that dialect.
2. The request comes from an OpenAI SDK (it names itself in every request: ``X-Stainless-Lang`` and the other
   ``X-Stainless-*`` headers, ``User-Agent: OpenAI/...``): OpenAI's, so unchanged SDK code
   (``client.images.edit(stream=True)``, with or without ``partial_images``) gets the events it waits for.
3. ``partial_images`` sent (any value, 0 included): OpenAI's, as OpenAI documents it for plain HTTP clients.
4. Otherwise vLLM-Omni's when the request runs an AR text stage (a text model rewrites the prompt), else OpenAI's:
   vLLM-Omni's own client (plain HTTP, no SDK headers) keeps its dialect unchanged.

vLLM-Omni's dialect streams the AR text, so it needs a text stage: ``stream_format=vllm`` on a pipeline without
one is a 400 (vLLM-Omni answers ``stream=true`` on a single-stage pipeline the same way).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from omni_stream.realtime.common.errors import bad_request
from omni_stream.realtime.common.json_fields import boolean, choice, integer, number, optional, string

OUTPUT_FORMATS = {"png": "png", "webp": "webp", "jpeg": "jpeg", "jpg": "jpeg"}
_SIZE = re.compile(r"^\s*(\d{1,9})\s*[xX]\s*(\d{1,9})\s*$")

# OpenAI's image options that steer its own models' service, not the picture a diffusion model paints: checked
# (the values its API takes) and otherwise ignored, so the openai SDK's calls that set them work unchanged.
IGNORED_CHOICES = {
    "moderation": ("auto", "low"),
    "style": ("vivid", "natural"),
    "input_fidelity": ("high", "low"),
}
IGNORED_TEXT = frozenset({"user", "safety_identifier"})
# OpenAI's options for outputs no diffusion pipeline here makes (vector graphics, animations): a 400 that says so
UNSUPPORTED = frozenset({"svg", "markup", "complexity", "frame_count", "frame_duration_ms"})
# Fields each route reads; anything else is a 400 naming it. ``image[]`` is how some clients send several images.
EDIT_FIELDS = frozenset(
    {
        "prompt", "model", "n", "size", "output_format", "output_compression", "stream", "stream_format",
        "partial_images", "response_format", "background", "quality", "num_inference_steps", "guidance_scale", "seed",
        "rewrite", *IGNORED_CHOICES, *IGNORED_TEXT,
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
    rewrite: bool | None = None  # the extension: False skips the text model's rewrite (None: it runs if loaded)


def parse_size(value: Any, form: bool = True) -> tuple[int, int] | None:
    """``"WxH"`` -> ``(W, H)`` pixels; ``"auto"`` -> None."""
    text = string(value, "size", form=form).strip().lower()
    if text == "auto":
        return None
    match = _SIZE.match(text)
    if match is None:
        raise bad_request(f"'size' must be 'auto' or WIDTHxHEIGHT in pixels (e.g. 512x512), got {value!r}", "size")
    if 0 in (int(match[1]), int(match[2])):  # the model's own range comes from the engine's check (images/spec.py)
        raise bad_request(f"'size' must have a width and a height above 0, got {value!r}", "size")
    return int(match[1]), int(match[2])


def parse_params(values: Mapping[str, Any], allowed: frozenset[str], *, form: bool) -> ImageParams:
    """Validate the fields of one request: strings from a form (``form``: numbers and booleans as their text), or
    JSON values (each of its own type: a number where the prompt goes is an error, as is a string for ``n``)."""
    unknown = sorted(set(values) - allowed)
    for key in unknown:  # null is what OpenAI's SDK sends for an option left unset: as absent
        if key in UNSUPPORTED and values[key] is not None:
            raise bad_request(f"'{key}' is an OpenAI image option this server does not support", key)
    unknown = [key for key in unknown if key not in UNSUPPORTED]
    if unknown:
        raise bad_request(f"Unknown field '{unknown[0]}'", unknown[0])
    values = {key: value for key, value in values.items() if value is not None}  # null: unset, as the SDK means it
    for key, options in IGNORED_CHOICES.items():
        if values.get(key) is not None and key in allowed:
            choice(values[key], key, options, form=form)
    for key in IGNORED_TEXT:
        if values.get(key) is not None and key in allowed:
            string(values[key], key, form=form)
    prompt = values.get("prompt")
    if prompt is None or not string(prompt, "prompt", form=form).strip():
        raise bad_request("'prompt' is required", "prompt")
    get = values.get
    response_format = get("response_format")
    if response_format is not None and string(response_format, "response_format", form=form).strip() != "b64_json":
        raise bad_request("'response_format' must be 'b64_json' (image URLs are not served)", "response_format")
    output_format = OUTPUT_FORMATS.get(string(get("output_format", "png"), "output_format", form=form).strip().lower())
    if output_format is None:
        raise bad_request(
            f"'output_format' must be one of png, webp, jpeg, got {get('output_format')!r}", "output_format"
        )
    background = choice(get("background", "auto"), "background", ("auto", "opaque", "transparent"), form=form)
    if background == "transparent":
        raise bad_request("'background': transparent backgrounds are not supported (auto or opaque)", "background")
    stream_format = get("stream_format")
    return ImageParams(
        prompt=string(prompt, "prompt", form=form),
        model=optional(values, "model", string, form=form),
        n=integer(get("n", 1), "n", 1, 4, form=form),
        size=parse_size(get("size", "auto"), form),
        output_format=output_format,
        output_compression=integer(get("output_compression", 100), "output_compression", 0, 100, form=form),
        stream=boolean(get("stream", False), "stream", form=form),
        stream_format=Dialect(choice(stream_format, "stream_format", tuple(Dialect), form=form))
        if stream_format
        else None,
        partial_images=integer(get("partial_images"), "partial_images", 0, 3, form=form)
        if get("partial_images") is not None
        else None,
        background=background,
        quality=choice(get("quality", "auto"), "quality", ("auto", "low", "medium", "high"), form=form),
        steps=integer(get("num_inference_steps"), "num_inference_steps", 1, 1000, form=form)
        if get("num_inference_steps") is not None
        else None,
        guidance_scale=number(get("guidance_scale"), "guidance_scale", 0.0, 50.0, form=form)
        if get("guidance_scale") is not None
        else None,
        seed=integer(get("seed"), "seed", 0, 2**63 - 1, form=form) if get("seed") is not None else None,
        rewrite=optional(values, "rewrite", boolean, form=form),
    )


def form_values(fields: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """A form's text fields as one value each (400 when a field is repeated)."""
    values: dict[str, str] = {}
    for key, value in fields:
        if key in values:
            raise bad_request(f"Field '{key}' is given more than once", key)
        values[key] = value
    return values


def from_openai_sdk(headers: Mapping[str, str]) -> bool:
    """Whether a request's (lower-case) headers say an OpenAI SDK sent it."""
    return "x-stainless-lang" in headers or headers.get("user-agent", "").startswith("OpenAI/")


def choose_dialect(params: ImageParams, has_text_stage: bool, openai_sdk: bool = False) -> Dialect | None:
    """The SSE dialect of a request (None: not streamed); ``openai_sdk``: :func:`from_openai_sdk` of its headers.
    See the module docstring for the rule."""
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
    if openai_sdk or params.partial_images is not None:
        return Dialect.OPENAI
    return Dialect.VLLM if has_text_stage else Dialect.OPENAI
