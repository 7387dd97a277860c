"""Request bodies read through a byte limit: refused (400) before more than the limit is buffered; JSON parsing."""

from __future__ import annotations

import json
import re
from typing import Any

import anyio
from starlette.requests import Request
from starlette.types import Message, Receive

from omni_stream.realtime.common.errors import ApiError
from omni_stream.realtime.common.json_fields import FieldError

DRAIN_SECONDS = 5.0  # how long the rest of a refused body is read (and dropped) so the client sees the answer


class BodyTooLarge(ApiError):
    """A body over its limit: a 400 in the OpenAI error shape."""

    def __init__(self, limit: int, param: str | None = None, *, more: bool = True) -> None:
        super().__init__(400, f"Request body exceeds the maximum of {limit} bytes", param)
        self.limit = limit
        self.more = more  # the client is still sending: drain before answering


def declared_length(request: Request) -> int | None:
    """The ``Content-Length`` header as a number, or None when absent or malformed (chunked transfer)."""
    value = request.headers.get("content-length", "")
    return int(value) if value.isdigit() else None


def counting_receive(receive: Receive, limit: int, param: str | None = None) -> Receive:
    """``receive`` that raises :class:`BodyTooLarge` as soon as the body passes ``limit`` bytes."""
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge(limit, param, more=bool(message.get("more_body", False)))
        return message

    return wrapped


def limited(request: Request, limit: int, param: str | None = None) -> Request:
    """The same request whose body reads stop with :class:`BodyTooLarge` past ``limit`` bytes."""
    length = declared_length(request)
    if length is not None and length > limit:
        raise BodyTooLarge(limit, param)
    return Request(request.scope, counting_receive(request.receive, limit, param))


async def read_body(request: Request, limit: int, param: str | None = None) -> bytes:
    """The whole body, at most ``limit`` bytes (400 naming ``param`` otherwise, chunked transfer included)."""
    chunks: list[bytes] = []
    async for chunk in limited(request, limit, param).stream():
        chunks.append(chunk)
    return b"".join(chunks)


async def drain(receive: Receive, error: BaseException) -> None:
    """After a :class:`BodyTooLarge`, read and drop the rest of the body (at most its limit, ``DRAIN_SECONDS`` s).

    Closing a connection whose body is still arriving makes the kernel reset it, and the client then
    never reads the 400; a bounded drain lets it. Past either bound the connection is simply closed.
    """
    if not isinstance(error, BodyTooLarge) or not error.more:
        return
    limit, dropped = error.limit, 0
    with anyio.move_on_after(DRAIN_SECONDS):
        while dropped <= limit:
            message: Any = await receive()
            if message["type"] != "http.request":
                return
            dropped += len(message.get("body", b""))
            if not message.get("more_body", False):
                return


MAX_NUMBER_DIGITS = 40  # a JSON integer longer than this is no field's value (int64 has 19 digits)


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_NUMBER_DIGITS:
        raise ValueError(f"a number has {digits} digits (at most {MAX_NUMBER_DIGITS})")
    return int(text)


def text_over(text: str, limit: int) -> bool:
    """Whether a text message's UTF-8 form is longer than ``limit`` bytes (encoded only where its length cannot
    tell: a character is 1 to 4 bytes)."""
    return len(text) > limit or (len(text) * 4 > limit and len(text.encode("utf-8", "surrogatepass")) > limit)


# A JSON string can spell a lone UTF-16 surrogate (``"\\ud800"``), which no UTF-8 text holds: echoed in an event it
# fails the socket's send, handed to a tokenizer or a grammar compiler it raises deep inside. Only an escape can make
# one (UTF-8 bytes and a socket's text frames cannot), so a message without such an escape is never walked.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _lone_surrogate(value: Any, path: str) -> tuple[str, int] | None:
    """The path of the first string in ``value`` (keys included) that UTF-8 cannot carry, and where in it."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return path, exc.start
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            shown = key.encode("utf-8", "backslashreplace").decode("utf-8")  # the path stays sendable
            where = f"{path}.{shown}" if path else shown
            if (found := _lone_surrogate(key, where) or _lone_surrogate(item, where)) is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if (found := _lone_surrogate(item, f"{path}[{i}]")) is not None:
                return found
    return None


def parse_json(body: bytes | str) -> Any:
    """``json.loads`` that refuses absurdly long integers in its own words, not Python's int-digits message, and
    strings UTF-8 cannot carry (a :class:`FieldError` naming the field by its path, e.g. ``item.content[0].text``)."""
    value = json.loads(body, parse_int=_parse_int)
    text = body if isinstance(body, str) else body.decode(json.detect_encoding(body), "replace")  # as loads reads it
    if _SURROGATE_ESCAPE.search(text) and (found := _lone_surrogate(value, "")) is not None:
        path, at = found
        where = path or "body"
        raise FieldError(f"'{where}' is not valid Unicode text (unpaired surrogate at position {at})", where)
    return value


async def read_json(request: Request, limit: int) -> Any:
    """The body as JSON, at most ``limit`` bytes; 400 when it is empty, too large or not JSON."""
    body = await read_body(request, limit)
    if not body:
        raise ApiError(400, "Request body is empty: expected a JSON object")
    try:
        return parse_json(body)
    except FieldError as exc:
        raise ApiError(400, exc.message, exc.param) from None
    except (ValueError, RecursionError) as exc:  # ValueError covers JSON and UTF-8 errors; too deep nesting
        sent = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if sent.startswith(("multipart/", "application/x-www-form-urlencoded")):  # a form where JSON belongs
            raise ApiError(400, f"This route takes a JSON body (Content-Type: application/json), not {sent}") from None
        raise ApiError(400, f"Request body is not valid JSON: {exc}") from exc
