"""Transcripts of recordings longer than the model's window: cut at quiet points, transcribed window by window.

An ASR model such as Whisper hears at most ``TranscriptionInfo.max_seconds`` (30 s) per request; a meeting or a
voice memo is longer. :func:`split_windows` cuts the samples into consecutive windows of at most that length, each
cut at the quietest frame of the last :data:`SEARCH_SECONDS` before the window would overflow (a cut inside a
word costs that word on both sides; a pause costs nothing). :func:`transcribe_long` runs one engine request per
window and hands their text back in order as one stream:

- every window's request is built (and so checked by the engine) before anything runs, so a bad language or prompt
  is refused before the first byte of an answer;
- at most ``at_once`` windows run at a time (:data:`AT_ONCE`): together they batch on the model's scheduler, and a
  long recording does not take every batch slot from a voice agent's turns on the same model; the next window
  starts as the first running one is read to its end;
- window ``k``'s text is handed out after window ``k - 1``'s (a window that finished early waits in its channel,
  its batch slot already free), with a space between windows where neither side has one;
- :meth:`LongTranscript.aclose` (``async with`` does it) stops and releases every window, however the reader left.

Each window is transcribed on its own (the request's ``prompt`` guides every one of them, ``max_tokens`` bounds each
window), as vLLM does for long audio; decoding a window with the previous window's text as its prompt would make the
windows run one after another.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import AsyncIterator
from types import TracebackType
from typing import TYPE_CHECKING

import numpy as np

from omni_stream.chunks import TextDelta
from omni_stream.errors import InvalidRequestError, RequestCancelled
from omni_stream.request_streams import RequestStream, Usage
from omni_stream.transcription.spec import TranscriptionRequest, transcription_family

if TYPE_CHECKING:
    from omni_stream.engine import AsyncEngine

SEARCH_SECONDS = 2.0  # how far before a window's end its cut may move to find a pause
FRAME_SECONDS = 0.02  # the cut's resolution: the quietest frame of this length (its middle)
AT_ONCE = 4  # windows of one recording transcribed at a time


def split_windows(
    samples: np.ndarray,
    rate: int,
    max_seconds: float,
    search_seconds: float = SEARCH_SECONDS,
    frame_seconds: float = FRAME_SECONDS,
) -> tuple[tuple[int, int], ...]:
    """``(start, end)`` sample ranges that cover ``samples`` in order, each at most ``max_seconds`` long; every cut
    is at the middle of the quietest ``frame_seconds`` frame (least mean square) among the last ``search_seconds``
    before the window would pass ``max_seconds`` (the earliest such frame on a tie), or, where what is left fits
    two windows, before about its middle."""
    n = int(samples.size)
    limit = math.floor(max_seconds * rate)
    if limit < 1:
        raise ValueError(f"a window must hold at least one sample, got {max_seconds} s at {rate} Hz")
    frame = max(1, round(frame_seconds * rate))
    search = max(frame, round(search_seconds * rate))
    windows = []
    start = 0
    while n - start > limit:
        # Where two windows will do, the cut is sought about the middle of what is left: a recording just past the
        # limit is two halves, never a full window and a last one of a few milliseconds (Whisper invents text for
        # a window of next to nothing)
        end = start + min(limit, (n - start + search) // 2) if n - start <= 2 * limit else start + limit
        low = max(start + 1, end - search)
        frames = (end - low) // frame
        if frames == 0:
            cut = end
        else:
            part = samples[end - frames * frame : end].astype(np.float64)  # the frames end at the window's end
            energy = np.square(part).reshape(frames, frame).mean(axis=1)
            cut = end - frames * frame + int(np.argmin(energy)) * frame + frame // 2
        windows.append((start, cut))
        start = cut
    windows.append((start, n))
    return tuple(windows)


def _joined(before: str, text: str) -> str:
    """``text`` as it follows ``before`` from another window: a space between them unless one side has it."""
    if before and text and not before[-1].isspace() and not text[0].isspace():
        return " " + text
    return text


class LongTranscript:
    """The text of every window in order: an async iterator of text pieces (empty pieces are skipped) and an async
    context manager that releases every window on exit. ``windows``: the sample ranges; ``usage``: the windows'
    usage summed (so far)."""

    def __init__(self, streams: list[RequestStream[TextDelta]], windows: tuple[tuple[int, int], ...], at_once: int):
        self.windows = windows
        self._streams = streams
        self._at_once = at_once
        self._current = 0  # the window being read
        self._started = 0  # windows started so far (in order)
        self._text_end = ""  # the last character handed out (for the space between windows)
        self._closed = False

    @property
    def usage(self) -> Usage:
        totals = [s.usage.get("transcription", Usage()) for s in self._streams]
        return Usage(
            sum(u.input_tokens for u in totals),
            sum(u.output_tokens for u in totals),
            sum(u.input_audio_tokens for u in totals),
        )

    @property
    def reading(self) -> int:
        """The window whose text is being handed out (``len(windows)`` once all of it has been)."""
        return self._current

    @property
    def started(self) -> int:
        """How many windows have been started: never more than ``at_once`` past :attr:`reading`."""
        return self._started

    def _start_ahead(self) -> None:
        while self._started < len(self._streams) and self._started < self._current + self._at_once:
            self._streams[self._started].start()
            self._started += 1

    def __aiter__(self) -> AsyncIterator[str]:
        return self._pieces()

    async def _pieces(self) -> AsyncIterator[str]:
        while self._current < len(self._streams):
            if self._closed:
                raise RequestCancelled("the transcript was aborted")
            self._start_ahead()
            opened = False  # whether this window has handed out text (the space goes before its first piece only)
            async for out in self._streams[self._current]:
                text = out.chunk.text if opened else _joined(self._text_end, out.chunk.text)
                if text:
                    opened = True
                    self._text_end = text[-1]
                    yield text
            if self._closed:  # aborted: its windows end early, which must not read as the end of the recording
                raise RequestCancelled("the transcript was aborted")
            self._current += 1

    def abort(self) -> None:
        """Stop every window now, without waiting (safe in a cancelled ``finally``)."""
        self._closed = True
        for stream in self._streams:
            stream.abort()

    async def aclose(self) -> None:
        """Stop every window and wait until their batch slots are free (windows never started hold none)."""
        self.abort()
        for stream in self._streams[: self._started]:
            await stream.aclose()

    async def __aenter__(self) -> LongTranscript:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def window_requests(
    request: TranscriptionRequest, max_seconds: float | None
) -> tuple[tuple[tuple[int, int], ...], tuple[TranscriptionRequest, ...]]:
    """``request``'s windows (:func:`split_windows` at ``max_seconds``; None: one) and a request for each (ids
    ``<request_id>-<i>`` where there are several). Blocking numpy work over the whole recording: a server calls it
    off its event loop."""
    if request.streamed:
        raise InvalidRequestError("a long recording is transcribed from its whole samples, not a stream", "audio")
    assert isinstance(request.audio, np.ndarray)
    whole = ((0, int(request.audio.size)),)
    windows = whole if max_seconds is None else split_windows(request.audio, request.sample_rate, max_seconds)
    if len(windows) == 1:
        return windows, (request,)
    parts = tuple(
        dataclasses.replace(request, audio=request.audio[start:end], request_id=f"{request.request_id}-{i}")
        for i, (start, end) in enumerate(windows)
    )
    return windows, parts


def transcribe_windows(
    engine: AsyncEngine,
    windows: tuple[tuple[int, int], ...],
    parts: tuple[TranscriptionRequest, ...],
    *,
    at_once: int = AT_ONCE,
) -> LongTranscript:
    """The transcript of :func:`window_requests`' windows (see the module docstring). Invalid requests raise here
    (InvalidRequestError naming the field), before anything runs."""
    if at_once < 1:
        raise ValueError(f"at_once must be at least 1, got {at_once}")
    streams: list[RequestStream[TextDelta]] = []
    try:
        for part in parts:
            streams.append(engine.generate(part))
    except BaseException:
        for stream in streams:
            stream.abort()  # never started: nothing to wait for
        raise
    return LongTranscript(streams, windows, at_once)


def transcribe_long(engine: AsyncEngine, request: TranscriptionRequest, *, at_once: int = AT_ONCE) -> LongTranscript:
    """The transcript of ``request``'s whole-recording samples, in as many windows as the model needs
    (:func:`window_requests` on the caller's thread, then :func:`transcribe_windows`)."""
    max_seconds = transcription_family(engine.models).info.max_seconds
    return transcribe_windows(engine, *window_requests(request, max_seconds), at_once=at_once)
