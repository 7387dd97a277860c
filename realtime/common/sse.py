"""Server-sent events framing: ``event:`` + ``data:`` lines, one JSON object per event."""

from __future__ import annotations

import json
from typing import Any

SSE_MEDIA_TYPE = "text/event-stream"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_event(event: str, data: dict[str, Any]) -> bytes:
    """One SSE event; the JSON is compact and never spans lines (json escapes newlines)."""
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"event: {event}\ndata: {payload}\n\n".encode()


def sse_data(data: dict[str, Any] | str) -> bytes:
    """A ``data:``-only event (OpenAI chat style); strings such as ``[DONE]`` pass through."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"data: {payload}\n\n".encode()
