"""omni-stream: an asyncio streaming engine for omni-modality models.

The engine, the request types and the chunks a stream yields are importable from here::

    from omni_stream import AsyncEngine, SpeechRequest, TextRequest, ChatMessage, Role
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omni_stream.chunks import Audio, Chunk, CodecFrames, Image, StageOutput, TextDelta, VideoChunk
    from omni_stream.engine import AsyncEngine, ModelSource, Usage
    from omni_stream.images.spec import ImageRequest
    from omni_stream.requests import (
        ChatMessage,
        ChatRequest,
        Role,
        SamplingParams,
        SpeechRequest,
        SpokenReply,
        TaskType,
        TextRequest,
        VoicePrompt,
    )
    from omni_stream.transcription.spec import TranscriptionRequest
    from omni_stream.video.spec import PromptUpdate, VideoRequest

__version__ = "0.1.0"

# Imported on first use: `omni-stream --help` must not pay for torch (the chunks module imports it).
_EXPORTS = {
    "AsyncEngine": "omni_stream.engine",
    "ModelSource": "omni_stream.engine",
    "Usage": "omni_stream.engine",
    "Audio": "omni_stream.chunks",
    "Chunk": "omni_stream.chunks",
    "CodecFrames": "omni_stream.chunks",
    "Image": "omni_stream.chunks",
    "StageOutput": "omni_stream.chunks",
    "TextDelta": "omni_stream.chunks",
    "VideoChunk": "omni_stream.chunks",
    "ChatMessage": "omni_stream.requests",
    "ChatRequest": "omni_stream.requests",
    "Role": "omni_stream.requests",
    "SamplingParams": "omni_stream.requests",
    "SpeechRequest": "omni_stream.requests",
    "SpokenReply": "omni_stream.requests",
    "TaskType": "omni_stream.requests",
    "TextRequest": "omni_stream.requests",
    "VoicePrompt": "omni_stream.requests",
    "TranscriptionRequest": "omni_stream.transcription.spec",
    "ImageRequest": "omni_stream.images.spec",
    "PromptUpdate": "omni_stream.video.spec",
    "VideoRequest": "omni_stream.video.spec",
}

__all__ = [
    "AsyncEngine",
    "Audio",
    "ChatMessage",
    "ChatRequest",
    "Chunk",
    "CodecFrames",
    "Image",
    "ImageRequest",
    "ModelSource",
    "PromptUpdate",
    "Role",
    "SamplingParams",
    "SpeechRequest",
    "SpokenReply",
    "StageOutput",
    "TaskType",
    "TextDelta",
    "TextRequest",
    "TranscriptionRequest",
    "Usage",
    "VideoChunk",
    "VideoRequest",
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
