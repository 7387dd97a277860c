"""Speech requests: resolved against the loaded speech model and checked, once, before a pipeline runs.

:func:`resolve_speech` fills what the request leaves open (the task, the default voice, the model's spelling of the
voice and the language, an uploaded voice's cloning reference) and refuses, naming the field and the allowed values,
what the model cannot do. The order is the client's: a task the checkpoint cannot do is refused before anything
else about the request matters. Families receive resolved requests and check none of this again; the bounds
themselves (lengths, durations, frame budgets) are :mod:`omni_stream.speech.limits`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt

from omni_stream.errors import AudioDecodeError, InvalidRequestError, UnsupportedTaskError
from omni_stream.family import SpeechInfo
from omni_stream.family_registry import family_label
from omni_stream.requests import SpeechRequest, TaskType
from omni_stream.speech.limits import check_embedding, check_ref_seconds, check_text, check_transcript
from omni_stream.validation.audio import mono_float
from omni_stream.validation.language import resolve_language
from omni_stream.validation.voices import Voice, VoiceCatalog, find_voice, model_key, voice_names


def unsupported_task_message(family: str, kind: str, task: str, supported: tuple[str, ...] = ()) -> str:
    """vLLM-Omni's words for a task the checkpoint cannot do; ``kind`` is the checkpoint's own task."""
    if len(supported) > 1:
        return f"{family} checkpoint does not support task_type='{task}'. Supported: {', '.join(supported)}."
    return (
        f"{family} {kind} checkpoint does not support task_type='{task}'. "
        f"Use task_type='{kind}' or load the matching {task} checkpoint."
    )


def check_task(info: SpeechInfo, task: TaskType) -> None:
    """UnsupportedTaskError naming ``task_type`` and the checkpoint's kind unless the model does ``task``."""
    offered = tuple(TaskType(t) for t in info.task_types)
    if offered and TaskType(task) not in offered:
        message = unsupported_task_message(
            family_label(info.model_type),
            TaskType(info.default_task).value,
            TaskType(task).value,
            tuple(t.value for t in offered),
        )
        raise UnsupportedTaskError(message, "task_type")


def family_options(info: SpeechInfo, **fields: object) -> object | None:
    """The family's own options (``SpeechRequest.options``) from wire fields of the same names (None values are
    left out; none left: None); a field its options type does not have is refused, naming it."""
    given = {name: value for name, value in fields.items() if value is not None}
    if not given:
        return None
    takes = {f.name for f in dataclasses.fields(info.options)} if info.options is not None else set()
    for name in given:
        if name not in takes:
            label = family_label(info.model_type)
            raise InvalidRequestError(f"'{name}' is not supported by this model ({label} has no such option)", name)
    assert info.options is not None
    return info.options(**given)


def check_options(info: SpeechInfo, options: object | None) -> None:
    """``options`` are the family's own type (or None)."""
    if options is None:
        return
    if info.options is None or not isinstance(options, info.options):
        label = family_label(info.model_type)
        wanted = info.options.__name__ if info.options is not None else "none"
        raise InvalidRequestError(
            f"options of type {type(options).__name__} are not {label}'s (it takes: {wanted})", "options"
        )


def check_reference(audio: npt.ArrayLike, sample_rate: int, param: str = "ref_audio") -> np.ndarray:
    """Reference audio for cloning as float32 mono samples: non-empty, finite, ``sample_rate`` > 0, and
    :data:`~omni_stream.speech.limits.MIN_REF_SECONDS` to ``MAX_REF_SECONDS`` long."""
    samples = mono_float(audio, param, AudioDecodeError)
    if samples.size == 0:
        raise AudioDecodeError("reference audio must be non-empty mono samples", param)
    if sample_rate <= 0:
        raise InvalidRequestError(f"the reference audio's sample rate must be positive, got {sample_rate}", param)
    check_ref_seconds(samples.size / sample_rate, param)
    return samples


def _task(info: SpeechInfo, request: SpeechRequest, voice: Voice, reference_follows: bool) -> TaskType:
    """The request's task: its own, else Base when it carries a cloning reference (as vLLM-Omni infers from
    ``ref_audio``, ``ref_text`` or a speaker embedding), else the checkpoint's."""
    if request.task_type is not None:
        return TaskType(request.task_type)
    cloning = (
        voice.uploaded is not None
        or reference_follows
        or request.ref_audio is not None
        or request.voice_prompt is not None
        or bool(request.ref_text)
    )
    return TaskType.BASE if cloning else TaskType(info.default_task)


