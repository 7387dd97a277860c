"""The types of a request's fields as the Python API receives them: one reader per kind of value.

The serving layer parses the wire into the request types, so a request built there has the right types already;
a request built in Python may not (``seed=np.int64(7)``, ``task_type="Base"``, ``temperature=float("nan")``,
``sampling={"temperature": 0.5}``). The request types' ``__post_init__`` read their fields through these, so a
wrong value is an :class:`~omni_stream.errors.InvalidRequestError` naming the field when the request is built,
never an exception from inside a batch step that every request sharing it would see. Numpy scalars are taken and
stored as Python numbers; ``bool`` is no number here (``True`` as a seed is a mistake, not 1).
"""

from __future__ import annotations

import math
import operator
from enum import Enum
from typing import TypeVar

import numpy as np

from omni_stream.errors import InvalidRequestError

E = TypeVar("E", bound=Enum)
T = TypeVar("T")


def _kind(value: object) -> str:
    return type(value).__name__


def whole(value: object, param: str, *, low: int | None = None, high: int | None = None) -> int:
    """``value`` as a Python int (an int or a numpy integer, never a bool or a float), within ``low..high``."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise InvalidRequestError(f"'{param}' must be an integer, got {_kind(value)}", param)
    n = operator.index(value)
    if (low is not None and n < low) or (high is not None and n > high):
        raise InvalidRequestError(f"'{param}' must be {span_words(low, high)}, got {n}", param)
    return n


def span_words(low: int | None, high: int | None) -> str:
    """``between 1 and 8``, ``at least 1`` or ``at most 8``: a range as a message says it."""
    if low is not None and high is not None:
        return f"between {low} and {high}"
    return f"at least {low}" if low is not None else f"at most {high}"


def real(value: object, param: str) -> float:
    """``value`` as a finite Python float (an int, a float or a numpy number, never a bool, NaN or infinite)."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.integer | np.floating):
        raise InvalidRequestError(f"'{param}' must be a number, got {_kind(value)}", param)
    x = float(value)
    if not math.isfinite(x):
        raise InvalidRequestError(f"'{param}' must be a finite number, got {x}", param)
    return x


def member(value: object, kind: type[E], param: str) -> E:
    """``value`` as a member of the enum ``kind`` (a member, or its value: ``"Base"`` for ``TaskType.BASE``)."""
    if isinstance(value, kind):
        return value
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in kind)
        raise InvalidRequestError(f"'{param}' must be one of {allowed}, got {value!r}", param) from None


def instance(value: object, kind: type[T], param: str) -> T:
    """``value``, which must be a ``kind`` (a typed part of a request: sampling parameters, a message, a tool)."""
    if not isinstance(value, kind):
        raise InvalidRequestError(f"'{param}' must be a {kind.__name__}, got {_kind(value)}", param)
    return value


def optional_text(value: object, param: str) -> None:
    """InvalidRequestError unless ``value`` is a string or None."""
    if value is not None and not isinstance(value, str):
        raise InvalidRequestError(f"'{param}' must be a string, got {_kind(value)}", param)


def flag(value: object, param: str) -> bool:
    """``value`` as a Python bool (a bool or a numpy bool; never a number or a string)."""
    if not isinstance(value, bool | np.bool_):
        raise InvalidRequestError(f"'{param}' must be True or False, got {_kind(value)}", param)
    return bool(value)


INT64 = (-(2**63), 2**63 - 1)  # a seed's range: OpenAI's and vLLM's seeds are 64-bit, as torch's generators take them


def check_seed(value: object) -> int | None:
    """A request's ``seed`` (None: none) as a Python int in the 64-bit range, for every kind of request."""
    return None if value is None else whole(value, "seed", low=INT64[0], high=INT64[1])
