"""omni-stream: an asyncio streaming engine for omni-modality models."""

from omni_stream.chunks import Audio, Chunk, CodecFrames, Image, Latents, TextDelta, VideoFrame
from omni_stream.requests import SamplingParams, SpeechRequest, TaskType, VoicePrompt

__version__ = "0.1.0"

__all__ = [
    "Audio",
    "Chunk",
    "CodecFrames",
    "Image",
    "Latents",
    "SamplingParams",
    "SpeechRequest",
    "TaskType",
    "TextDelta",
    "VideoFrame",
    "VoicePrompt",
    "__version__",
]
