"""From validated options to an engine :class:`SpeechRequest`: voice resolution and reference audio loading."""

from __future__ import annotations

import base64
import binascii
import dataclasses
from pathlib import Path
from urllib.parse import unquote, unquote_to_bytes, urlparse

import anyio
import anyio.to_thread
import numpy as np

from omni_stream import codecs
from omni_stream.errors import UnsupportedTaskError
from omni_stream.realtime.common.errors import bad_request
from omni_stream.realtime.speech.params import SpeechOptions
from omni_stream.realtime.state import ServerState
from omni_stream.requests import SpeechRequest, TaskType, VoicePrompt
from omni_stream.speech.limits import (
    MAX_REF_SECONDS,
    check_instructions,
    check_max_new_tokens,
    check_ref_seconds,
    check_text,
    family_label,
    unsupported_task_message,
)


def supported_voices(state: ServerState) -> list[str]:
    """Sorted lower-case names of the voices the model offers: built-in ones, and uploaded ones when it clones."""
    names = {v.lower() for v in state.ready_engine.speech_info.voices}
    if can_clone(state):
        names |= {v.key for v in state.voices.voices()}
    return sorted(names)


def model_key(state: ServerState) -> str:
    """Names the checkpoint a stored voice prompt came from."""
    info = state.ready_engine.speech_info
    return f"{info.model_type}:{info.model_name}"


def _builtin_voice(state: ServerState, name: str) -> str | None:
    for voice in state.ready_engine.speech_info.voices:
        if voice.lower() == name:
            return voice
    return None


async def decode_reference(state: ServerState, data: bytes, param: str) -> tuple[np.ndarray, int]:
    """Decode reference audio off the loop at the engine's rate; 400 unless its length is within the engine's
    bounds (:func:`omni_stream.speech.limits.check_ref_seconds`)."""
    rate = state.ready_engine.speech_info.sample_rate

    def decode() -> tuple[np.ndarray, float]:
        return codecs.decode_audio(data, rate, max_seconds=MAX_REF_SECONDS + 1.0)

    try:
        samples, seconds = await anyio.to_thread.run_sync(decode)
    except ValueError as exc:
        if "longer than" in str(exc):  # the decoder stopped past the bound: say so in the engine's words
            check_ref_seconds(MAX_REF_SECONDS + 1.0, param)
        raise bad_request(f"Could not decode '{param}': {exc}", param) from exc
    check_ref_seconds(seconds, param)
    return samples, rate


def can_clone(state: ServerState) -> bool:
    """Whether the loaded checkpoint clones voices (uploaded voices need a Base task)."""
    return TaskType.BASE in tuple(TaskType(t) for t in state.ready_engine.speech_info.task_types)


def check_task(state: ServerState, task: TaskType) -> None:
    """400 naming ``task_type`` and the checkpoint's kind when the checkpoint cannot do ``task`` (vLLM-Omni's words)."""
    info = state.ready_engine.speech_info
    offered = tuple(TaskType(t) for t in info.task_types)
    if offered and task not in offered:
        message = unsupported_task_message(
            family_label(info.model_type),
            TaskType(info.default_task).value,
            task.value,
            tuple(t.value for t in offered),
        )
        raise UnsupportedTaskError(message, "task_type")


def check_request(state: ServerState, request: SpeechRequest) -> None:
    """The engine's own checks of ``request`` (voices, tasks, the family's fields), without starting it."""
    state.ready_engine.models.speech().check_request(request)


async def load_ref_audio(state: ServerState, ref: str) -> bytes:
    """The bytes behind ``ref_audio``: a data URL, base64, a file URL under the allowed directory, or (opt-in) http."""
    settings = state.settings
    limit = settings.max_upload_bytes
    if ref.startswith("data:"):
        header, _, payload = ref.partition(",")
        if ";base64" not in header:
            return _too_large(unquote_to_bytes(payload), limit)
        return _b64(payload, limit)
    try:
        parsed = urlparse(ref)
    except ValueError as exc:  # e.g. a malformed IPv6 host
        raise bad_request(f"'ref_audio' is not a valid URL: {exc}", "ref_audio") from exc
    if parsed.scheme == "file":
        return await _read_local(settings.allowed_local_media_path, unquote(parsed.path), limit)
    if parsed.scheme in ("http", "https"):
        if not settings.allow_remote_media:
            raise bad_request("Fetching 'ref_audio' from URLs is disabled on this server", "ref_audio")
        return await _fetch(ref, limit, settings.remote_media_timeout)
    return _b64(ref, limit)


async def _read_local(root: Path | None, name: str, limit: int) -> bytes:
    """A ``file://`` reference: only under ``root``; every path problem (NUL, loops, I/O) is the client's 400."""
    if root is None:
        raise bad_request("Local files are not allowed for 'ref_audio' (no --allowed-local-media-path)", "ref_audio")
    if "\0" in name:
        raise bad_request("'ref_audio' file path must not contain NUL characters", "ref_audio")
    try:
        path = await anyio.Path(name).resolve()
        if not path.is_relative_to(await anyio.Path(root).resolve()):
            raise bad_request(f"'ref_audio' file must be under {root}", "ref_audio")
        if (await path.stat()).st_size > limit:
            raise bad_request(f"'ref_audio' is larger than {limit} bytes", "ref_audio")
        return await path.read_bytes()
    except (OSError, ValueError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Python < 3.13)
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise bad_request(f"Cannot read 'ref_audio' file: {reason}", "ref_audio") from exc


