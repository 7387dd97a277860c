"""The Qwen2.5-VL family (a text model that sees images), as the registry finds it."""

from __future__ import annotations

from omni_stream.family import FamilyDeclaration, ModelKind

FAMILIES = (
    FamilyDeclaration(
        name="qwen_vl",
        label="Qwen2.5-VL",
        kind=ModelKind.TEXT,
        model_types=("qwen2_5_vl",),
        loader="omni_stream.models.qwen_vl.family:load_family",
        writers={"vl": "omni_stream.models.qwen_vl.checkpoint:make"},
    ),
)
