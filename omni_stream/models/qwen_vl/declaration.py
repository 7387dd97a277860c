"""The Qwen2.5-VL family (a text model that sees images), as the registry finds it."""

from __future__ import annotations

from omni_stream.family import FamilyDeclaration, ModelKind

FAMILIES = (
    FamilyDeclaration(
        name="qwen_vl",
        label="Qwen2.5-VL",
        kind=ModelKind.TEXT,
        writers={"vl": "omni_stream.models.qwen_vl.checkpoint:make"},
    ),
)
