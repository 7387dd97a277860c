"""Text requests: ``max_tokens`` against the model's context, and the prompt fitting it, for every text backend.

The engine checks ``max_tokens`` when a request arrives (:func:`check_max_tokens`); a backend that has tokenized
the prompt (off the event loop, in its stage) asks :func:`fit_prompt` how many tokens the reply may take, giving
only its token count. A spoken reply's speech fields are resolved once, for the whole reply
(:func:`resolve_chat`): each of its sentences is spoken with the same resolved voice and language.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from omni_stream.errors import InvalidRequestError
from omni_stream.family import TextInfo
from omni_stream.requests import ChatRequest, TextRequest
from omni_stream.validation.speech import resolve_speech
from omni_stream.validation.voices import VoiceCatalog

if TYPE_CHECKING:
    from omni_stream.pipeline_specs import ModelSet


def prompt_field(request: TextRequest) -> str:
    """The field a prompt that does not fit is blamed on: ``prompt`` for a raw prompt, else ``messages``."""
    return "prompt" if request.prompt is not None else "messages"


def check_max_tokens(info: TextInfo, max_tokens: int | None) -> None:
    """``max_tokens`` leaves the prompt at least one position of the model's context (when the context is known)."""
    if info.context_known and max_tokens is not None and max_tokens >= info.max_context:
        raise InvalidRequestError(
            f"max_tokens ({max_tokens}) must be less than the model's context of {info.max_context} tokens",
            "max_tokens",
        )


def fit_prompt(prompt_tokens: int, max_tokens: int | None, max_context: int, field: str = "messages") -> int:
    """Tokens the reply to a prompt of ``prompt_tokens`` may take within ``max_context``: ``max_tokens``, else the
    rest of the context. InvalidRequestError naming ``field`` when the prompt leaves no room, ``max_tokens`` when
    it leaves less than that."""
    room = max_context - prompt_tokens
    if room < 1:
        raise InvalidRequestError(
            f"the prompt ({prompt_tokens} tokens) does not fit the context of {max_context} tokens", field
        )
    if max_tokens is not None and max_tokens > room:
        raise InvalidRequestError(
            f"max_tokens ({max_tokens}) exceeds the {room} tokens left in the context of {max_context} after the "
            f"prompt ({prompt_tokens} tokens)",
            "max_tokens",
        )
    return max_tokens if max_tokens is not None else room


def check_images(info: TextInfo, request: TextRequest) -> None:
    """Images only go to a model that sees them."""
    if not info.sees_images and any(m.images for m in request.messages):
        raise InvalidRequestError(f"the text model {info.model_name!r} does not take images", "messages")


def resolve_text(models: ModelSet, request: TextRequest) -> TextRequest:
    """A text request checked against the loaded text model."""
    info = models.text().info
    check_max_tokens(info, request.max_tokens)
    check_images(info, request)
    return request


def resolve_chat(models: ModelSet, request: ChatRequest, voices: VoiceCatalog | None) -> ChatRequest:
    """A chat turn checked against the text model, and its spoken reply (if any) resolved against the speech model."""
    resolve_text(models, request.text)
    reply = request.speech
    if reply is None:
        return request
    template = resolve_speech(models.speech().info, voices, reply.request("-", request.request_id))
    return dataclasses.replace(request, speech=dataclasses.replace(reply, template=template))
