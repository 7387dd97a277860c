"""The built-in model families, looked up by ``config.json`` ``model_type`` (see :mod:`omni_stream.family`).

Each family is one folder here; adding one means writing its folder and one line below. Loaders are named as
``"module[:attr]"`` paths so that nothing is imported before a checkpoint asks for it.
"""

from __future__ import annotations

BUILTIN_FAMILIES: dict[str, str] = {
    "qwen3_tts": "omni_stream.models.qwen3_tts.family",
    "synthetic_tts": "omni_stream.models.synthetic",
    "synthetic_lm": "omni_stream.models.synthetic.lm_family",
    "qwen3": "omni_stream.models.causal_lm.family",
    "llama": "omni_stream.models.causal_lm.family",
    "vllm": "omni_stream.models.vllm_text.family",
    "openai": "omni_stream.models.openai_text.family",
    "whisper": "omni_stream.models.whisper.family",
    "synthetic_asr": "omni_stream.models.synthetic.asr_family",
    # diffusers pipeline directories: model_index.json's _class_name is the model type
    "StableDiffusionPipeline": "omni_stream.models.diffusers_image.family",
    "StableDiffusionInstructPix2PixPipeline": "omni_stream.models.diffusers_image.family",
    "QwenImageEditPipeline": "omni_stream.models.diffusers_image.family",
    "HeliosPipeline": "omni_stream.models.helios.family",
}

# The tiny random-weight checkpoint each kind serves when no model is given, as "module[:builder]".
EMBEDDED_DEFAULTS: dict[str, str] = {
    "speech": "omni_stream.models.qwen3_tts.family:embedded_default_checkpoint",
    "text": "omni_stream.models.causal_lm.family:embedded_default_checkpoint",
    "transcription": "omni_stream.models.whisper.checkpoint:embedded_default_checkpoint",
    "image": "omni_stream.models.diffusers_image.checkpoint:embedded_default_checkpoint",
    "video": "omni_stream.models.helios.checkpoint:embedded_default_checkpoint",
}
# A default whose family needs an extra that is not installed (diffusers: [image], [video]) is left out of the
# no-argument engine, not an error (omni_stream.family.default_available).
