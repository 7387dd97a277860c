"""Decode uploaded audio (voices, ``ref_audio``) from memory to float32 mono at a target rate.

The container is recognised from its magic bytes and FFmpeg is told which demuxer to use: probing is never left to
FFmpeg, so playlist-style demuxers (HLS, concat) that open other files or URLs can never be picked for an upload.
Decoding stops as soon as the audio runs past ``max_seconds``, so a 10 MiB upload that expands to hours of audio
costs at most ``max_seconds`` of samples. Nothing is written to disk.
"""

from __future__ import annotations

import io

import av
import numpy as np

from .errors import AudioDecodeError
from .resample import Resampler

# Cap when the caller gives no max_seconds: bounds memory and time for highly compressible input.
MAX_DECODE_SECONDS = 600.0
# Float samples beyond this (36 dB over full scale) only come from corrupt files.
MAX_FLOAT_LEVEL = 64.0
MIN_SOURCE_RATE = 1000
MAX_SOURCE_RATE = 384_000
# Containers whose header states the length: decoding much less than stated means the upload was cut short.
_DECLARED_LENGTH = {"flac", "mp4"}
_TRUNCATION_SLACK_S = 0.05
_NAMES = "wav, flac, ogg (vorbis/opus), mp3, webm, mp4/aac"


def sniff_container(data: bytes) -> str | None:
    """FFmpeg demuxer name for ``data`` judged by its magic bytes, or None if it is not a supported container."""
    head = bytes(data[:16])
    if head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"
    if head[4:8] == b"ftyp":
        return "mp4"
    if head[:3] == b"ID3" and len(head) >= 10:
        # ID3v2 tag (syncsafe size) in front of mp3, ADTS or FLAC; FFmpeg skips it itself.
        size = 10 + ((head[6] & 0x7F) << 21 | (head[7] & 0x7F) << 14 | (head[8] & 0x7F) << 7 | (head[9] & 0x7F))
        if head[5] & 0x10:
            size += 10
        inner = sniff_container(data[size : size + 16]) if size < len(data) else None
        return inner if inner in ("mp3", "aac", "flac") else None
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:
        return "aac" if head[1] & 0x06 == 0 else "mp3"  # layer bits 00 mark ADTS
    return None


