"""GET/POST /v1/audio/voices and DELETE /v1/audio/voices/{name}: uploaded voices for cloning."""

from __future__ import annotations

import logging
from pathlib import PurePath
from typing import Any

import anyio.to_thread
import numpy as np
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Message

from omni_stream.errors import InvalidRequestError
from omni_stream.realtime.common.body_limit import parse_json, read_body
from omni_stream.realtime.common.errors import ApiError, bad_request
from omni_stream.realtime.common.route import answer, count
from omni_stream.realtime.speech.build import decode_reference
from omni_stream.realtime.speech.voice_store import StoredVoice, VoiceLimitError, now_seconds, validate_name
from omni_stream.realtime.state import ServerState
from omni_stream.requests import SpeechRequest, VoicePrompt
from omni_stream.speech.limits import MAX_VOICE_NOTE_CHARS, check_embedding, check_transcript
from omni_stream.validation.voices import builtin_voice, check_new_voice, model_key, voice_names

log = logging.getLogger("omni_stream.realtime.speech.voices")
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
    engine = state.engine
    names = voice_names(engine.speech_info, state.voices) if engine is not None else list(state.voices.names())
    return count(state, ROUTE, JSONResponse({"voices": names, "uploaded_voices": uploaded}))


async def upload_voice(request: Request) -> Response:
    return await answer(request, ROUTE, _upload)


async def delete_without_name(request: Request) -> Response:
    """``DELETE /v1/audio/voices/``: the name is missing from the path (a 400, not a redirect)."""
    state: ServerState = request.app.state.omni
    error = bad_request("'name' is required: DELETE /v1/audio/voices/{name}", "name")
    return count(state, ROUTE, error.response())


async def delete_voice(request: Request) -> Response:
    state: ServerState = request.app.state.omni
    name = request.path_params["name"]
    voice = await anyio.to_thread.run_sync(state.voices.delete, name)
    if voice is None:
        engine = state.engine
        builtin = engine is not None and engine.has_speech and builtin_voice(engine.speech_info, name) is not None
        # a built-in voice is listed beside the uploaded ones: "not found" would contradict the list
        message = f"Voice '{name}' is built into the model and cannot be deleted" if builtin else None
        error = ApiError(404, message or f"Voice '{name}' not found", "name")
        return count(state, ROUTE, JSONResponse({"success": False, **error.body()}, status_code=404))
    log.info("deleted voice %r", voice.name)
    return count(state, ROUTE, JSONResponse({"success": True, "message": f"Voice '{name}' deleted successfully"}))


NOTES = ("consent", "speaker_description")  # stored with the voice and listed: bounded (speech/limits.py)


def _text_field(form: Any, key: str, required: bool) -> str | None:
    value = form.get(key)
    if isinstance(value, UploadFile):
        raise bad_request(f"'{key}' must be a text field, not a file", key)
    value = (value or "").strip()
    if required and not value:
        raise bad_request(f"'{key}' is required", key)
    if key in NOTES and len(value) > MAX_VOICE_NOTE_CHARS:
        raise bad_request(f"'{key}' is too long ({len(value)} characters; at most {MAX_VOICE_NOTE_CHARS})", key)
    return value or None


def _boundary(content_type: str) -> bytes | None:
    for part in content_type.split(";")[1:]:
        key, _, value = part.strip().partition("=")
        if key.strip().lower() == "boundary" and value.strip().strip('"'):
            return value.strip().strip('"').encode("latin-1", "replace")
    return None


async def _read_form(request: Request, limit: int) -> Any:
    """The multipart form of ``request``, whole: a body that ends before its closing boundary is refused
    (a truncated upload would otherwise parse as a form with fields missing)."""
    content_type = request.headers.get("content-type", "")
    boundary = _boundary(content_type) if content_type.startswith("multipart/form-data") else b""
    if boundary is None:
        raise bad_request("Invalid multipart body: the Content-Type header has no boundary")
    body = await read_body(request, limit, "audio_sample")  # counted as it arrives: refused past the limit
    if boundary and not body.rstrip(b"\r\n").endswith(b"--" + boundary + b"--"):
        raise bad_request("Invalid multipart body: it ends before its closing boundary (was the upload cut short?)")
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        return await Request(request.scope, replay).form(max_files=1, max_fields=16)
    except Exception as exc:  # malformed multipart, too many parts
        raise bad_request(f"Invalid multipart body: {getattr(exc, 'detail', exc)}") from exc


async def _upload(request: Request, state: ServerState) -> Response:
    voice = await _store(request, state)
    return JSONResponse({"success": True, "voice": voice.public()})


