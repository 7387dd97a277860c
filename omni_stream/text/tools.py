"""Function tools and structured output of a text request: the tools offered, the choice among them, the calls a
reply makes, and the output format asked for (typed; the wire layers parse JSON into these).

JSON Schemas are held as JSON text of an object (a dict, from Python or the wire, is written with ``json.dumps``;
text is kept as given once it parses), so the types stay frozen and hashable and a schema travels unchanged to a
chat template, a grammar or an upstream server.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from omni_stream.errors import InvalidRequestError
from omni_stream.validation.fields import member

MAX_TOOLS = 128
MAX_SCHEMA_CHARS = 100_000  # a tool's parameters or a response schema, as JSON text
NO_PARAMETERS = '{"type": "object", "properties": {}}'


def schema_text(schema: object, param: str) -> str:
    """A JSON Schema as the types hold it: JSON text of an object (a dict, from Python or the wire, is written as
    JSON text), at most :data:`MAX_SCHEMA_CHARS` characters."""
    if isinstance(schema, dict):
        try:
            schema = json.dumps(schema, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError) as exc:  # a value JSON cannot hold, or nesting too deep
            raise InvalidRequestError(f"'{param}' is not JSON: {exc}", param) from None
    if not isinstance(schema, str):
        raise InvalidRequestError(f"'{param}' must be a JSON Schema object, got {type(schema).__name__}", param)
    if len(schema) > MAX_SCHEMA_CHARS:
        raise InvalidRequestError(f"'{param}' is longer than {MAX_SCHEMA_CHARS} characters of JSON", param)
    try:
        value = json.loads(schema)
    except (ValueError, RecursionError):
        raise InvalidRequestError(f"'{param}' is not valid JSON", param) from None
    if not isinstance(value, dict):
        raise InvalidRequestError(f"'{param}' must be a JSON object, got {type(value).__name__}", param)
    return schema


_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def is_function_name(name: object) -> bool:
    """OpenAI's rule for a function's (and a json_schema response format's) name: 1-64 ASCII letters, digits,
    ``_`` or ``-``."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


@dataclass(slots=True, frozen=True)
class FunctionTool:
    """A function the model may call: ``parameters`` is a JSON Schema (JSON text) of its arguments object."""

    name: str
    description: str | None = None
    parameters: str = NO_PARAMETERS
    strict: bool | None = None

    def __post_init__(self) -> None:
        if not is_function_name(self.name):
            raise InvalidRequestError(
                f"tool names are 1-64 letters, digits, '_' or '-', got {self.name!r}", "tools.function.name"
            )
        object.__setattr__(self, "parameters", schema_text(self.parameters, "tools.function.parameters"))

    @property
    def schema(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.parameters)
        return value

    def template(self) -> dict[str, Any]:
        """The tool as chat templates (and OpenAI's wire) take it: ``{"type": "function", "function": {...}}``."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.schema
        return {"type": "function", "function": function}


class ToolMode(StrEnum):
    AUTO = "auto"  # the model decides
    NONE = "none"  # no call: tools are not offered to the model
    REQUIRED = "required"  # at least one call (constrained decoding where the backend is ours)
    FUNCTION = "function"  # a call of the named function (likewise)


@dataclass(slots=True, frozen=True)
class ToolChoice:
    """``tool_choice``: a mode, and the function's name for :attr:`ToolMode.FUNCTION`."""

    mode: ToolMode = ToolMode.AUTO
    name: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", member(self.mode, ToolMode, "tool_choice"))
        if (self.mode is ToolMode.FUNCTION) != (self.name is not None):
            raise InvalidRequestError("a named tool choice needs the function's name, and only it", "tool_choice")

    @property
    def forces_call(self) -> bool:
        return self.mode in (ToolMode.REQUIRED, ToolMode.FUNCTION)

    def wire(self) -> str | dict[str, Any]:
        """OpenAI chat completions' form."""
        if self.mode is ToolMode.FUNCTION:
            return {"type": "function", "function": {"name": self.name}}
        return self.mode.value


AUTO = ToolChoice()


@dataclass(slots=True, frozen=True)
class ToolCall:
    """One call in a reply or in the history: ``arguments`` is JSON text of an object."""

    id: str
    name: str
    arguments: str

    def template(self) -> dict[str, Any]:
        """The call as chat templates take it (arguments as an object: templates render them with ``tojson``)."""
        try:
            args: Any = json.loads(self.arguments)
        except ValueError:
            args = self.arguments
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": args}}

    def wire(self) -> dict[str, Any]:
        """OpenAI's ``message.tool_calls[i]``."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(slots=True, frozen=True)
class ToolCallDelta:
    """A piece of the ``index``-th call of a streamed reply: its first piece carries ``id`` and ``name``; the
    ``arguments`` pieces join to the call's JSON arguments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def wire(self) -> dict[str, Any]:
        """OpenAI's ``delta.tool_calls[i]``."""
        out: dict[str, Any] = {"index": self.index}
        function: dict[str, Any] = {"arguments": self.arguments}
        if self.id is not None:
            out["id"] = self.id
            out["type"] = "function"
        if self.name is not None:
            function["name"] = self.name
        out["function"] = function
        return out


class FormatKind(StrEnum):
    TEXT = "text"
    JSON_OBJECT = "json_object"
    JSON_SCHEMA = "json_schema"


@dataclass(slots=True, frozen=True)
class ResponseFormat:
    """``response_format``: free text, any JSON object, or JSON valid against ``schema`` (JSON text)."""

    kind: FormatKind = FormatKind.TEXT
    schema: str | None = None
    name: str | None = None
    strict: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", member(self.kind, FormatKind, "response_format"))
        if (self.kind is FormatKind.JSON_SCHEMA) != (self.schema is not None):
            raise InvalidRequestError("a json_schema response format needs its schema, and only it", "response_format")
        if self.schema is not None:
            object.__setattr__(self, "schema", schema_text(self.schema, "response_format.json_schema.schema"))

    @property
    def constrains(self) -> bool:
        return self.kind is not FormatKind.TEXT

    def wire(self) -> dict[str, Any]:
        """OpenAI chat completions' form."""
        if self.kind is not FormatKind.JSON_SCHEMA:
            return {"type": self.kind.value}
        body: dict[str, Any] = {"name": self.name or "response", "schema": json.loads(self.schema or "{}")}
        if self.strict is not None:
            body["strict"] = self.strict
        return {"type": "json_schema", "json_schema": body}


TEXT_FORMAT = ResponseFormat()


def assemble(deltas: list[ToolCallDelta]) -> list[ToolCall]:
    """The calls that streamed ``deltas`` add up to, by index (pieces of one call join in order)."""
    calls: dict[int, list[str]] = {}
    heads: dict[int, tuple[str, str]] = {}
    for d in deltas:
        calls.setdefault(d.index, []).append(d.arguments)
        if d.id is not None and d.name is not None:
            heads[d.index] = (d.id, d.name)
    return [ToolCall(*heads[i], "".join(calls[i])) for i in sorted(calls) if i in heads]
