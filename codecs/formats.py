"""Output format registry: names, MIME types, file extensions and the rates each codec accepts."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UnsupportedFormatError


@dataclass(slots=True, frozen=True)
class FormatInfo:
    """One output format. ``rates`` is empty when any rate is accepted as is."""

    name: str
    mime_type: str
    extension: str
    max_channels: int
    rates: tuple[int, ...] = ()


# Rates each codec encodes natively; any other input rate is resampled to the nearest one above it.
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
MP3_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
AAC_RATES = (7350, 8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000, 88200, 96000)
G711_RATE = 8000

FORMATS: dict[str, FormatInfo] = {
    info.name: info
    for info in (
        FormatInfo("pcm", "audio/pcm", ".pcm", 8),
        FormatInfo("wav", "audio/wav", ".wav", 8),
        FormatInfo("flac", "audio/flac", ".flac", 8),
        FormatInfo("mp3", "audio/mpeg", ".mp3", 2, MP3_RATES),
        FormatInfo("opus", "audio/ogg", ".opus", 2, OPUS_RATES),
        FormatInfo("aac", "audio/aac", ".aac", 2, AAC_RATES),
        # RFC 2046's audio/basic is 8 kHz mono mu-law without a header; a-law has no registered bare type.
        FormatInfo("mulaw", "audio/basic", ".ulaw", 8, (G711_RATE,)),
        FormatInfo("alaw", "audio/x-alaw-basic", ".alaw", 8, (G711_RATE,)),
    )
}


def format_info(fmt: str) -> FormatInfo:
    """The registry entry for ``fmt`` (case-insensitive); raises ``UnsupportedFormatError`` naming the choices."""
    info = FORMATS.get(fmt.lower()) if isinstance(fmt, str) else None
    if info is None:
        raise UnsupportedFormatError(f"unsupported audio format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return info


def mime_type(fmt: str) -> str:
    """MIME type of an output format, e.g. ``audio/wav``."""
    return format_info(fmt).mime_type


def extension(fmt: str) -> str:
    """File extension of an output format, with the dot, e.g. ``.wav``."""
    return format_info(fmt).extension


def coding_rate(fmt: str, sample_rate: int) -> int:
    """The rate ``fmt`` encodes input of ``sample_rate`` Hz at: itself if accepted, else the next accepted rate up."""
    rates = format_info(fmt).rates
    if not rates or sample_rate in rates:
        return sample_rate
    above = [r for r in rates if r >= sample_rate]
    return above[0] if above else rates[-1]