def decode_audio(data: bytes, target_rate: int, *, max_seconds: float | None = None) -> tuple[np.ndarray, float]:
    """Decode an in-memory file to (float32 mono at ``target_rate`` Hz, source duration in s); raises AudioDecodeError.

    ``max_seconds`` (default ``MAX_DECODE_SECONDS``) rejects longer audio without decoding the rest.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"data must be bytes, got {type(data).__name__}")
    if not isinstance(target_rate, int | np.integer) or not MIN_SOURCE_RATE <= target_rate <= MAX_SOURCE_RATE:
        raise ValueError(f"target_rate must be an integer in {MIN_SOURCE_RATE}..{MAX_SOURCE_RATE} Hz: {target_rate!r}")
    data = bytes(data)
    if not data:
        raise AudioDecodeError("audio file is empty")
    fmt = sniff_container(data)
    if fmt is None:
        raise AudioDecodeError(f"not a recognised audio file; supported: {_NAMES}")
    if _cut_short(fmt, data):
        raise AudioDecodeError(f"{_label(fmt)} file is truncated")
    limit = MAX_DECODE_SECONDS if max_seconds is None else float(max_seconds)
    try:
        with av.open(io.BytesIO(data), mode="r", format=fmt) as container:
            return _decode(container, fmt, target_rate, limit)
    except av.FFmpegError as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise AudioDecodeError(f"corrupt or unsupported {_label(fmt)} audio: {reason}") from exc
    except (ValueError, EOFError, OSError) as exc:
        if isinstance(exc, AudioDecodeError):
            raise
        raise AudioDecodeError(f"corrupt or unsupported {_label(fmt)} audio") from exc


def _decode(
    container: av.container.InputContainer, fmt: str, target_rate: int, limit: float
) -> tuple[np.ndarray, float]:
    stream = next(iter(container.streams.audio), None)
    if stream is None:
        raise AudioDecodeError(f"{_label(fmt)} file has no audio stream")
    resampler: Resampler | None = None
    rate = 0
    n_src = 0
    out: list[np.ndarray] = []
    for packet in container.demux(stream):
        for frame in stream.decode(packet):
            if resampler is None:
                rate = frame.sample_rate
                if not MIN_SOURCE_RATE <= rate <= MAX_SOURCE_RATE:
                    raise AudioDecodeError(f"unsupported sample rate {rate} Hz")
                resampler = Resampler(rate, target_rate)
            elif frame.sample_rate != rate:
                raise AudioDecodeError("sample rate changes within the file")
            mono = _mono_float32(frame)
            if mono is None:
                raise AudioDecodeError(f"{_label(fmt)} file holds non-finite or out-of-range samples")
            n_src += len(mono)
            if n_src > limit * rate:
                raise AudioDecodeError(f"audio is longer than {limit:g} s")
            out.append(resampler.process(mono))
    if resampler is None or n_src == 0:
        raise AudioDecodeError(f"{_label(fmt)} file holds no audio samples")
    out.append(resampler.flush())
    duration = n_src / rate
    declared = _declared_seconds(stream) if fmt in _DECLARED_LENGTH else None
    if declared is not None and duration < declared - max(_TRUNCATION_SLACK_S, 0.01 * declared):
        raise AudioDecodeError(f"{_label(fmt)} file is truncated: {duration:.2f} s of a stated {declared:.2f} s")
    return np.concatenate(out), duration


def _cut_short(fmt: str, data: bytes) -> bool:
    """True when the container's own framing shows the file ends early (WAV data size, a partial last Ogg page).

    FLAC and MP4 state their length and are checked after decoding; ADTS fails in the decoder. MP3 and WebM carry
    no length that a cut can contradict, so a cut one decodes up to its last whole frame.
    """
    if fmt == "wav":
        pos = 12
        for _ in range(64):
            if pos + 8 > len(data):
                return True
            size = int.from_bytes(data[pos + 4 : pos + 8], "little")
            if data[pos : pos + 4] == b"data":
                return size not in (0, 0xFFFFFFFF) and pos + 8 + size > len(data)
            pos += 8 + size + (size & 1)
        return False
    if fmt == "ogg":
        pos = 0
        while pos < len(data):
            if data[pos : pos + 4] != b"OggS":
                return False  # not page-aligned; the demuxer judges the damage
            if pos + 27 > len(data) or pos + 27 + data[pos + 26] > len(data):
                return True
            segments = data[pos + 27 : pos + 27 + data[pos + 26]]
            pos += 27 + len(segments) + sum(segments)
        return pos > len(data)
    return False


def _mono_float32(frame: av.AudioFrame) -> np.ndarray | None:
    """Mean of the channels as float32; None for float samples that are NaN, infinite or beyond +-MAX_FLOAT_LEVEL."""
    a = frame.to_ndarray()
    channels = frame.layout.nb_channels
    if not frame.format.is_planar:
        a = a.reshape(-1, channels).T
    kind, size = a.dtype.kind, a.dtype.itemsize
    if kind == "f":
        # The negated test also catches NaN.
        if not np.all(np.abs(a) <= MAX_FLOAT_LEVEL):
            return None
        x = a.astype(np.float32, copy=False)
    elif kind == "u":
        x = (a.astype(np.float32) - 128.0) / 128.0
    else:
        x = a.astype(np.float32) / float(1 << (8 * size - 1))
    return x[0] if channels == 1 else x.mean(axis=0)


def _declared_seconds(stream: av.audio.stream.AudioStream) -> float | None:
    if stream.duration is None or stream.time_base is None or stream.duration <= 0:
        return None
    return float(stream.duration * stream.time_base)


def _label(fmt: str) -> str:
    return {"matroska": "webm/matroska", "mp4": "mp4/m4a", "aac": "aac (adts)"}.get(fmt, fmt)
