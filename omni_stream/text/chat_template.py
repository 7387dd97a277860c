"""What a chat template is given for a request: its messages and offered tools in the form templates take
(OpenAI's, with tool-call arguments as objects), the same for every family that applies a template itself."""

from __future__ import annotations

from typing import Any

from omni_stream.requests import TextRequest


def template_messages(request: TextRequest) -> list[dict[str, Any]]:
    return [m.template() for m in request.messages]


def template_tools(request: TextRequest) -> list[dict[str, Any]] | None:
    """The offered tools (None: none, so a template renders exactly as it would without the argument)."""
    return [t.template() for t in request.offered_tools] or None
