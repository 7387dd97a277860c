"""The Qwen3-TTS family, as the registry finds it (:mod:`omni_stream.family_registry`)."""

from __future__ import annotations

from omni_stream.family import FamilyDeclaration, ModelKind

LABEL = "Qwen3-TTS"  # how messages name the family (vLLM-Omni's word for it)
MAKE = "omni_stream.models.qwen3_tts.checkpoint:make"

FAMILIES = (
    FamilyDeclaration(
        name="qwen3_tts",
        label=LABEL,
        kind=ModelKind.SPEECH,
        model_types=("qwen3_tts",),
        loader="omni_stream.models.qwen3_tts.family:load_family",
        embedded_default="omni_stream.models.qwen3_tts.family:embedded_default_checkpoint",
        writers={"custom_voice": MAKE, "voice_design": MAKE, "base": MAKE},
    ),
)
