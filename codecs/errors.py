"""Codec exceptions. Both are ``ValueError``s; the serving layer maps them to its own error shapes."""

from __future__ import annotations


class CodecError(ValueError):
    """Base class of every error this package raises on purpose."""


class UnsupportedFormatError(CodecError):
    """The requested output format, sample rate or channel count is not supported."""


class AudioDecodeError(CodecError):
    """Input audio could not be decoded: empty, not audio, corrupt, truncated or too long."""
