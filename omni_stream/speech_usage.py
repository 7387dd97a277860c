"""Input tokens of a speech request, split by kind: text (input, instructions, a cloning transcript) and audio
(the reference audio's codec frames an in-context clone puts into the prompt).

Families record the split once their prompt is built (:func:`set_input_tokens`); readers take it with
:func:`input_tokens` (the split always adds up to ``ctx.input_tokens``). Kept beside the context rather than
in it, so the context stays free of speech vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

from omni_stream.context import RequestContext

_AUDIO_KEY = "speech.input_audio_tokens"


@dataclass(slots=True, frozen=True)
class InputTokens:
    """``text + audio == total``."""

    text: int
    audio: int

    @property
    def total(self) -> int:
        return self.text + self.audio


def set_input_tokens(ctx: RequestContext, *, text: int, audio: int = 0) -> None:
    """Record the prompt's input tokens: ``text`` tokens and ``audio`` (reference codec frames)."""
    if text < 0 or audio < 0:
        raise ValueError(f"token counts must be >= 0, got text={text}, audio={audio}")
    ctx.input_tokens = text + audio
    ctx.meta[_AUDIO_KEY] = audio


def input_tokens(ctx: RequestContext) -> InputTokens:
    """The split of ``ctx.input_tokens`` (all text when the family recorded no audio)."""
    audio = int(ctx.meta.get(_AUDIO_KEY, 0))
    audio = min(audio, ctx.input_tokens)
    return InputTokens(text=ctx.input_tokens - audio, audio=audio)
