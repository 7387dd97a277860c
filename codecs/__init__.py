"""Streaming wire audio formats, resampling and upload decoding (``omni_stream.codecs``; no other omni-stream imports).

Encoders and ``decode_audio`` are synchronous and CPU-bound: the serving layer calls them off the event loop.
"""

from __future__ import annotations

from .base import Encoder, EncoderState
from .decode import MAX_DECODE_SECONDS, decode_audio, sniff_container
from .encoders import encode_whole, open_encoder
from .errors import AudioDecodeError, CodecError, UnsupportedFormatError
from .formats import FORMATS, FormatInfo, extension, format_info, mime_type
from .g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from .resample import Resampler, resample
from .wav import WAV_HEADER_BYTES, wav_header

__all__ = [
    "FORMATS",
    "MAX_DECODE_SECONDS",
    "WAV_HEADER_BYTES",
    "AudioDecodeError",
    "CodecError",
    "Encoder",
    "EncoderState",
    "FormatInfo",
    "Resampler",
    "UnsupportedFormatError",
    "alaw_decode",
    "alaw_encode",
    "decode_audio",
    "encode_whole",
    "extension",
    "format_info",
    "mime_type",
    "open_encoder",
    "resample",
    "sniff_container",
    "ulaw_decode",
    "ulaw_encode",
    "wav_header",
]