def _too_large(data: bytes, limit: int) -> bytes:
    if len(data) > limit:
        raise bad_request(f"'ref_audio' is larger than {limit} bytes", "ref_audio")
    return data


def _b64(payload: str, limit: int) -> bytes:
    payload = payload.strip()
    # Refuse before decoding: base64 carries 3 bytes in 4 characters.
    if len(payload) > (limit + 2) // 3 * 4:
        raise bad_request(f"'ref_audio' is larger than {limit} bytes", "ref_audio")
    try:
        return _too_large(base64.b64decode(payload, validate=True), limit)
    except (binascii.Error, ValueError) as exc:
        raise bad_request("'ref_audio' must be a data URL, base64 audio or an allowed URL", "ref_audio") from exc


async def _fetch(url: str, limit: int, seconds: float) -> bytes:
    import httpx

    try:
        async with httpx.AsyncClient(timeout=seconds, follow_redirects=True) as client:
            async with client.stream("GET", url) as response:
                response.raise_for_status()
                data = bytearray()
                async for piece in response.aiter_bytes():
                    data += piece
                    if len(data) > limit:
                        raise bad_request(f"'ref_audio' is larger than {limit} bytes", "ref_audio")
                return bytes(data)
    except httpx.HTTPError as exc:
        raise bad_request(f"Could not fetch 'ref_audio': {exc}", "ref_audio") from exc


async def build_request(state: ServerState, opts: SpeechOptions, text: str) -> SpeechRequest:
    """The engine request for ``text`` under ``opts``; 400 for an unknown voice or a task the model lacks.

    Checks that need nothing decoded come first: the engine's bounds on the text, a task the checkpoint
    cannot do, the voice; reference audio is decoded last.
    """
    check_text(text)
    check_instructions(opts.instructions)
    check_max_new_tokens(opts.max_new_tokens)
    fields: dict = {"text": text, "language": opts.language, "instructions": opts.instructions}
    task = opts.task_type
    if task is not None:
        check_task(state, task)
    if opts.voice is not None:
        uploaded = state.voices.get(opts.voice)
        builtin = _builtin_voice(state, opts.voice)
        if builtin is None and state.voices.directory is not None:  # the directory may be shared with replicas
            uploaded = await anyio.to_thread.run_sync(state.voices.refresh, opts.voice)
        if builtin is not None and uploaded is None:
            fields["voice"] = builtin
        elif uploaded is not None and not can_clone(state):
            raise bad_request(
                f"Voice '{opts.voice}' is an uploaded voice for cloning, which this checkpoint cannot do "
                f"(it offers {', '.join(supported_voices(state)) or 'no voices'}); load a Base checkpoint to use it",
                "voice",
            )
        elif uploaded is not None:
            task = task or TaskType.BASE
            check_task(state, task)
            prompt = uploaded.prompt if uploaded.prompt_model == model_key(state) else None
            if prompt is not None and uploaded.samples.size == 0:  # uploaded as a speaker embedding
                fields["voice_prompt"] = prompt
                fields["x_vector_only_mode"] = True
            elif prompt is not None and not opts.x_vector_only_mode:
                fields["voice_prompt"] = prompt
            elif prompt is not None:
                fields["voice_prompt"] = dataclasses.replace(prompt, ref_codes=None)
                fields["x_vector_only_mode"] = True
            elif uploaded.samples.size == 0:
                raise bad_request(
                    f"Voice '{opts.voice}' holds a speaker embedding made for another checkpoint", "voice"
                )
            else:  # no prompt from this checkpoint: the engine extracts one from the stored audio
                fields.update(ref_audio=uploaded.samples, ref_sample_rate=uploaded.sample_rate)
                fields["ref_text"] = uploaded.ref_text
        else:
            listed = ", ".join(supported_voices(state)) or "(none)"
            raise bad_request(f"Invalid voice '{opts.voice}'. Supported: {listed}", "voice")
    if opts.speaker_embedding is not None:
        fields["voice_prompt"] = VoicePrompt(x_vector=np.asarray(opts.speaker_embedding, dtype=np.float32))
        fields["x_vector_only_mode"] = True
    if opts.ref_audio is not None:
        samples, rate = await decode_reference(state, await load_ref_audio(state, opts.ref_audio), "ref_audio")
        fields.update(ref_audio=samples, ref_sample_rate=rate, voice_prompt=None)
    if opts.ref_text is not None:
        fields["ref_text"] = opts.ref_text
    if opts.x_vector_only_mode:
        fields["x_vector_only_mode"] = True
    if task is not None:
        fields["task_type"] = task
    if opts.language.lower() != "auto" and state.ready_engine.speech_info.languages:
        spelled = {str(lang).lower(): str(lang) for lang in state.ready_engine.speech_info.languages}
        if opts.language.lower() not in spelled:
            listed = ", ".join(spelled.values())
            raise bad_request(f"Unsupported language '{opts.language}'. Supported: Auto, {listed}", "language")
        fields["language"] = spelled[opts.language.lower()]  # the model's own spelling
    if opts.max_new_tokens is not None:
        fields["max_new_tokens"] = opts.max_new_tokens
    if opts.non_streaming_mode is not None:
        fields["non_streaming_mode"] = opts.non_streaming_mode
    if opts.seed is not None:
        fields["seed"] = opts.seed
    if opts.initial_codec_chunk_frames is not None:
        fields["initial_codec_chunk_frames"] = opts.initial_codec_chunk_frames
    if opts.ignore_eos:
        fields["ignore_eos"] = True
    return SpeechRequest(**fields)
