"""Text generation on any OpenAI-compatible server (selected by name: ``--llm-endpoint``)."""

from __future__ import annotations

from omni_stream.family import FamilyDeclaration, ModelKind

FAMILIES = (
    FamilyDeclaration(
        name="openai_text",
        label="OpenAI-compatible server",
        kind=ModelKind.TEXT,
        model_types=("openai",),
        loader="omni_stream.models.openai_text.family:load_family",
    ),
)
