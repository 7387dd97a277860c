"""Voices: built-in ones from the speech model's info, uploaded ones from a :class:`VoiceCatalog`.

The engine is given the catalog (the serving layer's voice store implements it: ``AsyncEngine.use_voices``) and
resolves every voice name through :func:`find_voice`, for every request that names one: a speech request, a spoken
chat reply, a realtime session's output voice. Names are case-insensitive; a built-in voice keeps the model's own
spelling. An uploaded voice is a cloning reference, so only a checkpoint that clones (task ``Base``) can use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from omni_stream.errors import InvalidRequestError, UnknownVoiceError
from omni_stream.family import SpeechInfo
from omni_stream.requests import TaskType, VoicePrompt


class UploadedVoice(Protocol):
    """What the engine reads of an uploaded voice: its reference audio (float32 mono at ``sample_rate`` Hz; empty
    when it was uploaded as a speaker embedding), the transcript, and the cloning prompt extracted from it by the
    checkpoint ``prompt_model`` names (:func:`model_key`; prompts do not carry across checkpoints)."""

    @property
    def name(self) -> str: ...

    @property
    def samples(self) -> np.ndarray: ...

    @property
    def sample_rate(self) -> int: ...

    @property
    def ref_text(self) -> str | None: ...

    @property
    def prompt(self) -> VoicePrompt | None: ...

    @property
    def prompt_model(self) -> str | None: ...


class VoiceCatalog(Protocol):
    """Uploaded voices by name. Both calls are cheap and do no I/O (they run on the event loop)."""

    def get(self, name: str) -> UploadedVoice | None:
        """The voice called ``name`` (any case), or None."""
        ...

    def names(self) -> Sequence[str]:
        """Every uploaded voice's name, lower-cased and sorted."""
        ...


@dataclass(slots=True, frozen=True)
class Voice:
    """A resolved voice name: built into the model (``builtin``, its spelling) or ``uploaded``."""

    builtin: str | None = None
    uploaded: UploadedVoice | None = None


def model_key(info: SpeechInfo) -> str:
    """Names the checkpoint a stored cloning prompt was extracted by."""
    return f"{info.model_type}:{info.model_name}"


def can_clone(info: SpeechInfo) -> bool:
    """Whether the model clones voices (task ``Base``): only such a model uses uploaded voices."""
    return TaskType.BASE in info.task_types


def builtin_voice(info: SpeechInfo, name: str) -> str | None:
    """The built-in voice called ``name`` (any case), in the model's spelling; None when there is none."""
    key = name.strip().lower()
    for voice in info.voices:
        if voice.lower() == key:
            return voice
    return None


def voice_names(info: SpeechInfo, catalog: VoiceCatalog | None) -> list[str]:
    """Sorted lower-case names of the voices the model offers: built-in ones, and uploaded ones when it clones."""
    names = {v.lower() for v in info.voices}
    if catalog is not None and can_clone(info):
        names |= set(catalog.names())
    return sorted(names)


def find_voice(info: SpeechInfo, catalog: VoiceCatalog | None, name: str) -> Voice:
    """The voice ``name`` names; InvalidRequestError naming ``voice`` (and the voices there are) otherwise."""
    builtin = builtin_voice(info, name)
    if builtin is not None:
        return Voice(builtin=builtin)
    uploaded = catalog.get(name.strip()) if catalog is not None else None
    if uploaded is None:
        listed = ", ".join(voice_names(info, catalog)) or "(none)"
        raise UnknownVoiceError(f"Invalid voice '{name}'. Supported: {listed}", "voice")
    if not can_clone(info):
        offered = ", ".join(voice_names(info, catalog)) or "no voices"
        raise InvalidRequestError(
            f"Voice '{name}' is an uploaded voice for cloning, which this checkpoint cannot do "
            f"(it offers {offered}); load a Base checkpoint to use it",
            "voice",
        )
    return Voice(uploaded=uploaded)


def voice_name(info: SpeechInfo, catalog: VoiceCatalog | None, name: str) -> str:
    """The voice ``name`` names, as the model spells it (an uploaded one: as it was uploaded); the error of
    :func:`find_voice` when there is none."""
    found = find_voice(info, catalog, name)
    if found.builtin is not None:
        return found.builtin
    assert found.uploaded is not None
    return found.uploaded.name


def check_new_voice(info: SpeechInfo, name: str | None = None, param: str = "audio_sample") -> None:
    """An upload (called ``name``, when known) can be stored: the model clones, and no built-in voice has that name."""
    if not can_clone(info):
        kinds = "/".join(TaskType(t).value for t in info.task_types)
        raise InvalidRequestError(
            f"This {kinds} checkpoint cannot clone voices, so it cannot use uploaded ones: "
            "voice uploads need a Base checkpoint",
            param,
        )
    if name is not None and builtin_voice(info, name) is not None:
        raise InvalidRequestError(f"'{name}' is a built-in voice; choose another name", "name")
