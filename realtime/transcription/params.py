"""Field validation of POST /v1/audio/transcriptions (a multipart form: strings, and repeated ``name[]`` fields).
Pure: no I/O; every problem is a 400 naming the field.

The fields are OpenAI's. Its options for what this server cannot produce are refused by name, never ignored:
timestamps (``verbose_json``, ``srt``, ``vtt``, ``timestamp_granularities[]``: the transcripts are decoded without
timestamp tokens), speaker labels (``diarized_json``, ``known_speaker_*``), log-probabilities (``include[]``) and
sampling (``temperature`` above 0: the decoder is greedy, which is what ``temperature=0`` asks of Whisper).
``chunking_strategy=auto`` is what every long recording gets (cuts at quiet points); a VAD configuration is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from omni_stream.realtime.common.errors import bad_request
from omni_stream.realtime.common.json_fields import boolean, number, optional, string

MAX_PROMPT_CHARS = 4096  # the decoder keeps the prompt's last tokens (Whisper: 223); a bound on the form field


class ResponseFormat(StrEnum):
    JSON = "json"  # {"text": ..., "usage": {...}}
    TEXT = "text"  # the transcript alone, text/plain


TIMESTAMP_FORMATS = ("verbose_json", "srt", "vtt")
CHUNKING = "'chunking_strategy' must be 'auto' (long audio is cut at its quietest points)"
FIELDS = frozenset({"model", "language", "prompt", "response_format", "temperature", "stream", "chunking_strategy"})
# OpenAI's array fields: the SDK repeats ``name[]`` per value (other clients may send ``name``); keyed without []
LISTS = frozenset({"timestamp_granularities", "include"})
UNSUPPORTED = {
    "known_speaker_names": "speaker labels are not produced",
    "known_speaker_references": "speaker labels are not produced",
    "keywords": "the decoder takes a 'prompt', not keywords",
    "languages": "name one 'language', or none to detect it",
}
FILES = frozenset({"file"})


@dataclass(slots=True, frozen=True)
class TranscriptionParams:
    """The validated fields of one transcription request."""

    model: str | None = None
    language: str | None = None  # None: detected (or the model's only language)
    prompt: str | None = None
    response_format: ResponseFormat = ResponseFormat.JSON
    stream: bool = False


def split_lists(fields: tuple[tuple[str, str], ...]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """A form's text fields as one value each, and the array fields' values by name (without ``[]``); 400 for a
    plain field given twice, an unknown field, or one of OpenAI's that this server refuses (module docstring)."""
    values: dict[str, str] = {}
    lists: dict[str, list[str]] = {}
    for key, value in fields:
        name = key.removesuffix("[]")
        if name.startswith("chunking_strategy["):  # the SDK's spelling of an object: a VAD configuration
            raise bad_request(CHUNKING, "chunking_strategy")
        if name in UNSUPPORTED:
            raise bad_request(f"'{name}' is not supported: {UNSUPPORTED[name]}", name)
        if name in LISTS:
            lists.setdefault(name, []).append(value)
        elif key == "file":  # a text part named file: the audio must come as a file part
            raise bad_request("'file' must be an uploaded file (a multipart file part), not a text field", "file")
        elif key not in FIELDS:
            raise bad_request(f"Unknown field '{key}'", key)
        elif key in values:
            raise bad_request(f"Field '{key}' is given more than once", key)
        else:
            values[key] = value
    return values, lists


def parse_params(values: Mapping[str, str], lists: Mapping[str, list[str]]) -> TranscriptionParams:
    """Validate the fields :func:`split_lists` returned."""
    for granularity in lists.get("timestamp_granularities", []):
        message = f"'timestamp_granularities' ({granularity!r}): timestamps are not produced here"
        raise bad_request(message, "timestamp_granularities")
    for item in lists.get("include", []):
        raise bad_request(f"'include' ({item!r}): log-probabilities are not returned by this route", "include")
    fmt = values.get("response_format", ResponseFormat.JSON).strip().lower()
    if fmt in TIMESTAMP_FORMATS:
        raise bad_request(
            f"'response_format' {fmt!r} needs timestamps, which are not produced here: use 'json' or 'text'",
            "response_format",
        )
    if fmt == "diarized_json":
        raise bad_request("'response_format' 'diarized_json': speaker labels are not produced here", "response_format")
    if fmt not in tuple(ResponseFormat):
        message = f"'response_format' must be 'json' or 'text', got {values['response_format']!r}"
        raise bad_request(message, "response_format")
    temperature = optional(values, "temperature", number, 0.0, 1.0, form=True)
    if temperature:
        raise bad_request(
            f"'temperature' {temperature:g}: transcripts are decoded greedily here; send 0 or leave it out",
            "temperature",
        )
    chunking = values.get("chunking_strategy")
    if chunking is not None and chunking.strip().lower() != "auto":
        raise bad_request(CHUNKING, "chunking_strategy")
    language = optional(values, "language", string, non_empty=True, limit=32, form=True)
    prompt = optional(values, "prompt", string, limit=MAX_PROMPT_CHARS, utf8=True, form=True)
    return TranscriptionParams(
        model=optional(values, "model", string, non_empty=True, form=True),
        language=language.strip().lower() if language is not None else None,
        prompt=prompt if prompt and prompt.strip() else None,
        response_format=ResponseFormat(fmt),
        stream=bool(optional(values, "stream", boolean, form=True)),
    )
