"""Smart Turn v3.2, a trained end-of-turn model (pipecat-ai's wheel ships it), with our features and inference.

- :class:`SmartTurn` / :func:`load_smart_turn`: P(the speaker has finished) for a turn's audio (onnxruntime).
- :func:`~.features.log_mel`: the Whisper log-mel features it reads.
- :func:`available`: whether the model file and onnxruntime are installed.
"""

from __future__ import annotations

from omni_stream.models.smart_turn.features import SAMPLE_RATE, log_mel
from omni_stream.models.smart_turn.model import SmartTurn, available, load_smart_turn, model_path

__all__ = ["SAMPLE_RATE", "SmartTurn", "available", "load_smart_turn", "log_mel", "model_path"]
