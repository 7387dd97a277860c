"""The SSE events of the images routes, in both dialects, as pure encoders (bytes out, no I/O).

vLLM-Omni's (``data:`` lines only): ``{"object": "image.edit.chunk", "type": "ar_delta", "delta", "index",
"created", "model"}`` per AR text delta, ``"type": "partial_image"`` previews, exactly one ``"type": "image"``
with every image in ``data``, then ``data: [DONE]``; a failure after the start is ``{"object": "error", ...}``
then ``[DONE]``. Generations use ``image.generation.chunk``.

OpenAI's (``event:``/``data:`` pairs): ``image_edit.text_delta {delta}`` (an extension the SDK passes through),
``image_edit.partial_image``, then one ``image_edit.completed`` per image with ``usage``; a failure after the start
is an ``error`` event whose data has a top-level ``error`` (the SDK raises ``APIError`` on it). Generations use
``image_generation.*``. Nothing follows the terminal event in either dialect.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omni_stream.engine import Usage
from omni_stream.family import ModelKind
from omni_stream.images.spec import USAGE_IMAGE, USAGE_IMAGE_INPUT
from omni_stream.realtime.common.sse import sse_data, sse_event
from omni_stream.realtime.images.params import Dialect

DONE = sse_data("[DONE]")


def usage_body(
    usage: Mapping[str, Usage], prompt_limit: int | None = None, rewrite_stopped: bool = False
) -> dict[str, Any]:
    """OpenAI's images ``usage``: text tokens in (the text model's prompt and the diffusion prompt), input-image
    tokens, tokens out (the text model's and the images' latent tokens). With the image model's ``prompt_limit``
    (its text encoder's tokens), the extension ``image_prompt``: the prompt tokens the encoder read, the limit, and
    whether a rewrite was stopped there."""
    zero = Usage()
    text, image, images_in = (usage.get(k, zero) for k in (ModelKind.TEXT, USAGE_IMAGE, USAGE_IMAGE_INPUT))
    text_in = text.input_tokens + image.input_tokens
    image_in = images_in.input_tokens
    out = text.output_tokens + image.output_tokens
    body: dict[str, Any] = {
        "input_tokens": text_in + image_in,
        "input_tokens_details": {"image_tokens": image_in, "text_tokens": text_in},
        "output_tokens": out,
        "total_tokens": text_in + image_in + out,
    }
    if prompt_limit is not None:
        body["image_prompt"] = {
            "tokens": image.input_tokens,
            "max_tokens": prompt_limit,
            "rewrite_stopped": rewrite_stopped,
        }
    return body


@dataclass(slots=True, frozen=True)
class ImageEvents:
    """Encoder of one response's events. ``surface``: ``edit`` or ``generation``; ``size``: ``"WxH"``."""

    dialect: Dialect
    surface: str
    model: str
    created: int
    output_format: str
    size: str
    background: str = "opaque"
    quality: str = "auto"
    prompt_limit: int | None = None  # the image model's prompt limit, in its text encoder's tokens

    @property
    def _object(self) -> str:
        return f"image.{self.surface}.chunk"

    @property
    def _prefix(self) -> str:
        return f"image_{self.surface}"

    def _vllm(self, kind: str, **fields: Any) -> bytes:
        return sse_data({"object": self._object, "type": kind, **fields, "created": self.created, "model": self.model})

    def _openai(self, kind: str, **fields: Any) -> bytes:
        name = f"{self._prefix}.{kind}"
        return sse_event(name, {"type": name, **fields})

    def _picture(self, b64: str) -> dict[str, Any]:
        return {
            "b64_json": b64,
            "background": self.background,
            "created_at": self.created,
            "output_format": self.output_format,
            "quality": self.quality,
            "size": self.size,
        }

    def text(self, delta: str) -> bytes:
        """One AR text delta."""
        if self.dialect is Dialect.VLLM:
            return self._vllm("ar_delta", delta=delta, index=0)
        return self._openai("text_delta", delta=delta)

    def partial(self, b64: str, index: int) -> bytes:
        """Preview ``index`` (0-based) of the image as it forms."""
        if self.dialect is Dialect.VLLM:
            return self._vllm(
                "partial_image", b64_json=b64, partial_image_index=index, output_format=self.output_format,
                size=self.size,
            )  # fmt: skip
        return self._openai("partial_image", **self._picture(b64), partial_image_index=index)

    def completed(self, images: list[str], usage: Mapping[str, Usage], rewrite_stopped: bool = False) -> list[bytes]:
        """The terminal events: every final image (and, for vLLM-Omni, ``[DONE]``)."""
        if self.dialect is Dialect.VLLM:
            data = [{"b64_json": b64, "url": None, "revised_prompt": None} for b64 in images]
            return [self._vllm("image", data=data, output_format=self.output_format, size=self.size), DONE]
        body = usage_body(usage, self.prompt_limit, rewrite_stopped)
        return [self._openai("completed", **self._picture(b64), usage=body) for b64 in images]

    def error(self, message: str) -> list[bytes]:
        """The terminal events of a failure after the stream started."""
        error = {"message": message, "type": "server_error", "param": None, "code": 500}
        if self.dialect is Dialect.VLLM:
            body = {"object": "error", "created": self.created, "model": self.model, "error": error}
            return [sse_data(body), DONE]
        return [sse_event("error", {"type": "error", "error": error})]
