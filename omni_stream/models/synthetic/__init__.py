"""Synthetic TTS (``model_type: synthetic_tts``): deterministic tones, for tests and CPU benchmarks only.

``write_checkpoint(dir, **opts)`` writes a checkpoint the engine loads like any other:
``await AsyncEngine.from_pretrained(write_checkpoint(tmp_path / "synthetic"))``. Each voice speaks a sine
tone of its own pitch (:func:`tone_hz`); audio is exactly :func:`tone_samples` of the request's tone.
Text markers ``[[fail:step@K]]``, ``[[fail:seq@K]]`` and ``[[fail:stage@K]]`` make a request fail on purpose
(raising :class:`SyntheticFault`) in the model step, in its own sequence, or in its codec stage.
"""

from __future__ import annotations

from omni_stream.models.synthetic.config import (
    MODEL_TYPE,
    Faults,
    SyntheticConfig,
    tone_hz,
    tone_samples,
    write_checkpoint,
)
from omni_stream.models.synthetic.family import SyntheticFamily, load_family
from omni_stream.models.synthetic.model import (
    SyntheticCodec,
    SyntheticFault,
    SyntheticTalker,
    TalkerInput,
    parse_faults,
)

__all__ = [
    "MODEL_TYPE",
    "Faults",
    "SyntheticCodec",
    "SyntheticConfig",
    "SyntheticFamily",
    "SyntheticFault",
    "SyntheticTalker",
    "TalkerInput",
    "load_family",
    "parse_faults",
    "tone_hz",
    "tone_samples",
    "write_checkpoint",
]
