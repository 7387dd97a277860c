"""One response's audio path: optional resampling, then the wire encoder; off the event loop, but for raw PCM and WAV
at the model's rate, whose encoding is a cast of each chunk to 16-bit (tens of microseconds for a window of up to 2 s
of audio: less than the loop's own share of handing it to a thread and back, which also waited its turn at the GIL
behind the device worker before a stream's first bytes could go out)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import anyio
import anyio.to_thread
import numpy as np

from omni_stream import codecs
from omni_stream.chunks import Audio
from omni_stream.codecs.formats import coding_rate
from omni_stream.realtime.speech.stretch import time_stretch

BIT_DEPTH = 16  # the PCM the encoders are fed
INLINE_FORMATS = ("pcm", "wav")  # encoded on the loop when no resampling is needed (the module docstring says why)


def audio_headers(sample_rate: int, requested: int | None = None) -> dict[str, str]:
    """``X-Sample-Rate``, ``X-Channels``, ``X-Bit-Depth`` for every audio response.

    When the client asked for a ``sample_rate`` the format cannot carry (mp3 codes 11000 Hz at 11025 Hz,
    opus always decodes at 48000 Hz), ``X-Requested-Sample-Rate`` says what was asked beside what was sent.
    """
    headers = {"X-Sample-Rate": str(sample_rate), "X-Channels": "1", "X-Bit-Depth": str(BIT_DEPTH)}
    if requested is not None and requested != sample_rate:
        headers["X-Requested-Sample-Rate"] = str(requested)
    return headers


# Compressed formats whose readers want one audio packet (an empty mp3 or aac is 0 bytes, opus and flac headers only).
NEEDS_A_PACKET = ("mp3", "aac", "opus", "flac")
# Opus always decodes at 48 kHz (RFC 7845 5.1: the rate in OpusHead is the encoder's input, not for playback).
DECODED_RATES = {"opus": 48000}


def output_rate(fmt: str, src_rate: int, dst_rate: int | None = None) -> int:
    """The rate a client's decoder gives for ``fmt`` audio made at ``dst_rate`` (or else ``src_rate``) Hz.

    Codecs with a fixed set of rates code at the next one up (mp3 at 11000 Hz asked codes at 11025 Hz).
    """
    return DECODED_RATES.get(fmt, coding_rate(fmt, dst_rate or src_rate))


def inline(fmt: str, src_rate: int, dst_rate: int | None) -> bool:
    """Whether ``fmt`` audio made at ``src_rate`` is opened and encoded on the loop (raw PCM or WAV, no resampling)."""
    return fmt in INLINE_FORMATS and (dst_rate or src_rate) == src_rate


class AudioOut:
    """Resample (when ``dst_rate`` differs) and encode float32 mono chunks into ``fmt`` bytes.

    ``sample_rate`` is the rate of the encoded stream as a decoder gives it, which may differ from the one
    asked for (mp3 codes 22000 Hz input at 22050 Hz; opus decodes at 48000 Hz); the headers and
    ``audio.start`` report it.
    """

    def __init__(self, fmt: str, src_rate: int, dst_rate: int | None = None, *, streaming: bool = True) -> None:
        self.format = fmt
        rate = dst_rate or src_rate
        self._resampler: Any = codecs.Resampler(src_rate, rate) if rate != src_rate else None
        self._encoder: Any = codecs.open_encoder(fmt, rate, 1, streaming=streaming)
        self.sample_rate: int = DECODED_RATES.get(fmt, self._encoder.sample_rate)
        self.inline = inline(fmt, src_rate, dst_rate)

    @classmethod
    async def open(cls, fmt: str, src_rate: int, dst_rate: int | None = None, *, streaming: bool = True) -> AudioOut:
        """Build off the loop (some encoders load codec libraries); raw PCM and WAV at the source rate here."""
        if inline(fmt, src_rate, dst_rate):
            return cls(fmt, src_rate, dst_rate, streaming=streaming)
        return await anyio.to_thread.run_sync(lambda: cls(fmt, src_rate, dst_rate, streaming=streaming))

    @property
    def mime_type(self) -> str:
        return codecs.mime_type(self.format)

    def encode_sync(self, samples: np.ndarray) -> bytes:
        if self._resampler is not None:
            samples = self._resampler.process(samples)
        return self._encoder.encode(samples) if samples.size else b""

    def finish_sync(self) -> bytes:
        out = b""
        if self._resampler is not None:
            tail = self._resampler.flush()
            if tail.size:
                out += self._encoder.encode(tail)
        return out + self._encoder.flush()

    def close(self) -> None:
        """Release the codec (PyAV containers for opus, aac, flac) whether or not the stream finished; idempotent."""
        self._encoder.close()

    async def encode(self, samples: np.ndarray) -> bytes:
        if self.inline:
            return self.encode_sync(samples)
        return await anyio.to_thread.run_sync(self.encode_sync, samples)

    async def finish(self) -> bytes:
        if self.inline:
            return self.finish_sync()
        return await anyio.to_thread.run_sync(self.finish_sync)


def encode_whole(
    fmt: str, samples: np.ndarray, src_rate: int, dst_rate: int | None = None, speed: float = 1.0
) -> tuple[bytes, int]:
    """A complete file (blocking: run it in a thread); returns the bytes and the encoded sample rate."""
    if speed != 1.0:
        samples = time_stretch(samples, speed, src_rate)
    rate = dst_rate or src_rate
    if rate != src_rate:
        samples = codecs.resample(samples, src_rate, rate)
    if samples.size == 0 and fmt in NEEDS_A_PACKET:
        # No audio at all (max_new_tokens=1 can end before the first frame). A wav file of no samples
        # is valid, and pcm is simply empty; these formats need one audio packet, so the answer is the shortest
        # valid file, one codec frame of silence, never a body of 0 bytes or of headers alone.
        samples = np.zeros(1, np.float32)
    return codecs.encode_whole(fmt, samples, rate), output_rate(fmt, rate)


async def first_chunk_and_output(
    chunks: AsyncIterator[Audio], fmt: str, src_rate: int, dst_rate: int | None
) -> tuple[Audio | bool, AudioOut]:
    """A stream's first chunk (False: none), and its encoder, opened while the model makes that chunk: the open is
    a thread hop that would otherwise stand between the request and its first byte. An error of the stream wins
    over one of the open; the encoder is closed unless it is returned (an error, or the caller cancelled)."""
    outs: list[AudioOut] = []
    errors: list[Exception] = []

    async def open_output() -> None:
        try:
            outs.append(await AudioOut.open(fmt, src_rate, dst_rate))
        except Exception as exc:
            errors.append(exc)

    first: Audio | bool = False
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(open_output)
            try:
                first = await anext(chunks, False)
            except Exception as exc:
                errors.insert(0, exc)
        if errors:
            raise errors[0]
    except BaseException:  # an error, or the client left (cancelled)
        for out in outs:
            out.close()
        raise
    return first, outs[0]


async def with_first(first: Audio | bool, chunks: AsyncIterator[Audio]) -> AsyncGenerator[Audio]:
    """``first`` (a chunk :func:`first_chunk_and_output` took; False: the stream had none), then the rest."""
    if isinstance(first, bool):
        return
    yield first
    async for audio in chunks:
        yield audio
