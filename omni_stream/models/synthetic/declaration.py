"""The synthetic families (sine-tone TTS, echo LM, tone ASR), as the registry finds them. No embedded default
and no checkpoint writer: tests and CPU benchmarks write their checkpoints themselves."""

from __future__ import annotations

from omni_stream.family import FamilyDeclaration, ModelKind

FAMILIES = (
    FamilyDeclaration(
        name="synthetic_tts",
        label="Synthetic",
        kind=ModelKind.SPEECH,
        model_types=("synthetic_tts",),
        loader="omni_stream.models.synthetic.family:load_family",
    ),
    FamilyDeclaration(
        name="synthetic_lm",
        label="Synthetic LM",
        kind=ModelKind.TEXT,
        model_types=("synthetic_lm",),
        loader="omni_stream.models.synthetic.lm_family:load_family",
    ),
    FamilyDeclaration(
        name="synthetic_asr",
        label="Synthetic ASR",
        kind=ModelKind.TRANSCRIPTION,
        model_types=("synthetic_asr",),
        loader="omni_stream.models.synthetic.asr_family:load_family",
    ),
)
