"""API-key auth for every ``/v1`` HTTP and WebSocket route and the WebRTC offer routes under ``/rtc``: a Bearer
header, or (browsers) a WebSocket subprotocol. ``/rtc/config`` stays open: a page asks it before it has a key."""

from __future__ import annotations

import hashlib
import hmac

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from omni_stream.realtime.common.close_codes import CloseCode
from omni_stream.realtime.common.errors import ApiError

KEY_PROTOCOL_PREFIX = "openai-insecure-api-key."


def _digest(value: str) -> bytes:
    # Hash first so the comparison time depends on neither key's length.
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


def offered_subprotocols(headers: Headers) -> list[str]:
    """The subprotocols a WebSocket client offered, in order."""
    raw = ",".join(headers.getlist("sec-websocket-protocol"))
    return [p.strip() for p in raw.split(",") if p.strip()]


def select_subprotocol(offered: list[str]) -> str | None:
    """The subprotocol to accept: the first key-free one the client offered, never a key.

    Browsers fail the handshake unless the server echoes a subprotocol they offered, so a browser that
    carries the key in ``openai-insecure-api-key.KEY`` offers a key-free one beside it (``realtime``, as
    OpenAI's clients do) and that one is echoed. A client that offers only the key gets no subprotocol back:
    echoing it would write the key into every proxy's and browser's logs of the response headers.
    """
    plain = [p for p in offered if not p.startswith(KEY_PROTOCOL_PREFIX)]
    return plain[0] if plain else None


def presented_keys(headers: Headers, websocket: bool) -> list[str]:
    """Every credential the client presented: the Bearer token, and for WebSockets the key subprotocols."""
    keys = []
    auth = headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        keys.append(token.strip())
    if websocket:
        keys += [
            p[len(KEY_PROTOCOL_PREFIX) :] for p in offered_subprotocols(headers) if p.startswith(KEY_PROTOCOL_PREFIX)
        ]
    return keys


def key_matches(expected: str, presented: list[str]) -> bool:
    """Constant-time check that any presented key equals ``expected``."""
    want = _digest(expected)
    ok = False
    for key in presented:
        ok |= hmac.compare_digest(want, _digest(key))
    return ok


class ApiKeyMiddleware:
    """Refuses ``/v1`` and ``/rtc`` requests (but ``/rtc/config``) without the key: HTTP 401, WebSocket handshake
    closed with 1008 (HTTP 403)."""

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.api_key is None or scope["type"] not in ("http", "websocket") or not _protected(scope["path"]):
            await self.app(scope, receive, send)
            return
        websocket = scope["type"] == "websocket"
        if key_matches(self.api_key, presented_keys(Headers(scope=scope), websocket)):
            await self.app(scope, receive, send)
            return
        if websocket:
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": CloseCode.POLICY, "reason": "Invalid or missing API key"})
            return
        response = ApiError(401, "Invalid or missing API key", type="AuthenticationError").response(
            headers={"WWW-Authenticate": "Bearer"}
        )
        await response(scope, receive, send)


OPEN_PATHS = frozenset({"/rtc/config"})  # under a protected prefix, yet open


def _protected(path: str) -> bool:
    if path in OPEN_PATHS:
        return False
    return any(path == prefix or path.startswith(f"{prefix}/") for prefix in ("/v1", "/rtc"))
