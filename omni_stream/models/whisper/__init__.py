"""Whisper (``model_type: whisper``): speech to text, batched across requests on the scheduler.

``WhisperFamily`` serves the ``transcription`` pipeline; ``checkpoint`` writes tiny and real-size random
checkpoints in the hub layout (``omni-stream make-checkpoint --kind asr``); ``runner`` holds the batched decoder.
"""

from __future__ import annotations

from omni_stream.models.whisper.family import WhisperFamily, load_family

__all__ = ["WhisperFamily", "load_family"]