def _uploaded_reference(info: SpeechInfo, request: SpeechRequest, voice: Voice) -> dict[str, Any]:
    """The cloning fields an uploaded voice gives a request that brings no reference of its own."""
    uploaded = voice.uploaded
    assert uploaded is not None
    if request.ref_audio is not None or request.voice_prompt is not None:
        return {}
    if request.ref_text is not None and not request.x_vector_only_mode and uploaded.samples.size:
        check_transcript(request.ref_text, uploaded.samples.size / uploaded.sample_rate)  # its own, for this voice
    prompt = uploaded.prompt if uploaded.prompt_model == model_key(info) else None
    if prompt is not None and uploaded.samples.size == 0:  # uploaded as a speaker embedding
        return {"voice_prompt": prompt, "x_vector_only_mode": True}
    if prompt is not None and not request.x_vector_only_mode:
        return {"voice_prompt": prompt}
    if prompt is not None:
        return {"voice_prompt": dataclasses.replace(prompt, ref_codes=None)}
    if uploaded.samples.size == 0:
        raise InvalidRequestError(
            f"Voice '{uploaded.name}' holds a speaker embedding made for another checkpoint", "voice"
        )
    # no prompt from this checkpoint: the family extracts one from the stored audio
    fields: dict[str, Any] = {"ref_audio": uploaded.samples, "ref_sample_rate": uploaded.sample_rate}
    if request.ref_text is None:
        fields["ref_text"] = uploaded.ref_text
    return fields


def _check_cloning(info: SpeechInfo, request: SpeechRequest) -> None:
    prompt = request.voice_prompt
    if prompt is None and request.ref_audio is None:
        raise InvalidRequestError(
            "task_type 'Base' (voice cloning) needs a reference voice: give ref_audio or an uploaded voice",
            "ref_audio",
        )
    in_context = prompt.ref_codes is not None if prompt is not None else True
    ref_text = request.ref_text if request.ref_text is not None or prompt is None else prompt.ref_text
    if in_context and not request.x_vector_only_mode and not (ref_text or "").strip():
        raise InvalidRequestError(
            "in-context voice cloning needs ref_text (the transcript of the reference audio); "
            "set x_vector_only_mode to clone from the speaker embedding alone",
            "ref_text",
        )
    if prompt is not None:  # its size and values, by the rule a speaker embedding on the wire meets
        check_embedding(np.asarray(prompt.x_vector, dtype=np.float64).reshape(-1).tolist(), info.speaker_embedding_dim)


def resolve_speech(
    info: SpeechInfo, voices: VoiceCatalog | None, request: SpeechRequest, *, reference_follows: bool = False
) -> SpeechRequest:
    """``request`` resolved against the speech model ``info`` describes (see the module docstring).

    ``voices``: the uploaded voices (None: built-in ones only). ``reference_follows``: the caller will add the
    reference audio once it is loaded, so the request is checked before any audio is read; the rules about the
    reference (its transcript, its length) wait for its final form, which is resolved again. Streamed text is
    checked unit by unit, not here.
    """
    if request.task_type is not None:
        check_task(info, request.task_type)  # first: nothing else matters for a task it cannot do
    voice = find_voice(info, voices, request.voice) if request.voice else Voice()
    task = _task(info, request, voice, reference_follows)
    check_task(info, task)
    if isinstance(request.text, str):
        check_text(request.text, info.max_input_chars)
    fields: dict[str, Any] = {"task_type": task, "language": resolve_language(request.language, info.languages)}
    check_options(info, request.options)
    if voice.uploaded is not None and task is not TaskType.BASE:
        raise InvalidRequestError(
            f"Voice '{request.voice}' is an uploaded voice for cloning: it needs task_type='Base'", "voice"
        )
    if task is TaskType.CUSTOM_VOICE:
        name = voice.builtin or info.default_voice
        if name is None:
            listed = ", ".join(voice_names(info, voices)) or "(none)"
            raise InvalidRequestError(f"'voice' is required. Supported: {listed}", "voice")
        fields["voice"] = name
    elif task is TaskType.VOICE_DESIGN:
        if not (request.instructions or "").strip():
            raise InvalidRequestError("task_type 'VoiceDesign' needs instructions describing the voice", "instructions")
        fields["voice"] = voice.builtin
    else:
        fields["voice"] = None
        if voice.uploaded is not None:
            fields.update(_uploaded_reference(info, request, voice))
    resolved = dataclasses.replace(request, **fields)
    if task is TaskType.BASE and not reference_follows:
        if resolved.ref_audio is not None and resolved.voice_prompt is None:  # the audio first, then what it needs
            samples = check_reference(resolved.ref_audio, resolved.ref_sample_rate)
            resolved = dataclasses.replace(resolved, ref_audio=samples)
            if not resolved.x_vector_only_mode:
                check_transcript(resolved.ref_text, samples.size / resolved.ref_sample_rate)
        _check_cloning(info, resolved)
    return resolved
