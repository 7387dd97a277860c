"""Typed exceptions. Serving maps them to protocol error shapes; the engine never raises bare ``Exception``."""

from __future__ import annotations


class OmniStreamError(Exception):
    """Base class of every error the engine raises on purpose."""


class InvalidRequestError(OmniStreamError, ValueError):
    """A request field is wrong. ``param`` names the field (as the wire protocol spells it)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class UnsupportedTaskError(InvalidRequestError):
    """The task type does not fit the loaded checkpoint (e.g. VoiceDesign on a CustomVoice model)."""


class UnknownVoiceError(InvalidRequestError):
    """The voice (speaker) is neither built into the checkpoint nor uploaded."""


class ConfigError(OmniStreamError, ValueError):
    """A checkpoint's config is missing a field or holds an unsupported value."""


class AudioDecodeError(InvalidRequestError):
    """Uploaded or reference audio could not be decoded (corrupt, empty, not audio, too long)."""


class RequestCancelled(OmniStreamError):
    """The request was cancelled (client gone, ``input.cancel``, shutdown)."""


class DeadlineExceeded(OmniStreamError, TimeoutError):
    """A wait inside the engine ran past the request's deadline."""


class StageError(OmniStreamError):
    """Wraps nothing: raised only when a stage ends a stream without its final chunk."""


class EngineClosed(OmniStreamError):
    """The engine is shutting down or closed; no new requests are accepted."""


class UpstreamError(OmniStreamError):
    """A model served elsewhere failed: its server answered an error that is not the client's (5xx, refused
    credentials, an unknown model name, overload), the connection failed, or the stream broke off.

    ``status``: the upstream HTTP status (None when no response came).
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