async def _store(request: Request, state: ServerState) -> StoredVoice:
    settings = state.settings
    limit = settings.max_upload_bytes
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        raise bad_request("Voice uploads must be multipart/form-data (or a form-encoded speaker_embedding)")
    # Read first (bounded), so that even a refused client gets to read the answer before the connection closes.
    form = await _read_form(request, limit + FORM_OVERHEAD)
    info = state.ready_engine.speech_info
    try:
        check_new_voice(info)  # the model must clone, whatever the form holds
    except InvalidRequestError:
        await form.close()
        raise
    try:
        name = _text_field(form, "name", required=True)
        consent = _text_field(form, "consent", required=True)
        ref_text = _text_field(form, "ref_text", required=False)
        description = _text_field(form, "speaker_description", required=False)
        embedding_text = _text_field(form, "speaker_embedding", required=False)
        upload = form.get("audio_sample")
        if isinstance(upload, UploadFile) and embedding_text is not None:
            raise bad_request("Give either 'audio_sample' or 'speaker_embedding', not both", "speaker_embedding")
        if not isinstance(upload, UploadFile) and embedding_text is None:
            raise bad_request("'audio_sample' (an audio file) or 'speaker_embedding' is required", "audio_sample")
        assert name is not None and consent is not None
        data = await upload.read(limit + 1) if isinstance(upload, UploadFile) else b""
        upload_type = upload.content_type if isinstance(upload, UploadFile) else None
        filename = upload.filename if isinstance(upload, UploadFile) else None
    finally:
        await form.close()
    problem = validate_name(name)
    if problem:
        raise bad_request(problem, "name")
    check_new_voice(info, name)
    if not state.voices.has_room_for(name):
        raise bad_request(f"Maximum number of uploaded voices ({state.voices.max_voices}) reached", "name")
    if embedding_text is not None:
        voice = await _embedding_voice(state, name, consent, embedding_text, ref_text, description)
    else:
        voice = await _audio_voice(state, name, consent, data, upload_type, filename, ref_text, description)
    try:
        replaced = await anyio.to_thread.run_sync(state.voices.save, voice, data)
    except VoiceLimitError as exc:
        raise bad_request(str(exc), "name") from exc
    log.info("%s voice %r", "replaced" if replaced else "added", name)
    return voice


async def _audio_voice(
    state: ServerState,
    name: str,
    consent: str,
    data: bytes,
    content_type: str | None,
    filename: str | None,
    ref_text: str | None,
    description: str | None,
) -> StoredVoice:
    limit = state.settings.max_upload_bytes
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
    samples, rate = await decode_reference(state, data, "audio_sample")
    prompt = await _voice_prompt(state, samples, rate, ref_text)  # checks the audio's length first
    check_transcript(ref_text, samples.size / rate)  # refused now, not at each use of the voice
    return StoredVoice(
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
        prompt_model=model_key(state.ready_engine.speech_info) if prompt is not None else None,
    )


async def _embedding_voice(
    state: ServerState, name: str, consent: str, text: str, ref_text: str | None, description: str | None
) -> StoredVoice:
    """A voice given as a speaker embedding (a JSON list of numbers): checked against the checkpoint's size."""
    try:
        values = check_embedding(parse_json(text))
    except (ValueError, RecursionError) as exc:  # not JSON (or nested past the parser), not a list of finite numbers
        message = (
            exc.message if isinstance(exc, InvalidRequestError) else f"'speaker_embedding' must be valid JSON: {exc}"
        )
        raise bad_request(message, "speaker_embedding") from exc
    prompt = VoicePrompt(x_vector=np.asarray(values, dtype=np.float32))
    # The engine's own checks (the embedding's size) on a request that would use it.
    state.ready_engine.resolve(SpeechRequest(text="-", voice_prompt=prompt, x_vector_only_mode=True))
    return StoredVoice(
        name=name,
        consent=consent,
        created_at=now_seconds(),
        mime_type="application/json",
        file_size=len(text.encode()),
        samples=np.zeros(0, np.float32),
        sample_rate=state.ready_engine.speech_info.sample_rate,
        ref_text=ref_text,
        speaker_description=description,
        prompt=prompt,
        prompt_model=model_key(state.ready_engine.speech_info),
    )


async def _voice_prompt(state: ServerState, samples: Any, rate: int, ref_text: str | None) -> VoicePrompt | None:
    """The engine's cloning prompt (extracted once, stored with the voice); None when the family makes none."""
    try:
        return await state.ready_engine.create_voice_prompt(samples, rate, ref_text=ref_text)
    except NotImplementedError:
        return None
    except InvalidRequestError as exc:  # the engine names its own field for the audio; here it is audio_sample
        raise InvalidRequestError(exc.message, "audio_sample" if exc.param == "ref_audio" else exc.param) from None
