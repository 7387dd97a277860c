"""From parsed options to an engine :class:`SpeechRequest`: the wire's fields, and the reference audio they point at.

Every rule about the request's content (task, voice, language, lengths, the reference's duration) is the engine's
(:mod:`omni_stream.validation.speech`): it resolves the request when it runs. What is done here is I/O the engine
cannot do on the event loop: refreshing an uploaded voice from a directory other servers share, and loading and
decoding ``ref_audio`` (checked by the engine first, so a request it would refuse reads no audio).
"""

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
from omni_stream.realtime.common.errors import bad_request
from omni_stream.realtime.speech.params import SpeechOptions
from omni_stream.realtime.state import ServerState
from omni_stream.requests import SpeechRequest, VoicePrompt
from omni_stream.speech.limits import MAX_REF_SECONDS, ref_too_long
from omni_stream.validation.speech import family_options, resolve_speech
from omni_stream.validation.voices import builtin_voice


async def decode_reference(state: ServerState, data: bytes, param: str) -> tuple[np.ndarray, int]:
    """Decode reference audio off the loop at the engine's rate (decoding stops past the engine's bound on its
    length, :data:`~omni_stream.speech.limits.MAX_REF_SECONDS`, and says so in the engine's words)."""
    rate = state.ready_engine.speech_info.sample_rate

    def decode() -> tuple[np.ndarray, float]:
        return codecs.decode_audio(data, rate, max_seconds=MAX_REF_SECONDS + 1.0)

    try:
        samples, _ = await anyio.to_thread.run_sync(decode)
    except ValueError as exc:
        if "longer than" in str(exc):  # the decoder stopped at the bound, the rest unread: its length is unknown
            raise ref_too_long(f"more than {MAX_REF_SECONDS + 1.0:.0f}s", param) from None
        raise bad_request(f"Could not decode '{param}': {exc}", param) from exc
    return samples, rate


async def refresh_voice(state: ServerState, name: str) -> None:
    """Read uploaded voice ``name`` again when another server sharing the voices directory changed it (no I/O for a
    built-in voice, or without a directory)."""
    if state.voices.directory is not None and builtin_voice(state.ready_engine.speech_info, name) is None:
        await anyio.to_thread.run_sync(state.voices.refresh, name)


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
    """The engine request for ``text`` under ``opts`` (resolved by the engine when it runs).

    With ``ref_audio``, the engine checks the request before the audio is read, loaded and decoded.
    """
    fields: dict = {
        "text": text,
        "language": opts.language,
        "instructions": opts.instructions,
        "task_type": opts.task_type,
        "voice": opts.voice,
        "ref_text": opts.ref_text,
        "x_vector_only_mode": opts.x_vector_only_mode,
        "max_new_tokens": opts.max_new_tokens,
        # the family's own options, by the wire's names (a field its options lack is refused naming it)
        "options": family_options(state.ready_engine.speech_info, non_streaming_mode=opts.non_streaming_mode),
        "seed": opts.seed,
        "initial_codec_chunk_frames": opts.initial_codec_chunk_frames,
        "ignore_eos": opts.ignore_eos,
    }
    if opts.speaker_embedding is not None:
        fields["voice_prompt"] = VoicePrompt(x_vector=np.asarray(opts.speaker_embedding, dtype=np.float32))
        fields["x_vector_only_mode"] = True
    if opts.voice is not None:
        await refresh_voice(state, opts.voice)
    request = SpeechRequest(**fields)
    if opts.ref_audio is None:
        return request
    engine = state.ready_engine
    resolve_speech(engine.speech_info, engine.voices, request, reference_follows=True)
    samples, rate = await decode_reference(state, await load_ref_audio(state, opts.ref_audio), "ref_audio")
    return dataclasses.replace(request, ref_audio=samples, ref_sample_rate=rate, voice_prompt=None)
