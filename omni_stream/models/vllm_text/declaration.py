"""Text generation on vLLM's AsyncLLM in process (selected by name: ``--llm-backend vllm``)."""

from __future__ import annotations

from omni_stream.family import FamilyDeclaration, ModelKind

FAMILIES = (
    FamilyDeclaration(
        name="vllm_text",
        label="vLLM",
        kind=ModelKind.TEXT,
        model_types=("vllm",),
        loader="omni_stream.models.vllm_text.family:load_family",
    ),
)
