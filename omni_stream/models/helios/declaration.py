"""Helios, chunk-autoregressive video diffusion on diffusers' HeliosPipeline, as the registry finds it."""

from __future__ import annotations

from omni_stream.family import FamilyDeclaration, ModelKind

FAMILIES = (
    FamilyDeclaration(
        name="helios",
        label="Helios",
        kind=ModelKind.VIDEO,
        model_types=("HeliosPipeline",),
        loader="omni_stream.models.helios.family:load_family",
        # needs the [video] extra: without diffusers the no-argument engine leaves video out
        embedded_default="omni_stream.models.helios.checkpoint:embedded_default_checkpoint",
        writers={"video": "omni_stream.models.helios.checkpoint:make"},
    ),
)
