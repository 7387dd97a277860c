"""Whisper's decoder prompt: special-token ids from ``generation_config.json``, languages, the request's prompt.

A transcription prompt is ``[<|startofprev|>, context...]`` (only with ``TranscriptionRequest.prompt``) then
``<|startoftranscript|>``, the language, ``<|transcribe|>`` (or ``<|translate|>``: English text of speech in any
language) and ``<|notimestamps|>`` (English-only models have neither language nor task, and do not translate).
With no language given, a multilingual model first detects it from ``<|startoftranscript|>`` alone, as
``transformers``' ``generate()`` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omni_stream.errors import ConfigError
from omni_stream.validation.language import language_error


@dataclass(slots=True, frozen=True)
class WhisperPrompt:
    """One request's decoder inputs: ``head`` (context + sot), its ``language`` token, ``tail`` (task +
    no-timestamps). ``detect``: the model is multilingual and the request named no language."""

    head: tuple[int, ...]
    language: int | None
    tail: tuple[int, ...]
    detect: bool = False

    def tokens(self, detected: int | None = None) -> tuple[int, ...]:
        """The whole prompt (with the ``detected`` language when the request named none)."""
        lang = detected if self.detect else self.language
        return (*self.head, *(() if lang is None else (lang,)), *self.tail)

    @property
    def length(self) -> int:
        return len(self.head) + len(self.tail) + (1 if self.detect or self.language is not None else 0)


@dataclass(slots=True, frozen=True)
class WhisperTokens:
    """The special ids a checkpoint's ``generation_config.json`` names, and its generation limits."""

    sot: int
    eot: int
    no_timestamps: int
    transcribe: int | None
    start_of_prev: int | None
    multilingual: bool
    languages: Mapping[str, int]  # language code ("en") -> token id
    suppress: tuple[int, ...]
    begin_suppress: tuple[int, ...]
    max_length: int  # decoder positions (prompt + generated)
    translate: int | None = None  # <|translate|>: multilingual models only

    @classmethod
    def from_generation_config(cls, gen: Mapping[str, Any], max_target_positions: int) -> WhisperTokens:
        def need(key: str) -> Any:
            if gen.get(key) is None:
                raise ConfigError(f"generation_config.json: {key} is required")
            return gen[key]

        multilingual = bool(gen.get("is_multilingual", False))
        tasks = gen.get("task_to_id") or {}
        lang_to_id = gen.get("lang_to_id") or {}
        if multilingual and not lang_to_id:
            raise ConfigError("generation_config.json: a multilingual model needs lang_to_id")
        return cls(
            sot=int(need("decoder_start_token_id")),
            eot=int(need("eos_token_id")),
            no_timestamps=int(need("no_timestamps_token_id")),
            transcribe=int(gen["task_to_id"]["transcribe"]) if multilingual else None,
            start_of_prev=gen.get("prev_sot_token_id"),
            multilingual=multilingual,
            languages={tok.strip("<|>"): int(i) for tok, i in lang_to_id.items()},
            suppress=tuple(int(t) for t in gen.get("suppress_tokens") or ()),
            begin_suppress=tuple(int(t) for t in gen.get("begin_suppress_tokens") or ()),
            max_length=min(int(gen.get("max_length") or max_target_positions), max_target_positions),
            translate=int(tasks["translate"]) if multilingual and "translate" in tasks else None,
        )

    @property
    def max_context(self) -> int:
        """Context text ids a prompt keeps (the last ones of ``TranscriptionRequest.prompt``): half the positions."""
        return max(0, self.max_length // 2 - 1)

    @property
    def max_prompt_length(self) -> int:
        """The longest prompt :meth:`prompt` makes (a full context, a language token where the model has them)."""
        return self.prompt(None, (self.eot,) * self.max_context).length

    def language_id(self, language: str | None) -> int | None:
        """The language token of ``language`` (a code ``"en"``, a name ``"English"`` or ``"<|en|>"``); None: detect
        (or, on an English-only model, no language token). InvalidRequestError names ``language`` otherwise."""
        if language is None or not language.strip() or language.strip().lower() == "auto":
            return None
        from transformers.models.whisper.tokenization_whisper import TO_LANGUAGE_CODE

        key = language.strip().lower().strip("<|>")
        code = TO_LANGUAGE_CODE.get(key, key)
        if not self.multilingual:
            if code == "en":
                return None
            raise language_error(language, ("en",))  # an English-only model
        if code not in self.languages:
            raise language_error(language, (*self.languages, "or a language name"))
        return self.languages[code]

    def prompt(self, language: int | None, context: tuple[int, ...] = (), translate: bool = False) -> WhisperPrompt:
        """The prompt for a language token (None: detect, on multilingual models) after ``context`` text ids;
        ``translate``: the ``<|translate|>`` task (the caller has checked :attr:`translate` exists)."""
        head = ((self.start_of_prev, *context) if context and self.start_of_prev is not None else ()) + (self.sot,)
        task = self.translate if translate else self.transcribe
        tail = (task, self.no_timestamps) if self.multilingual and task is not None else (self.no_timestamps,)
        return WhisperPrompt(head, language, tail, detect=self.multilingual and language is None)
