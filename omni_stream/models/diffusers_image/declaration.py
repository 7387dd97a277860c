"""Image models on diffusers pipelines (model_index.json's ``_class_name`` is the model type)."""

from __future__ import annotations

from omni_stream.family import FamilyDeclaration, ModelKind

MAKE = "omni_stream.models.diffusers_image.checkpoint:make"

FAMILIES = (
    FamilyDeclaration(
        name="diffusers_image",
        label="diffusers",
        kind=ModelKind.IMAGE,
        model_types=("StableDiffusionPipeline", "StableDiffusionInstructPix2PixPipeline", "QwenImageEditPipeline"),
        loader="omni_stream.models.diffusers_image.family:load_family",
        # needs the [image] extra: without diffusers the no-argument engine leaves images out
        embedded_default="omni_stream.models.diffusers_image.checkpoint:embedded_default_checkpoint",
        writers={"image-edit": MAKE, "image-edit-qwen": MAKE, "image-generation": MAKE},
    ),
)
