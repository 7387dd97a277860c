"""Pacing by the playback clock: let a stream run ahead of real-time playback by a bounded amount only.

Behind a buffering proxy (a load balancer, Ray Serve's proxy) transport backpressure never reaches the
engine: the proxy drains the socket as fast as it is written, so a stalled client would otherwise receive
(into the proxy's memory) a whole utterance generated at full speed. Pacing holds the next chunk back until
the audio already sent leads a real-time player by at most ``ahead`` seconds; while it waits, the upstream
stream is read no further, so the engine's own watermarks pause the request and generation stops too.

The player model: playback starts when a chunk is sent and runs in real time; when it runs dry (the
producer fell behind) it waits for the next chunk, which then plays from the moment it is sent. So
``Playback.ends_at`` is when everything sent so far has finished playing, and the lead is ``ends_at - now``.

Everything here is generic over chunks with a ``duration`` in seconds (:class:`omni_stream.chunks.Audio`,
or anything else that plays in real time) and over the clock, so tests drive it with a fake clock.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import anyio

DEFAULT_AHEAD = 2.0  # seconds of audio a paced stream may run ahead of playback (ARCHITECTURE section 3)


class Timed(Protocol):
    """A chunk that plays for ``duration`` seconds."""

    @property
    def duration(self) -> float: ...


class Clock(Protocol):
    """Monotonic seconds and a sleep on the same time base."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class AnyioClock:
    """The event loop's clock (``anyio.current_time``, ``anyio.sleep``)."""

    def now(self) -> float:
        return anyio.current_time()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


@dataclass(slots=True, frozen=True)
class Playback:
    """A real-time player's position: ``ends_at`` (clock seconds) is when the audio sent so far has played out.

    ``None`` until the first chunk is sent.
    """

    ends_at: float | None = None

    def lead(self, now: float) -> float:
        """Seconds of sent audio not yet played at ``now`` (0 when the player has run dry)."""
        return 0.0 if self.ends_at is None else max(0.0, self.ends_at - now)

    def sent(self, now: float, duration: float) -> Playback:
        """The player after a chunk of ``duration`` seconds is sent at ``now`` (it plays after what is queued)."""
        start = now if self.ends_at is None else max(self.ends_at, now)
        return Playback(start + max(0.0, duration))


def pace_delay(playback: Playback, now: float, ahead: float) -> float:
    """Seconds to wait at ``now`` before taking the next chunk, so that the lead never passes ``ahead`` seconds.

    Zero while the audio sent leads playback by ``ahead`` or less (and always before the first chunk); after
    waiting this long the lead is exactly ``ahead``, so the next chunk can add at most its own duration to it.
    """
    return max(0.0, playback.lead(now) - max(0.0, ahead))


T = TypeVar("T", bound=Timed)


class Pacer:
    """The playback clock of one outgoing stream (or of a session whose streams play one after another).

    ``wait()`` before sending a chunk, ``sent(duration)`` once it has been handed to the transport.
    """

    def __init__(self, ahead: float = DEFAULT_AHEAD, clock: Clock | None = None) -> None:
        if ahead < 0:
            raise ValueError(f"ahead must be >= 0 seconds, got {ahead}")
        self.ahead = ahead
        self.clock: Clock = clock if clock is not None else AnyioClock()
        self.playback = Playback()

    def delay(self) -> float:
        """Seconds :meth:`wait` would sleep now."""
        return pace_delay(self.playback, self.clock.now(), self.ahead)

    async def wait(self) -> None:
        """Sleep until the next chunk may be sent (returns at once when it may already)."""
        delay = self.delay()
        if delay > 0:
            await self.clock.sleep(delay)

    def sent(self, duration: float) -> None:
        """Record a chunk of ``duration`` seconds handed to the transport now."""
        self.playback = self.playback.sent(self.clock.now(), duration)

    def lead(self) -> float:
        """Seconds of sent audio a real-time player has not played yet."""
        return self.playback.lead(self.clock.now())


async def paced(chunks: AsyncIterable[T], pacer: Pacer) -> AsyncGenerator[T]:
    """Yield ``chunks`` no faster than ``pacer`` allows: each chunk is held until the audio already yielded leads
    playback by at most ``pacer.ahead`` seconds.

    At most one chunk is taken from upstream ahead of what was yielded: the producer's own backpressure
    pauses it while the chunk waits, and the end of the stream is seen as soon as upstream ends. Closing this
    generator closes ``chunks`` when it is an async generator.
    """
    iterator = aiter(chunks)
    try:
        async for chunk in iterator:
            await pacer.wait()
            pacer.sent(chunk.duration)
            yield chunk
    finally:
        close = getattr(iterator, "aclose", None)
        if close is not None:
            with anyio.CancelScope(shield=True):
                await close()
