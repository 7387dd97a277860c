"""Multipart bodies read as they arrive, within limits: refused (400) the moment a part, a count or the body
passes its bound, so an oversized upload is never held whole (nor spooled to disk).

Starlette's form parser bounds text fields but spools files of any size; this one keeps each file in memory up
to ``max_file_bytes`` and stops reading past it. The parsing is python-multipart's (the same state machine).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request
from starlette.types import Message

from omni_stream.realtime.common.body_limit import BodyTooLarge, limited
from omni_stream.realtime.common.errors import bad_request


@dataclass(slots=True, frozen=True)
class FormLimits:
    """Bounds of one multipart body (bytes and counts)."""

    max_file_bytes: int
    max_files: int
    max_field_bytes: int = 64 * 1024
    max_fields: int = 64
    overhead_bytes: int = 256 * 1024  # part headers and boundaries on top of the files and fields

    @property
    def max_body_bytes(self) -> int:
        return self.max_files * self.max_file_bytes + self.overhead_bytes + 16 * self.max_field_bytes


@dataclass(slots=True, frozen=True)
class FilePart:
    """One uploaded file: its form field, file name, declared type and bytes."""

    field: str
    filename: str
    content_type: str | None
    data: bytes


@dataclass(slots=True, frozen=True)
class Form:
    """The text fields (in order, repeats kept) and the files of a multipart body."""

    fields: tuple[tuple[str, str], ...] = ()
    files: tuple[FilePart, ...] = ()

    def values(self, name: str) -> list[str]:
        return [value for key, value in self.fields if key == name]

    def files_of(self, *names: str) -> list[FilePart]:
        return [part for part in self.files if part.field in names]


class PartTooLarge(BodyTooLarge):
    """A file or field over its own limit (the client may still be sending: drained like a body over its limit)."""

    def __init__(self, limit: int, param: str, what: str) -> None:
        super().__init__(limit, param)
        self.message = f"{what} '{param}' exceeds the maximum of {limit} bytes"
        self.args = (self.message,)


@dataclass(slots=True)
class _Part:
    headers: dict[bytes, bytes] = field(default_factory=dict)
    name: str = ""
    filename: str | None = None
    data: bytearray = field(default_factory=bytearray)


class _Collector:
    """python-multipart callbacks that enforce the limits as the bytes arrive."""

    def __init__(self, limits: FormLimits) -> None:
        self.limits = limits
        self.fields: list[tuple[str, str]] = []
        self.files: list[FilePart] = []
        self.part = _Part()
        self._header_name = b""
        self._header_value = b""
        self._n_files = 0
        self._n_fields = 0
        self.open_part: str | None = None  # the part whose bytes are being read (None between parts)
        self.ended = False  # the closing boundary was seen

    def on_part_begin(self) -> None:
        self.part = _Part()

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def on_header_end(self) -> None:
        self.part.headers[self._header_name.lower()] = self._header_value
        self._header_name = self._header_value = b""

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self.part.headers.get(b"content-disposition", b""))
        if b"name" not in options:
            raise bad_request('Invalid multipart body: a part has no Content-Disposition "name"')
        self.part.name = options[b"name"].decode("utf-8", "replace")
        self.open_part = self.part.name
        if b"filename" in options:
            self.part.filename = options[b"filename"].decode("utf-8", "replace")
            self._n_files += 1
            if self._n_files > self.limits.max_files:
                raise bad_request(f"Too many files: at most {self.limits.max_files}", self.part.name)
        else:
            self._n_fields += 1
            if self._n_fields > self.limits.max_fields:
                raise bad_request(f"Too many form fields: at most {self.limits.max_fields}")

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        part = self.part
        is_file = part.filename is not None
        limit = self.limits.max_file_bytes if is_file else self.limits.max_field_bytes
        if len(part.data) + (end - start) > limit:
            raise PartTooLarge(limit, part.name, "File" if is_file else "Field")
        part.data += data[start:end]

    def on_part_end(self) -> None:
        part = self.part
        if part.filename is None:
            try:
                self.fields.append((part.name, part.data.decode("utf-8")))
            except UnicodeDecodeError:
                raise bad_request(f"Field '{part.name}' is not valid UTF-8", part.name) from None
        else:
            content_type = part.headers.get(b"content-type")
            self.files.append(
                FilePart(
                    part.name, part.filename, content_type.decode("latin-1") if content_type else None, bytes(part.data)
                )
            )
        self.part = _Part()
        self.open_part = None

    def on_end(self) -> None:
        self.ended = True


async def read_form(request: Request, limits: FormLimits) -> Form:
    """Parse ``request``'s multipart body within ``limits`` (400 in the OpenAI shape otherwise)."""
    content_type = request.headers.get("content-type", "")
    kind, params = parse_options_header(content_type)
    if kind != b"multipart/form-data":
        sent = kind.decode("latin-1") or "no Content-Type"
        raise bad_request(f"{request.url.path} takes a multipart/form-data body, got {sent}")
    boundary = params.get(b"boundary")
    if not boundary:
        raise bad_request("Invalid multipart body: the Content-Type has no boundary")
    collector = _Collector(limits)
    callbacks = {name: getattr(collector, name) for name in dir(collector) if name.startswith("on_")}
    parser = MultipartParser(boundary, callbacks)  # type: ignore[arg-type]
    body = limited(request, limits.max_body_bytes)
    more = [True]  # whether the client is still sending, as of the last message read

    async def receive() -> Message:
        message = await body.receive()
        if message["type"] == "http.request":
            more[0] = bool(message.get("more_body", False))
        return message

    try:
        async for chunk in Request(body.scope, receive).stream():
            parser.write(chunk)
        parser.finalize()
    except PartTooLarge as exc:
        exc.more = more[0]  # a whole body already read has nothing left to drain: answer at once
        raise
    except FormParserError as exc:
        raise bad_request(f"Invalid multipart body: {exc}") from exc
    if not collector.ended:  # python-multipart's finalize() accepts a body that stops short
        where = f" inside the part '{collector.open_part}'" if collector.open_part else ""
        raise bad_request(
            f"Invalid multipart body: it was truncated{where} (it ended before its closing boundary)",
            collector.open_part,
        )
    return Form(tuple(collector.fields), tuple(collector.files))
