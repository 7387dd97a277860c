"""Languages: one rule and one message for every model kind that takes a ``language``.

``Auto`` (any case, or nothing) leaves the language to the model. Any other value must be one the model lists
(case-insensitive), or the ISO 639-1 code of one (``en`` for ``English``, as Whisper's table names them); it comes
back in the model's spelling. A model that lists none takes any language.
"""

from __future__ import annotations

from collections.abc import Sequence

from omni_stream.errors import InvalidRequestError

AUTO = "Auto"


def language_error(value: object, allowed: Sequence[str], param: str = "language") -> InvalidRequestError:
    """The error for a language the model does not know, listing the ``allowed`` ones (``Auto`` first)."""
    listed = ", ".join(dict.fromkeys((AUTO, *allowed)))
    return InvalidRequestError(f"Unsupported language '{value}'. Supported: {listed}", param)


def is_auto(value: str | None) -> bool:
    """Whether ``value`` leaves the language to the model (None, empty or ``auto`` in any case)."""
    return value is None or not value.strip() or value.strip().lower() == "auto"


def resolve_language(value: str | None, languages: Sequence[str], param: str = "language") -> str:
    """``value`` in the model's spelling (``Auto`` when it leaves the choice to the model); an error naming
    ``param`` and the ``languages`` when the model does not list it (an empty list takes any language)."""
    if value is None or is_auto(value):
        return AUTO
    if not languages:
        return value.strip()
    key = value.strip().lower()
    by_name = {language.lower(): language for language in languages}
    # its name, else a code ("en") for a model that lists names (the table only for a value no name matched)
    found = by_name.get(key) or by_name.get(_code_names().get(key, ""))
    if found is None:
        raise language_error(value, languages, param)
    return found


def _code_names() -> dict[str, str]:
    """ISO 639-1 (and Whisper's few longer) codes -> lower-case language names, from transformers' Whisper table."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    return LANGUAGES
