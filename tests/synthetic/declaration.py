"""The synthetic families (sine-tone TTS, echo LM, tone ASR) as the engine's registry takes them: declared by the tests
(``synthetic.register()``) or found through a dist-info's entry point (``synthetic.plugin_site``), never by the
installed package. No embedded default and no checkpoint writer: tests and benchmarks write their checkpoints."""

from __future__ import annotations

from omni_stream.family import FamilyDeclaration, ModelKind

FAMILIES = (
    FamilyDeclaration(
        name="synthetic_tts",
        label="Synthetic",
        kind=ModelKind.SPEECH,
        model_types=("synthetic_tts",),
        loader="synthetic.family:load_family",
    ),
    FamilyDeclaration(
        name="synthetic_lm",
        label="Synthetic LM",
        kind=ModelKind.TEXT,
        model_types=("synthetic_lm",),
        loader="synthetic.lm_family:load_family",
    ),
    FamilyDeclaration(
        name="synthetic_asr",
        label="Synthetic ASR",
        kind=ModelKind.TRANSCRIPTION,
        model_types=("synthetic_asr",),
        loader="synthetic.asr_family:load_family",
    ),
)
