"""Reading fields of a JSON request body: the words errors use for JSON types, and integer fields."""

from __future__ import annotations

import math
from typing import Any

from omni_stream.realtime.common.errors import bad_request


def type_name(value: Any) -> str:
    """The JSON name of ``value``'s type (``boolean``, ``integer``, ``number``, ``string``, ``array``, ``object``);
    the non-finite numbers Python's JSON reader accepts are named as written (``NaN``, ``Infinity``, ``-Infinity``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}.get(
        type(value), type(value).__name__
    )


def int_field(body: dict[str, Any], key: str, lo: int | None = None, hi: int | None = None) -> int | None:
    """``body[key]`` as an integer (None when absent; ``2.0`` counts as 2) within ``lo..hi``; else a 400 naming it."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{key}' must be an integer, got {type_name(value)}", key)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise bad_request(f"'{key}' must be between {lo} and {hi}, got {value}", key)
    return value
