"""Images (diffusion): the request type, the family protocol of ``kind == "image"``, and the ``image`` pipeline.

An image family paints :class:`~omni_stream.chunks.Image` chunks from a prompt (text to image) or from a prompt
and input images (edit): previews (``partial=True``) while the image forms, then the final images
(``partial=False``, ``index`` of ``count``; the stage's last chunk is the last image).

The ``image`` pipeline puts a text model in front when one is loaded (or the request asks for one): the text
stage rewrites the instruction into a literal description of the picture (the consumer sees its deltas as they
are written, up to the image model's prompt limit, where the rewrite is stopped), and the diffusion stage paints
from the rewritten prompt. Without a text model, or with
``rewrite=False``, the diffusion stage runs alone on the request's prompt. This is the AR + diffusion shape of
models that think in text before they paint (HunyuanImage-3), built from two separate models.

Importing this module registers the kind's protocol and the pipeline.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

import numpy as np

from omni_stream.chunks import Image, TextDelta
from omni_stream.context import RequestContext
from omni_stream.errors import InvalidRequestError
from omni_stream.family import ModelInfo, ModelKind
from omni_stream.images.prompt_bound import bounded_rewrite
from omni_stream.pipeline import Stage
from omni_stream.pipeline_specs import Kind, ModelSet, PipelineSpec, Plan, StagePlan
from omni_stream.requests import ChatMessage, Role, TextRequest, next_request_id
from omni_stream.validation.fields import check_seed, flag, instance, real, whole

MAX_IMAGES = 4  # images per request (``n``)
MAX_PARTIAL_IMAGES = 3  # previews per request (OpenAI's ``partial_images`` range is 0-3)
MAX_PROMPT_CHARS = 32000
# Usage keys of ``ctx.tokens``: the diffusion prompt's text tokens in and the latent tokens painted out under
# "image"; the latent tokens of the input images under "image_input".
USAGE_IMAGE = ModelKind.IMAGE
USAGE_IMAGE_INPUT = "image_input"

REWRITE_SYSTEM_PROMPT = (
    "You turn image requests into prompts for an image model. Reason briefly about what the user wants, then "
    "write one literal description of the finished picture: subject, setting, colours, light, style. "
    "Reply with the description only."
)


class ImageMode(StrEnum):
    GENERATE = "generate"  # text to image
    EDIT = "edit"  # prompt + input image(s) to image


MAX_TEXT_TOKENS = 256  # an image request's rewrite: the text model writes at most this many tokens (default)


@dataclass(slots=True, frozen=True)
class ImageInfo(ModelInfo):
    """An image model. Sizes in pixels: ``(width, height)``; sides are multiples of ``size_multiple``.

    ``token_pixels``: the side of the square of pixels one latent token covers (usage counts). ``preview``: how
    previews are decoded (``tiny-autoencoder`` or ``linear``, a fitted latent-to-RGB projection).
    ``max_prompt_tokens``: the most prompt tokens (the text encoder's own, specials included) the model reads
    (None: no limit known); a rewrite is bounded by it (:mod:`omni_stream.images.prompt_bound`).
    """

    modes: tuple[ImageMode, ...] = (ImageMode.GENERATE,)
    size_multiple: int = 8
    min_side: int = 64
    max_side: int = 2048
    default_size: tuple[int, int] = (512, 512)
    default_steps: int = 30
    max_steps: int = 200
    min_edit_steps: int = 1  # an edit's fewest num_inference_steps (img2img denoises a share of the steps asked)
    default_guidance: float = 7.5
    max_input_images: int = 1
    token_pixels: int = 8
    preview: str = "linear"
    max_prompt_tokens: int | None = None


@dataclass(slots=True, frozen=True)
class ImageRequest:
    """Paint ``n`` images for ``prompt``, from ``images`` (an edit) or from nothing (text to image).

    ``images``: uint8 RGB ``(h, w, 3)`` arrays. ``mask``: float32 ``(h, w)`` of the first image, 1 where the
    picture may change (OpenAI's transparent mask pixels) and 0 where the input shows through. ``size``:
    ``(width, height)`` pixels (None: the first input's size fitted to the model, or the model's default).
    ``steps`` / ``guidance_scale`` None: the model's defaults. ``seed`` None: a random one; image ``k`` uses
    ``seed + k``. ``partial_images``: previews (0-3), the first after one step (:func:`preview_steps`).
    ``rewrite`` None: the prompt goes through the text model when one is loaded (True: it must; False: never),
    with ``system_prompt`` and at most ``max_text_tokens`` tokens.
    """

    prompt: str
    images: tuple[np.ndarray, ...] = ()
    mask: np.ndarray | None = None
    size: tuple[int, int] | None = None
    n: int = 1
    steps: int | None = None
    guidance_scale: float | None = None
    seed: int | None = None
    partial_images: int = 0
    rewrite: bool | None = None
    system_prompt: str = REWRITE_SYSTEM_PROMPT
    max_text_tokens: int = MAX_TEXT_TOKENS
    request_id: str = field(default_factory=lambda: next_request_id("img"))

    def __post_init__(self) -> None:
        if not isinstance(self.images, tuple):
            object.__setattr__(self, "images", tuple(self.images))
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise InvalidRequestError("prompt must be a non-empty string", "prompt")
        if len(self.prompt) > MAX_PROMPT_CHARS:
            raise InvalidRequestError(f"prompt is longer than {MAX_PROMPT_CHARS} characters", "prompt")
        for image in self.images:
            instance(image, np.ndarray, "image")
            if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3 or 0 in image.shape:
                raise InvalidRequestError("images must be non-empty uint8 RGB arrays (h, w, 3)", "image")
        if self.mask is not None:
            instance(self.mask, np.ndarray, "mask")
            if self.mask.dtype == np.bool_:  # True: may change
                object.__setattr__(self, "mask", self.mask.astype(np.float32))
            if self.mask.dtype.kind != "f":
                raise InvalidRequestError(
                    f"the mask must be float values in [0, 1] (1: may change), got dtype {self.mask.dtype}", "mask"
                )
            if not self.images:
                raise InvalidRequestError("a mask needs an image to edit", "mask")
            if self.mask.ndim != 2 or self.mask.shape != self.images[0].shape[:2]:
                h, w = self.images[0].shape[:2]
                raise InvalidRequestError(f"the mask must have the size of the first image ({w}x{h})", "mask")
        if self.size is not None:
            if not isinstance(self.size, tuple | list) or len(self.size) != 2:
                raise InvalidRequestError(f"size must be (width, height) in pixels, got {self.size!r}", "size")
            object.__setattr__(self, "size", (whole(self.size[0], "size", low=1), whole(self.size[1], "size", low=1)))
        object.__setattr__(self, "n", whole(self.n, "n"))
        if self.steps is not None:
            object.__setattr__(self, "steps", whole(self.steps, "num_inference_steps"))
        if self.guidance_scale is not None:
            object.__setattr__(self, "guidance_scale", real(self.guidance_scale, "guidance_scale"))
        object.__setattr__(self, "seed", check_seed(self.seed))
        object.__setattr__(self, "partial_images", whole(self.partial_images, "partial_images"))
        object.__setattr__(self, "max_text_tokens", whole(self.max_text_tokens, "max_text_tokens"))
        if self.rewrite is not None:
            object.__setattr__(self, "rewrite", flag(self.rewrite, "rewrite"))
        if not 1 <= self.n <= MAX_IMAGES:
            raise InvalidRequestError(f"n must be between 1 and {MAX_IMAGES}, got {self.n}", "n")
        if self.steps is not None and self.steps < 1:
            raise InvalidRequestError(f"num_inference_steps must be >= 1, got {self.steps}", "num_inference_steps")
        if self.guidance_scale is not None and not 0 <= self.guidance_scale <= 50:
            raise InvalidRequestError(f"guidance_scale must be in [0, 50], got {self.guidance_scale}", "guidance_scale")
        if not 0 <= self.partial_images <= MAX_PARTIAL_IMAGES:
            raise InvalidRequestError(
                f"partial_images must be between 0 and {MAX_PARTIAL_IMAGES}, got {self.partial_images}",
                "partial_images",
            )
        if self.max_text_tokens < 1:
            raise InvalidRequestError(f"max_text_tokens must be >= 1, got {self.max_text_tokens}", "max_text_tokens")

    @property
    def mode(self) -> ImageMode:
        return ImageMode.EDIT if self.images else ImageMode.GENERATE


@runtime_checkable
class ImageFamily(Protocol):
    """``kind == "image"``: ``image_stage`` validates now and returns one ``Stage[TextDelta, Image]``.

    The stage's prompt is its upstream's text (a rewriting text stage) or, with no upstream deltas, the
    request's prompt. It counts usage under :data:`USAGE_IMAGE` and :data:`USAGE_IMAGE_INPUT`, yields at most
    ``partial_images`` previews, then ``n`` final images; leaving it (any way) stops the request within one
    denoising step and frees what it holds.
    """

    info: ImageInfo

    def image_stage(self, request: ImageRequest, ctx: RequestContext) -> Stage[TextDelta, Image]: ...

    def count_text_tokens(self, text: str) -> int: ...

    async def aclose(self) -> None: ...


# --- policy (pure) --------------------------------------------------------------------------------------------


def output_size(info: ImageInfo, request: ImageRequest) -> tuple[int, int]:
    """The ``(width, height)`` a request paints: its ``size``, else the first input fitted to the model's
    bounds (aspect kept, sides rounded down to ``size_multiple``), else the model's default."""
    if request.size is not None:
        return request.size
    if not request.images:
        return info.default_size
    h, w = request.images[0].shape[:2]
    scale = min(1.0, info.max_side / max(w, h))
    m = info.size_multiple
    fit = [max(info.min_side, int(side * scale) // m * m) for side in (w, h)]
    return fit[0], fit[1]


def check_request(info: ImageInfo, request: ImageRequest) -> tuple[int, int]:
    """Raise InvalidRequestError (naming the field) unless ``info``'s model can serve ``request``; its size."""
    if request.mode not in info.modes:
        if request.mode is ImageMode.GENERATE:
            raise InvalidRequestError(f"{info.model_name} edits images: send an image to edit", "image")
        raise InvalidRequestError(f"{info.model_name} does not edit images (text to image only)", "image")
    if len(request.images) > info.max_input_images:
        raise InvalidRequestError(
            f"{info.model_name} takes at most {info.max_input_images} input image(s), got {len(request.images)}",
            "image",
        )
    width, height = size = output_size(info, request)
    if min(size) < info.min_side or max(size) > info.max_side:  # the range first: no multiple helps a size out of it
        raise InvalidRequestError(
            f"size {width}x{height}: each side must be between {info.min_side} and {info.max_side} pixels", "size"
        )
    m = info.size_multiple
    if width % m or height % m:
        raise InvalidRequestError(f"size {width}x{height}: width and height must be multiples of {m}", "size")
    if request.steps is not None and request.steps > info.max_steps:
        raise InvalidRequestError(
            f"num_inference_steps must be at most {info.max_steps}, got {request.steps}", "num_inference_steps"
        )
    steps = request.steps if request.steps is not None else info.default_steps
    if request.mode is ImageMode.EDIT and steps < info.min_edit_steps:
        raise InvalidRequestError(
            f"num_inference_steps must be at least {info.min_edit_steps} for an edit with {info.model_name} (it "
            f"denoises a share of the steps asked), got {steps}"
            + ("" if request.steps is not None else " (its default)"),
            "num_inference_steps",
        )
    return size


def preview_steps(steps: int, partial_images: int) -> tuple[int, ...]:
    """After which finished steps (1-based) a preview is made: at most ``partial_images``, the first after step 1
    and the rest evenly spaced over the steps after it (``1 + round((steps - 1) * k / partial_images)``), never
    after the last step (that one is the final image). A preview shows the scheduler's estimate of the finished
    picture, which has its layout after one step, so the first comes as soon as there is one to show."""
    if steps < 2 or partial_images < 1:
        return ()
    picks = {min(steps - 1, 1 + round((steps - 1) * k / partial_images)) for k in range(partial_images)}
    return tuple(sorted(picks))


def image_tokens(info: ImageInfo, width: int, height: int) -> int:
    """Latent tokens of a ``width`` x ``height`` image (usage)."""
    return max(1, width // info.token_pixels) * max(1, height // info.token_pixels)


def composite(edited: np.ndarray, original: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``edited`` where ``mask`` is 1, ``original`` where it is 0 (uint8 ``(h, w, 3)``; float mask ``(h, w)``)."""
    m = mask[..., None].astype(np.float32)
    out: np.ndarray = edited.astype(np.float32) * m + original.astype(np.float32) * (1.0 - m)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


# --- the pipeline ---------------------------------------------------------------------------------------------


def uses_text(request: ImageRequest, models: ModelSet) -> bool:
    """Whether ``request`` runs the rewriting text stage (a text model is loaded, and it did not opt out)."""
    if request.rewrite is None:
        return ModelKind.TEXT in models
    return request.rewrite


def rewrite_request(request: ImageRequest) -> TextRequest:
    """The text model's request: the system prompt and the user's instruction."""
    messages = (ChatMessage(Role.SYSTEM, request.system_prompt), ChatMessage(Role.USER, request.prompt))
    return TextRequest(messages=messages, max_tokens=request.max_text_tokens, seed=request.seed)


def image_family(models: ModelSet) -> ImageFamily:
    family = models.get(ModelKind.IMAGE)
    assert isinstance(family, ImageFamily)  # checked when it was loaded
    return family


def resolve_image(models: ModelSet, request: ImageRequest, voices: object = None) -> ImageRequest:
    """The engine's check of an image request against the loaded image model (:func:`check_request`)."""
    check_request(image_family(models).info, request)
    return request


def build_image(models: ModelSet, request: ImageRequest, ctx: RequestContext) -> Plan:
    family = image_family(models)
    paint = StagePlan("image", family.image_stage(request, ctx))
    if not uses_text(request, models):
        return Plan((paint,))
    text = prompt_blamed(models.text().text_stage(rewrite_request(request), ctx), request)
    limit = family.info.max_prompt_tokens
    if limit is None:
        return Plan((StagePlan("text", text, emit=True), paint))
    # The consumer sees the rewrite as bounded: the prompt the image model reads, whole.
    bound = bounded_rewrite(family.count_text_tokens, limit)
    return Plan((StagePlan("rewrite", text), StagePlan("text", bound, emit=True), paint))


def prompt_blamed(rewrite: Stage[object, TextDelta], request: ImageRequest) -> Stage[object, TextDelta]:
    """The rewriting text stage, its refusals named by the image request's fields (its text request's ``messages``
    are the ``prompt`` with the rewrite's instructions, its ``max_tokens`` the ``max_text_tokens``): a prompt the text
    model cannot fit, or that leaves it too little room to write, is blamed on ``prompt`` (over HTTP the one field of
    the two a client sends), on ``max_text_tokens`` where that was raised from its default."""
    raised = request.max_text_tokens != MAX_TEXT_TOKENS
    fields = {"messages": "prompt", "max_tokens": "max_text_tokens" if raised else "prompt"}

    async def rewrite_stage(ctx: RequestContext, upstream: AsyncIterator[object]) -> AsyncIterator[TextDelta]:
        try:
            async with aclosing(rewrite(ctx, upstream)) as deltas:  # type: ignore[type-var]  # a generator
                async for delta in deltas:
                    yield delta
        except InvalidRequestError as exc:
            if exc.param not in fields:
                raise
            message = f"{exc.message} (the text model that rewrites the image prompt reads it with its instructions)"
            raise InvalidRequestError(message, fields[exc.param]) from exc

    rewrite_stage.__name__ = "rewrite"
    return rewrite_stage


async def prompt_of(upstream: AsyncIterator[TextDelta], fallback: str) -> str:
    """The rewritten prompt: every upstream delta joined (the whole text stage) as the client saw them, or
    ``fallback`` if it wrote only whitespace. Not stripped: the client is told the encoder read the text it saw, and
    a trailing character that ``str.strip`` drops but the tokenizer counts (``\x1c``) made the two differ by a token."""
    text = "".join([delta.text async for delta in upstream])
    return text if text.strip() else fallback


IMAGE = PipelineSpec(
    "image",
    ImageRequest,
    (ModelKind.IMAGE,),
    build_image,
    description="(text model ->) prompt (+ image) -> image",
    resolve=resolve_image,
)

KIND = Kind(ModelKind.IMAGE, ImageFamily, (IMAGE,))  # listed in omni_stream.kinds
