"""The Whisper transcription family, as the registry finds it."""

from __future__ import annotations

from omni_stream.family import FamilyDeclaration, ModelKind

FAMILIES = (
    FamilyDeclaration(
        name="whisper",
        label="Whisper",
        kind=ModelKind.TRANSCRIPTION,
        model_types=("whisper",),
        loader="omni_stream.models.whisper.family:load_family",
        embedded_default="omni_stream.models.whisper.checkpoint:embedded_default_checkpoint",
        writers={"asr": "omni_stream.models.whisper.checkpoint:make"},
    ),
)
