"""omni-stream: an asyncio streaming engine for omni-modality models."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omni_stream.chunks import Audio, Chunk, CodecFrames, Image, TextDelta, VideoChunk
    from omni_stream.requests import SamplingParams, SpeechRequest, TaskType, VoicePrompt

__version__ = "0.1.0"

# Imported on first use: `omni-stream --help` must not pay for torch (the chunks module imports it).
_EXPORTS = {
    "Audio": "omni_stream.chunks",
    "Chunk": "omni_stream.chunks",
    "CodecFrames": "omni_stream.chunks",
    "Image": "omni_stream.chunks",
    "TextDelta": "omni_stream.chunks",
    "VideoChunk": "omni_stream.chunks",
    "SamplingParams": "omni_stream.requests",
    "SpeechRequest": "omni_stream.requests",
    "TaskType": "omni_stream.requests",
    "VoicePrompt": "omni_stream.requests",
}

__all__ = [
    "Audio",
    "Chunk",
    "CodecFrames",
    "Image",
    "SamplingParams",
    "SpeechRequest",
    "TaskType",
    "TextDelta",
    "VideoChunk",
    "VoicePrompt",
    "__version__",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'omni_stream' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
