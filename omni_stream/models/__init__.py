"""The built-in model families, looked up by ``config.json`` ``model_type`` (see :mod:`omni_stream.family`).

Each family is one folder here; adding one means writing its folder and one line below. Loaders are named as
``"module[:attr]"`` paths so that nothing is imported before a checkpoint asks for it.
"""

from __future__ import annotations

from importlib.util import find_spec

BUILTIN_FAMILIES: dict[str, str] = {
    "qwen3_tts": "omni_stream.models.qwen3_tts.family",
    "synthetic_tts": "omni_stream.models.synthetic",
    "synthetic_lm": "omni_stream.models.synthetic.lm_family",
    "HeliosPipeline": "omni_stream.models.helios.family",
}

# The tiny random-weight checkpoint each kind serves when no model is given, as "module[:builder]".
EMBEDDED_DEFAULTS: dict[str, str] = {
    "speech": "omni_stream.models.qwen3_tts.family:embedded_default_checkpoint",
}
if find_spec("diffusers") is not None:  # the [video] extra: without it the default server speaks only
    EMBEDDED_DEFAULTS["video"] = "omni_stream.models.helios.checkpoint:embedded_default_checkpoint"
