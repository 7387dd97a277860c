"""Reading a process setting from the environment, checked: one copy of the parse and its error messages."""

from __future__ import annotations

import os
from collections.abc import Mapping

from omni_stream.errors import ConfigError


def milliseconds(name: str, default: float, env: Mapping[str, str] | None = None, *, most: float = 1000) -> float:
    """``$name`` as milliseconds within ``0..most`` (unset or blank: ``default``); a ConfigError naming it else."""
    raw = (os.environ if env is None else env).get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of milliseconds, got {raw!r}") from None
    if not 0 <= value <= most:
        raise ConfigError(f"{name} must be within 0..{most:g} ms, got {raw!r}")
    return value


def whole_numbers(
    name: str, allowed: frozenset[int], env: Mapping[str, str] | None = None, *, default: frozenset[int] = frozenset()
) -> frozenset[int]:
    """``$name`` as a comma-separated set of whole numbers from ``allowed`` (unset or blank: ``default``; ``none``:
    the empty set); a ConfigError naming it else."""
    raw = (os.environ if env is None else env).get(name, "").strip()
    if not raw:
        return default
    if raw.lower() == "none":
        return frozenset()
    parts = [p.strip() for p in raw.split(",")]
    if not all(p.isascii() and p.isdigit() and int(p) in allowed for p in parts):
        choices = ", ".join(str(a) for a in sorted(allowed))
        raise ConfigError(f"{name} must be 'none' or a comma-separated list of {choices}, got {raw!r}")
    return frozenset(int(p) for p in parts)


def flag(name: str, env: Mapping[str, str] | None = None, *, default: bool = False) -> bool:
    """``$name`` as on (``1``) or off (``0``; unset or blank: ``default``); a ConfigError naming it else."""
    raw = (os.environ if env is None else env).get(name, "").strip()
    if raw not in ("", "0", "1"):
        raise ConfigError(f"{name} must be 1 (on) or 0 (off), got {raw!r}")
    return default if not raw else raw == "1"
