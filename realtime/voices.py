"""GET/POST /v1/audio/voices and DELETE /v1/audio/voices/{name}: uploaded voices for cloning."""

from __future__ import annotations

import logging
from pathlib import PurePath
from typing import Any

import anyio.to_thread
from omni_stream.realtime.body_limit import drain, limited
from omni_stream.realtime.errors import ApiError, bad_request, from_exception
from omni_stream.realtime.speech_build import decode_reference, model_key, supported_voices
from omni_stream.realtime.state import ServerState
from omni_stream.realtime.voice_store import StoredVoice, VoiceLimitError, now_seconds, validate_name
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from omni_stream.errors import UnsupportedTaskError
from omni_stream.requests import TaskType, VoicePrompt

log = logging.getLogger("omni_stream.realtime.voices")
ROUTE = "/v1/audio/voices"

AUDIO_MIME_TYPES = {
    "audio/wav": "audio/wav",
    "audio/x-wav": "audio/wav",
    "audio/wave": "audio/wav",
    "audio/vnd.wave": "audio/wav",
    "audio/mpeg": "audio/mpeg",
    "audio/mp3": "audio/mpeg",
    "audio/ogg": "audio/ogg",
    "audio/opus": "audio/ogg",
    "audio/flac": "audio/flac",
    "audio/x-flac": "audio/flac",
    "audio/webm": "audio/webm",
    "audio/mp4": "audio/mp4",
    "audio/x-m4a": "audio/mp4",
    "audio/m4a": "audio/mp4",
    "audio/aac": "audio/aac",
}
EXTENSION_MIME_TYPES = {
    ".wav": "audio/wav",
    ".mp3": "audio/mpeg",
    ".ogg": "audio/ogg",
    ".opus": "audio/ogg",
    ".flac": "audio/flac",
    ".webm": "audio/webm",
    ".mp4": "audio/mp4",
    ".m4a": "audio/mp4",
    ".aac": "audio/aac",
}
# Multipart overhead allowed on top of the audio limit before the body is refused unread.
FORM_OVERHEAD = 256 * 1024


def resolve_mime(content_type: str | None, filename: str | None) -> str | None:
    """The audio MIME type of an upload, or None when it is not audio (octet-stream: from the extension)."""
    base = (content_type or "").split(";")[0].strip().lower()
    if base in AUDIO_MIME_TYPES:
        return AUDIO_MIME_TYPES[base]
    if base in ("", "application/octet-stream"):
        suffix = PurePath(filename or "").suffix.lower()
        return EXTENSION_MIME_TYPES.get(suffix, "audio/wav" if not suffix else None)
    return None


async def list_voices(request: Request) -> Response:
    state: ServerState = request.app.state.omni
    await anyio.to_thread.run_sync(state.voices.sync)  # the directory may be shared with replicas
    uploaded = [v.public() for v in state.voices.voices()]
    names = supported_voices(state) if state.engine is not None else sorted(v.key for v in state.voices.voices())
    return _count(state, JSONResponse({"voices": names, "uploaded_voices": uploaded}))


async def upload_voice(request: Request) -> Response:
    state: ServerState = request.app.state.omni
    try:
        voice = await _upload(request, state)
        response = JSONResponse({"success": True, "voice": voice.public()})
    except Exception as exc:
        await drain(request.receive, exc)
        response = from_exception(exc).response()
    return _count(state, response)


async def delete_voice(request: Request) -> Response:
    state: ServerState = request.app.state.omni
    name = request.path_params["name"]
    voice = await anyio.to_thread.run_sync(state.voices.delete, name)
    if voice is None:
        error = ApiError(404, f"Voice '{name}' not found", "name")
        return _count(state, JSONResponse({"success": False, **error.body()}, status_code=404))
    log.info("deleted voice %r", voice.name)
    return _count(state, JSONResponse({"success": True, "message": f"Voice '{name}' deleted successfully"}))


def _count(state: ServerState, response: Response) -> Response:
    state.metrics.requests.labels(ROUTE, str(response.status_code)).inc()
    return response


def _text_field(form: Any, key: str, required: bool) -> str | None:
    value = form.get(key)
    if isinstance(value, UploadFile):
        raise bad_request(f"'{key}' must be a text field, not a file", key)
    value = (value or "").strip()
    if required and not value:
        raise bad_request(f"'{key}' is required", key)
    return value or None


async def _upload(request: Request, state: ServerState) -> StoredVoice:
    settings = state.settings
    limit = settings.max_upload_bytes
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise bad_request("Voice uploads must be multipart/form-data")
    try:
        # Counted as it arrives: a chunked upload without Content-Length is refused before it is spooled.
        form = await limited(request, limit + FORM_OVERHEAD, "audio_sample").form(max_files=1, max_fields=16)
    except ApiError:
        raise
    except Exception as exc:  # malformed multipart, too many parts
        raise bad_request(f"Invalid multipart body: {getattr(exc, 'detail', exc)}") from exc
    try:
        name = _text_field(form, "name", required=True)
        consent = _text_field(form, "consent", required=True)
        ref_text = _text_field(form, "ref_text", required=False)
        description = _text_field(form, "speaker_description", required=False)
        upload = form.get("audio_sample")
        if not isinstance(upload, UploadFile):
            raise bad_request("'audio_sample' (an audio file) is required", "audio_sample")
        assert name is not None and consent is not None
        data = await upload.read(limit + 1)
        content_type, filename = upload.content_type, upload.filename
    finally:
        await form.close()
    if len(data) > limit:
        raise bad_request(f"File size exceeds maximum limit of {limit // (1024 * 1024)}MB", "audio_sample")
    if not data:
        raise bad_request("'audio_sample' is empty", "audio_sample")
    mime = resolve_mime(content_type, filename)
    if mime is None:
        raise bad_request(
            f"Unsupported audio type '{content_type}': use one of wav, mpeg, ogg, flac, webm, mp4, aac",
            "audio_sample",
        )
    problem = validate_name(name)
    if problem:
        raise bad_request(problem, "name")
    if any(v.lower() == name.lower() for v in state.ready_engine.speech_info.voices):
        raise bad_request(f"'{name}' is a built-in voice; choose another name", "name")
    if not state.voices.has_room_for(name):
        raise bad_request(f"Maximum number of uploaded voices ({state.voices.max_voices}) reached", "name")
    samples, rate = await decode_reference(state, data, "audio_sample")
    prompt = await _voice_prompt(state, samples, rate, ref_text)
    voice = StoredVoice(
        name=name,
        consent=consent,
        created_at=now_seconds(),
        mime_type=mime,
        file_size=len(data),
        samples=samples,
        sample_rate=rate,
        ref_text=ref_text,
        speaker_description=description,
        prompt=prompt,
        prompt_model=model_key(state) if prompt is not None else None,
    )
    try:
        replaced = await anyio.to_thread.run_sync(state.voices.save, voice, data)
    except VoiceLimitError as exc:
        raise bad_request(str(exc), "name") from exc
    log.info("%s voice %r", "replaced" if replaced else "added", name)
    return voice


async def _voice_prompt(state: ServerState, samples: Any, rate: int, ref_text: str | None) -> VoicePrompt | None:
    """The engine's cloning prompt for Base models (extracted once, stored with the voice); None otherwise."""
    engine = state.ready_engine
    tasks = {t.value if isinstance(t, TaskType) else str(t) for t in engine.speech_info.task_types}
    if TaskType.BASE.value not in tasks:
        return None
    try:
        return await engine.create_voice_prompt(samples, rate, ref_text=ref_text)
    except (UnsupportedTaskError, NotImplementedError):
        return None
