"""Grammars that constrain a reply: a forced tool call in the model's own format, or JSON output, as llguidance
Lark grammars (pure text; :mod:`omni_stream.text.constraint` compiles them).

Why llguidance (``benchmarks/grammar_libraries.py``: CPU, Qwen3's 151,646-token vocabulary, a tool-call schema
with an array of objects, a 300-token walk): a token mask took 7 us median / 11 us mean inside JSON strings and
48 / 61 us in structure, against xgrammar's 39 / 40 and 59 / 58 us and outlines-core's 350 / 378 and 380 / 357 us
(plus 2.2 ms to advance a token); on the same machine under load the order held inside strings (24 against 68 and
411 us median) and llguidance and xgrammar were even in structure (24 and 27 us). Compiling took 2 ms (lazy),
against 36-60 ms and 0.6-3 s. It ships as one dependency-free wheel (xgrammar pulls torch, Triton and
transformers pins), takes JSON Schema embedded in a Lark grammar (``%json``) so a call's tags and its arguments
are one grammar, and is maintained by the guidance project and used by vLLM, SGLang and llama.cpp.

JSON is generated compact-with-spaces (``", "`` and ``": "``, as ``json.dumps`` writes it) and without free
whitespace: a model (a random one most of all) could otherwise spend its whole budget on blanks.
"""

from __future__ import annotations

import json
from typing import Any

from omni_stream.errors import InvalidRequestError
from omni_stream.text.tool_parsers import ToolFormat
from omni_stream.text.tools import FormatKind, FunctionTool, ResponseFormat, ToolChoice, ToolMode

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _json(schema: Any, param: str) -> str:
    """A ``%json`` rule body for ``schema`` with :data:`JSON_OPTIONS` (a schema's own ``x-guidance`` options, an
    llguidance extension, override them); InvalidRequestError naming ``param`` for a schema that is no object."""
    if not isinstance(schema, dict):
        raise InvalidRequestError(f"a schema must be a JSON object, got {type(schema).__name__}", param)
    extra = schema.get("x-guidance", {})
    if not isinstance(extra, dict):
        raise InvalidRequestError("a schema's 'x-guidance' must be an object of llguidance's JSON options", param)
    return "%json " + json.dumps({**schema, "x-guidance": {**JSON_OPTIONS, **extra}}, ensure_ascii=False)


DEFINITION_KEYS = ("$defs", "definitions")  # where a JSON Schema keeps what its "#/$defs/..." references name


def _call_schema(name: str, arguments: dict[str, Any], args_key: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, args_key: arguments},
        "required": ["name", args_key],
        "additionalProperties": False,
    }


def _calls_schema(tools: list[FunctionTool], args_key: str) -> dict[str, Any]:
    """One schema for a call of any of ``tools``: each tool's arguments under its call object, their definitions
    (``$defs``, ``definitions``) moved to the root, where the references of the arguments' schemas (``#/$defs/X``:
    a pointer from the root, as pydantic writes them) find them. Two tools defining one name differently are
    refused (vLLM merges them the same way)."""
    found: dict[str, dict[str, Any]] = {key: {} for key in DEFINITION_KEYS}
    schemas = []
    for tool in tools:
        arguments = dict(tool.schema)
        for key in DEFINITION_KEYS:
            definitions = arguments.pop(key, None) or {}
            if not isinstance(definitions, dict):
                raise InvalidRequestError(f"tool {tool.name!r}: '{key}' must be an object of named schemas", "tools")
            for name, definition in definitions.items():
                if found[key].setdefault(name, definition) != definition:
                    raise InvalidRequestError(
                        f"tools define {key}/{name} differently: a forced call needs one definition of each name",
                        "tools",
                    )
        schemas.append(_call_schema(tool.name, arguments, args_key))
    root = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    return {**root, **{key: defs for key, defs in found.items() if defs}}


def tool_call_grammar(
    tools: tuple[FunctionTool, ...],
    choice: ToolChoice,
    format: ToolFormat,
    parallel: bool = True,
    tag_tokens: bool = False,
) -> str:
    """The reply as one call (or, with ``parallel`` and no named function, one or more) of ``choice``'s function or
    any of ``tools``.

    ``tag_tokens``: ``<tool_call>`` and ``</tool_call>`` are tokens of the vocabulary (Qwen3's): the grammar names
    those tokens (llguidance matches a token that is not plain text only by name), else it spells the tags.
    """
    chosen = [t for t in tools if choice.mode is not ToolMode.FUNCTION or t.name == choice.name]
    args_key = "arguments" if format is ToolFormat.HERMES else "parameters"
    body = _json(_calls_schema(chosen, args_key), "tools")
    if format is ToolFormat.HERMES:
        open_, close = ("<tool_call>", "</tool_call>") if tag_tokens else ('"<tool_call>"', '"</tool_call>"')
        call, sep = f'{open_} "\\n" body "\\n" {close}', '"\\n"'
    else:
        call, sep = "body", '"; "'
    # a named function is called once (vLLM's rule too), whatever parallel_tool_calls says
    start = f"call ({sep} call)*" if parallel and choice.mode is not ToolMode.FUNCTION else "call"
    return f"start: {start}\ncall: {call}\nbody: {body}\n"


def response_grammar(response_format: ResponseFormat) -> str:
    """The reply as one JSON value of ``response_format`` (any object for ``json_object``)."""
    if response_format.kind is FormatKind.JSON_SCHEMA:
        schema: dict[str, Any] = json.loads(response_format.schema or "{}")
    else:
        schema = {"type": "object"}
    return f"start: {_json(schema, 'response_format')}\n"


def request_grammar(
    tools: tuple[FunctionTool, ...],
    choice: ToolChoice,
    response_format: ResponseFormat,
    format: ToolFormat,
    parallel: bool = True,
    tag_tokens: bool = False,
) -> str | None:
    """The grammar a request's reply must follow, or None when it is free."""
    if choice.forces_call and tools:
        return tool_call_grammar(tools, choice, format, parallel, tag_tokens)
    if response_format.constrains:
        return response_grammar(response_format)
    return None


def schema_error(schema: str) -> str | None:
    """Why llguidance cannot enforce the JSON Schema ``schema`` (JSON text), or None when it can. Needs no model:
    a surface that holds no tokenizer (the realtime protocol) refuses such a schema when it is given."""
    import llguidance

    value = json.loads(schema)
    for key in DEFINITION_KEYS:
        if isinstance(value, dict) and value.get(key) is not None and not isinstance(value[key], dict):
            return f"'{key}' must be an object of named schemas"
    try:
        lark = f"start: {_json(value, 'schema')}\n"
        error = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(lark))
    except InvalidRequestError as exc:
        return exc.message
    except UnicodeEncodeError:  # a lone surrogate (JSON can spell one)
        return "the schema holds text that is not valid Unicode (an unpaired surrogate)"
    if not error:
        return None
    first = error.strip().splitlines()[0]
    return first.split(": ", 1)[1] if first.startswith("at ") and ": " in first else first
