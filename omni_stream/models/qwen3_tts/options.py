"""Qwen3-TTS's own request options: what only this family understands travels here, in ``SpeechRequest.options``,
not in the engine's request types (the family declares the type in ``SpeechInfo.options``)."""

from __future__ import annotations

from dataclasses import dataclass

from omni_stream.requests import SamplingParams


@dataclass(slots=True, frozen=True)
class Qwen3TTSOptions:
    """``subtalker_sampling``: the code predictor's sampler (codes 1-15 of a frame; None: the checkpoint's
    ``generation_config.json``). ``non_streaming_mode``: the prompt layout, all text in the prefill (True) or one
    text token a step (False); None: the task's default, as the reference (:mod:`.prompt`)."""

    subtalker_sampling: SamplingParams | None = None
    non_streaming_mode: bool | None = None


def options_of(request_options: object) -> Qwen3TTSOptions:
    """A request's options as this family's (None: the defaults); the engine has checked their type."""
    if request_options is None:
        return Qwen3TTSOptions()
    assert isinstance(request_options, Qwen3TTSOptions), "the engine checks the options' type (validation.speech)"
    return request_options
