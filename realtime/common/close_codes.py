"""The WebSocket close codes every socket of the server uses (RFC 6455, section 7.4.1), in one place."""

from __future__ import annotations

from enum import IntEnum


class CloseCode(IntEnum):
    NORMAL = 1000  # the session ended: the client closed it, it finished, or it sat idle past its timeout
    GOING_AWAY = 1001  # the server is shutting down
    POLICY = 1008  # refused: authentication, a bad first message, a model not served
    INTERNAL = 1011  # the server failed
