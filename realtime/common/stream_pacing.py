"""Streamed audio leaving the server: counted, and paced by the playback clock when the settings ask for it.

``Settings.pace_streams_seconds`` (None: off) bounds how far a stream runs ahead of a real-time player;
it is meant for deployments behind a buffering proxy, where transport backpressure never reaches the engine
(see :mod:`omni_stream.speech.pacing`). ``omni_stream_audio_sent_seconds_total`` counts the audio handed to the
transport either way, so the run-ahead of a stream is visible from outside.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

import anyio
from prometheus_client import Counter

from omni_stream.chunks import Audio
from omni_stream.realtime.state import ServerState
from omni_stream.speech.pacing import Pacer, paced

PCM16_BYTES = 2


async def _counted(chunks: AsyncIterator[Audio], counter: Counter) -> AsyncGenerator[Audio]:
    async for audio in chunks:
        counter.inc(audio.duration)
        yield audio


def paced_audio(state: ServerState, chunks: AsyncIterator[Audio], transport: str) -> AsyncGenerator[Audio]:
    """``chunks`` of an HTTP stream, counted as sent and (with ``pace_streams_seconds``) paced."""
    ahead = state.settings.pace_streams_seconds
    # counted after pacing: a chunk the pacer holds back has not been sent
    return _counted(
        chunks if ahead is None else paced(chunks, Pacer(ahead)), state.metrics.audio_sent.labels(transport)
    )


class SessionPacer:
    """One playback clock for a WebSocket session: its units play one after another, so they share it.

    ``wait()`` before sending a frame (``interrupt()`` ends a wait at once, for ``input.cancel``);
    ``sent(seconds)`` after.
    """

    def __init__(self, state: ServerState, transport: str = "ws") -> None:
        ahead = state.settings.pace_streams_seconds
        self._pacer = None if ahead is None else Pacer(ahead)
        self._counter = state.metrics.audio_sent.labels(transport)
        self._scope: anyio.CancelScope | None = None

    async def wait(self) -> None:
        if self._pacer is None:
            return
        with anyio.CancelScope() as scope:
            self._scope = scope
            try:
                await self._pacer.wait()
            finally:
                self._scope = None

    def interrupt(self) -> None:
        if self._scope is not None:
            self._scope.cancel()

    def sent(self, seconds: float) -> None:
        self._counter.inc(seconds)
        if self._pacer is not None:
            self._pacer.sent(seconds)


def pcm_seconds(data: bytes, sample_rate: int) -> float:
    """Seconds of PCM16 mono audio in ``data``."""
    return len(data) / (PCM16_BYTES * sample_rate)
