"""OpenAI-shaped error bodies and the mapping from engine and codec exceptions to HTTP statuses."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from omni_stream import errors as engine_errors
from omni_stream.realtime.common.json_fields import FieldError

log = logging.getLogger("omni_stream.realtime")

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    409: "ConflictError",
    413: "BadRequestError",
    422: "BadRequestError",
    429: "RateLimitError",
    500: "InternalServerError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "TimeoutError",
}


class ApiError(Exception):
    """An error the client sees as ``{"error": {message, type, param, code}}`` with HTTP ``status``."""

    def __init__(self, status: int, message: str, param: str | None = None, type: str | None = None) -> None:
        # Messages may quote client text: keep them encodable whatever the client sent.
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type or _TYPES.get(status) or HTTPStatus(status).phrase.replace(" ", "")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param)


def _codec_decode_error() -> type[BaseException] | None:
    try:
        from omni_stream import codecs
    except ImportError:  # pragma: no cover - the codecs layer ships with the package
        return None
    return getattr(codecs, "AudioDecodeError", None)


def from_exception(exc: BaseException) -> ApiError:
    """Map any exception raised while serving a request to the error the client should see."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, engine_errors.InvalidRequestError | FieldError):
        return ApiError(400, exc.message, exc.param)
    codec_error = _codec_decode_error()
    if codec_error is not None and isinstance(exc, codec_error):
        return ApiError(400, f"Could not decode audio: {exc}", getattr(exc, "param", None))
    if isinstance(exc, engine_errors.EngineClosed):
        return ApiError(503, "The engine is shutting down")
    if isinstance(exc, engine_errors.DeadlineExceeded):
        return ApiError(504, f"Request timed out: {exc}")
    if isinstance(exc, engine_errors.UpstreamError):
        # A model served elsewhere (the remote text backend) failed: neither the client's fault nor ours.
        log.warning("upstream model failed: %s", exc.message)
        return ApiError(502, f"Bad gateway: {exc.message}")
    # Anything else is our fault, never the client's: 5xx (vLLM-Omni answers 400 here).
    log.exception("internal error while serving a request", exc_info=exc)
    return ApiError(500, f"Internal server error: {type(exc).__name__}: {exc}", type="InternalServerError")


async def http_exception_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    status = exc.status_code
    message = exc.detail if isinstance(exc.detail, str) else HTTPStatus(status).phrase
    if status == 404 and message == "Not Found":
        message = f"Not found: {request.method} {request.url.path}"
    return ApiError(status, message).response(headers=dict(exc.headers or {}))


async def api_error_handler(request: Request, exc: Exception) -> JSONResponse:
    return from_exception(exc).response()


async def internal_error_handler(request: Request, exc: Exception) -> JSONResponse:
    return from_exception(exc).response()
