"""The native causal-LM family (Qwen3 and Llama hub checkpoints), as the registry finds it."""

from __future__ import annotations

from omni_stream.family import FamilyDeclaration, ModelKind

MAKE = "omni_stream.models.causal_lm.checkpoint:make"

FAMILIES = (
    FamilyDeclaration(
        name="causal_lm",
        label="Causal LM",
        kind=ModelKind.TEXT,
        model_types=("qwen3", "llama"),
        loader="omni_stream.models.causal_lm.family:load_family",
        embedded_default="omni_stream.models.causal_lm.family:embedded_default_checkpoint",
        writers={"chat": MAKE, "chat-llama": MAKE},
    ),
)
