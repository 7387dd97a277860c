"""Reading the fields of a JSON request body (or a form's): one reader per JSON type, each with one message.

Every reader takes the value and the field's name as the client spells it (``key``, a dotted path for nested
fields) and returns the value as the type it names, or raises :class:`FieldError` naming the field, what it must be
and what was sent. The HTTP routes answer a FieldError with a 400
(:func:`omni_stream.realtime.common.errors.from_exception`), the WebSocket protocols with their own ``error`` event.
``form=True`` reads a multipart form's text values: numbers and booleans may then come as strings (and numbers as
text fields).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Concatenate, ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off", "")


class FieldError(ValueError):
    """A request field of the wrong JSON type or out of its range: ``message`` names the field (``param``) and what
    it must be. HTTP answers it with a 400; a WebSocket protocol with its ``error`` event."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def type_name(value: object) -> str:
    """The JSON name of ``value``'s type (``boolean``, ``integer``, ``number``, ``string``, ``array``, ``object``);
    the non-finite numbers Python's JSON reader accepts are named as written (``NaN``, ``Infinity``, ``-Infinity``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
    return {**names, type(None): "null"}.get(type(value), type(value).__name__)


def _n(value: float) -> str:
    return str(value)  # 4 for an integer bound, 4.0 for a number's


def _within(value: float, key: str, lo: float | None, hi: float | None) -> None:
    if lo is not None and hi is not None and not lo <= value <= hi:
        raise FieldError(f"'{key}' must be between {_n(lo)} and {_n(hi)}, got {_n(value)}", key)
    if lo is not None and value < lo:
        raise FieldError(f"'{key}' must be at least {_n(lo)}, got {_n(value)}", key)
    if hi is not None and value > hi:
        raise FieldError(f"'{key}' must be at most {_n(hi)}, got {_n(value)}", key)


def unicode(value: str, key: str) -> str:
    """``value`` unchanged, unless it holds text UTF-8 cannot carry (a lone surrogate, which JSON can spell)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        message = f"'{key}' is not valid Unicode text (unpaired surrogate at position {exc.start})"
        raise FieldError(message, key) from None
    return value


def string(
    value: object,
    key: str,
    *,
    limit: int | None = None,
    non_empty: bool = False,
    utf8: bool = False,
    form: bool = False,
) -> str:
    """A string of at most ``limit`` characters (``non_empty``: with more than white space; ``utf8``: that UTF-8 can
    carry); ``form``: a number is taken as its text."""
    if form and isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise FieldError(f"'{key}' must be a string, got {type_name(value)}", key)
    if non_empty and not value.strip():
        raise FieldError(f"'{key}' must be a non-empty string", key)
    if limit is not None and len(value) > limit:
        raise FieldError(f"'{key}' is too long: {len(value)} characters (max {limit})", key)
    return unicode(value, key) if utf8 else value


def boolean(value: object, key: str, *, form: bool = False) -> bool:
    """``true`` or ``false``; ``form``: also their spellings in a form (``1``/``0``, ``yes``/``no``, ``on``/``off``)."""
    if isinstance(value, bool):
        return value
    if form and isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    sent = repr(value) if form else type_name(value)
    raise FieldError(f"'{key}' must be a boolean (true or false), got {sent}", key)


def integer(value: object, key: str, lo: int | None = None, hi: int | None = None, *, form: bool = False) -> int:
    """An integer within ``lo..hi`` (``2.0`` counts as 2); ``form``: also its digits as a string."""
    if form and isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise FieldError(f"'{key}' must be an integer, got {value!r}", key) from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(f"'{key}' must be an integer, got {type_name(value)}", key)
    _within(value, key, lo, hi)
    return value


def number(value: object, key: str, lo: float | None = None, hi: float | None = None, *, form: bool = False) -> float:
    """A finite number within ``lo..hi``; ``form``: also its text as a string."""
    if form and isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise FieldError(f"'{key}' must be a number, got {value!r}", key) from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FieldError(f"'{key}' must be a number, got {type_name(value)}", key)
    if not math.isfinite(value):
        raise FieldError(f"'{key}' must be a finite number, got {type_name(value)}", key)
    _within(value, key, lo, hi)
    return float(value)


def choice(value: object, key: str, allowed: tuple[str, ...], *, form: bool = False) -> str:
    """One of the ``allowed`` strings (``form``: compared trimmed and lower-cased)."""
    text = value.strip().lower() if form and isinstance(value, str) else value
    if not isinstance(text, str) or text not in allowed:
        choices = ", ".join(f"'{a}'" for a in allowed)
        raise FieldError(f"'{key}' must be one of {choices}, got {value!r}", key)
    return text


def obj(value: object, key: str) -> dict[str, Any]:
    """A JSON object."""
    if not isinstance(value, dict):
        raise FieldError(f"'{key}' must be an object, got {type_name(value)}", key)
    return value


def optional(
    body: Mapping[str, object],
    key: str,
    read: Callable[Concatenate[object, str, P], T],
    *args: P.args,
    **kwargs: P.kwargs,
) -> T | None:
    """``read(body[key], key, ...)``, or None when the field is absent or null."""
    value = body.get(key)
    return None if value is None else read(value, key, *args, **kwargs)


def int_field(body: Mapping[str, object], key: str, lo: int | None = None, hi: int | None = None) -> int | None:
    """``body[key]`` as an integer within ``lo..hi`` (None when absent or null)."""
    return optional(body, key, integer, lo, hi)
