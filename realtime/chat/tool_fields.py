"""JSON fields of tools and structured output -> the engine's types (pure; shared by chat completions and realtime).

Two tool shapes: chat completions' ``{"type": "function", "function": {name, description, parameters, strict}}``
and the Realtime API's flat ``{"type": "function", name, description, parameters}``; ``tool_choice`` likewise
(``{"type": "function", "function": {"name"}}`` or ``{"type": "function", "name"}``). Every problem raises
:class:`~omni_stream.errors.InvalidRequestError` naming the field's path (``tools[1].function.parameters``); each
surface reports it in its own error shape. Whether a schema can be enforced is the text model's check.
"""

from __future__ import annotations

import json
from typing import Any

from omni_stream.errors import InvalidRequestError
from omni_stream.text import tools
from omni_stream.text.tools import (
    MAX_TOOLS,
    NO_PARAMETERS,
    FormatKind,
    FunctionTool,
    ResponseFormat,
    ToolCall,
    ToolChoice,
    ToolMode,
    is_function_name,
)

_TYPE = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}


def _kind(value: Any) -> str:
    return _TYPE.get(type(value), type(value).__name__)


def _obj(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidRequestError(f"'{path}' must be an object, got {_kind(value)}", path)
    return value


def _str(value: Any, path: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise InvalidRequestError(f"'{path}' must be a string, got {_kind(value)}", path)
    return value


def schema_text(value: Any, path: str) -> str:
    """A JSON Schema (an object) as JSON text, within :data:`~omni_stream.text.tools.MAX_SCHEMA_CHARS`."""
    return tools.schema_text(_obj(value, path), path)


def _tool(body: dict[str, Any], path: str, flat: bool) -> FunctionTool:
    if body.get("type", "function") != "function":
        raise InvalidRequestError(f"'{path}.type' must be 'function', got {body.get('type')!r}", f"{path}.type")
    fn = body if flat else _obj(body.get("function"), f"{path}.function")
    where = path if flat else f"{path}.function"
    name = _str(fn.get("name"), f"{where}.name")
    assert name is not None
    params = fn.get("parameters")
    strict = fn.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequestError(f"'{where}.strict' must be a boolean, got {_kind(strict)}", f"{where}.strict")
    try:
        return FunctionTool(
            name,
            _str(fn.get("description"), f"{where}.description", optional=True),
            schema_text(params, f"{where}.parameters") if params is not None else NO_PARAMETERS,
            strict,
        )
    except InvalidRequestError as exc:
        if exc.param == "tools.function.name":
            raise InvalidRequestError(exc.message, f"{where}.name") from None
        raise


def parse_tools(value: Any, *, flat: bool = False, field: str = "tools") -> tuple[FunctionTool, ...]:
    """``tools`` (None: none); ``flat``: the Realtime API's shape."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidRequestError(f"'{field}' must be an array, got {_kind(value)}", field)
    if len(value) > MAX_TOOLS:
        raise InvalidRequestError(f"'{field}' holds at most {MAX_TOOLS} tools, got {len(value)}", field)
    tools = tuple(_tool(_obj(t, f"{field}[{i}]"), f"{field}[{i}]", flat) for i, t in enumerate(value))
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise InvalidRequestError(f"'{field}' names a function twice", field)
    return tools


def parse_tool_choice(value: Any, *, flat: bool = False, field: str = "tool_choice") -> ToolChoice:
    """``tool_choice`` (None: auto)."""
    if value is None:
        return ToolChoice()
    if isinstance(value, str):
        if value in ("auto", "none", "required"):
            return ToolChoice(ToolMode(value))
        raise InvalidRequestError(f"'{field}' must be 'auto', 'none', 'required' or a function, got {value!r}", field)
    body = _obj(value, field)
    if body.get("type") != "function":
        raise InvalidRequestError(f"'{field}.type' must be 'function', got {body.get('type')!r}", f"{field}.type")
    path = f"{field}.name" if flat else f"{field}.function.name"
    fn = body if flat else _obj(body.get("function"), f"{field}.function")
    name = _str(fn.get("name"), path)
    return ToolChoice(ToolMode.FUNCTION, name)


def parse_response_format(value: Any, field: str = "response_format") -> ResponseFormat:
    """``response_format`` (None: text)."""
    if value is None:
        return ResponseFormat()
    body = _obj(value, field)
    kind = body.get("type")
    if kind not in ("text", "json_object", "json_schema"):
        raise InvalidRequestError(
            f"'{field}.type' must be 'text', 'json_object' or 'json_schema', got {kind!r}", f"{field}.type"
        )
    if kind != "json_schema":
        return ResponseFormat(FormatKind(kind))
    spec = _obj(body.get("json_schema"), f"{field}.json_schema")
    name = spec.get("name")
    if not is_function_name(name):
        got = "nothing" if name is None else repr(name)
        raise InvalidRequestError(
            f"'{field}.json_schema.name' is required: 1-64 letters, digits, underscores or dashes, got {got}",
            f"{field}.json_schema.name",
        )
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequestError(f"'{field}.json_schema.strict' must be a boolean", f"{field}.json_schema.strict")
    schema = schema_text(spec.get("schema", {}), f"{field}.json_schema.schema")
    return ResponseFormat(FormatKind.JSON_SCHEMA, schema, name, strict)


def parse_tool_calls(value: Any, path: str) -> tuple[ToolCall, ...]:
    """An assistant message's ``tool_calls`` (chat completions' shape; ``arguments`` JSON text)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidRequestError(f"'{path}' must be an array, got {_kind(value)}", path)
    calls = []
    for i, raw in enumerate(value):
        where = f"{path}[{i}]"
        body = _obj(raw, where)
        fn = _obj(body.get("function"), f"{where}.function")
        call_id = _str(body.get("id"), f"{where}.id")
        name = _str(fn.get("name"), f"{where}.function.name")
        args = fn.get("arguments", "{}")
        if isinstance(args, dict):
            args = json.dumps(args, ensure_ascii=False)
        arguments = _str(args, f"{where}.function.arguments")
        assert call_id is not None and name is not None and arguments is not None
        calls.append(ToolCall(call_id, name, arguments))
    return tuple(calls)
