"""Pacing by the playback clock: the pure policy and the async wrapper, on a fake clock (no wall time)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
import pytest

from omni_stream.chunks import Audio
from omni_stream.speech.pacing import Pacer, Playback, pace_delay, paced


class FakeClock:
    """Time moves only when someone sleeps (or a test advances it); every sleep is recorded."""

    def __init__(self) -> None:
        self.t = 100.0
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds


@dataclass(frozen=True)
class Piece:
    duration: float
    index: int = 0


def test_first_chunk_never_waits():
    assert pace_delay(Playback(), 5.0, 2.0) == 0.0
    assert pace_delay(Playback(), 5.0, 0.0) == 0.0


def test_no_wait_while_the_lead_is_within_the_bound():
    playback = Playback().sent(0.0, 1.5)  # plays until t=1.5
    assert playback.lead(0.0) == 1.5
    assert pace_delay(playback, 0.0, 2.0) == 0.0
    assert pace_delay(playback, 0.0, 1.5) == 0.0


def test_wait_brings_the_lead_back_to_the_bound():
    playback = Playback().sent(0.0, 3.0).sent(0.0, 1.0)  # 4 s queued at t=0
    assert pace_delay(playback, 0.0, 2.0) == pytest.approx(2.0)
    assert pace_delay(playback, 1.5, 2.0) == pytest.approx(0.5)
    assert pace_delay(playback, 2.0, 2.0) == 0.0
    assert playback.lead(2.0 + pace_delay(playback, 0.0, 2.0) - 2.0) == pytest.approx(2.0)


def test_a_player_that_ran_dry_restarts_at_the_next_chunk():
    # 1 s sent at t=0, the producer stalls until t=5: the player waited, so the next chunk plays from t=5
    playback = Playback().sent(0.0, 1.0)
    assert playback.lead(5.0) == 0.0
    later = playback.sent(5.0, 1.0)
    assert later.ends_at == 6.0
    # no credit is earned by the stall: a burst after it is held to the bound again
    burst = later.sent(5.0, 3.0)
    assert pace_delay(burst, 5.0, 2.0) == pytest.approx(2.0)


def test_negative_bound_is_refused():
    with pytest.raises(ValueError):
        Pacer(-1.0, FakeClock())


async def test_paced_holds_a_fast_producer_to_the_bound():
    clock = FakeClock()
    start = clock.t

    async def producer():  # produces instantly: only pacing spends time
        for i in range(10):
            yield Piece(0.5, i)

    pacer = Pacer(2.0, clock)
    sent = [(piece.index, clock.now() - start) async for piece in paced(producer(), pacer)]
    assert [i for i, _ in sent] == list(range(10))
    # the first 2 s go at once and one more chunk while the lead is exactly at the bound; then one chunk
    # per 0.5 s of playback
    assert [t for _, t in sent] == pytest.approx([0, 0, 0, 0, 0, 0.5, 1.0, 1.5, 2.0, 2.5])
    assert sum(clock.sleeps) == pytest.approx(2.5)
    # the lead never exceeded the bound plus one chunk
    assert pacer.lead() == pytest.approx(2.5)


async def test_paced_never_waits_for_a_producer_slower_than_real_time():
    clock = FakeClock()

    async def slow():
        for i in range(5):
            clock.t += 0.6  # takes 0.6 s of clock to make 0.5 s of audio
            yield Piece(0.5, i)

    pacer = Pacer(1.0, clock)
    assert [p.index async for p in paced(slow(), pacer)] == list(range(5))
    assert clock.sleeps == []


async def test_paced_takes_at_most_one_chunk_ahead_of_what_it_yielded():
    clock = FakeClock()
    pulled = 0

    async def producer():
        nonlocal pulled
        for i in range(100):
            pulled += 1
            yield Piece(1.0, i)

    pacer = Pacer(2.0, clock)
    stream = paced(producer(), pacer)
    got = [await anext(stream) for _ in range(3)]
    assert [p.index for p in got] == [0, 1, 2]
    assert pulled == 3
    assert pacer.lead() == pytest.approx(3.0)
    waiting = asyncio.ensure_future(anext(stream))  # the fourth chunk is taken, then held by the pacer
    await asyncio.sleep(0)
    assert pulled == 4 and clock.sleeps == [1.0]
    assert (await waiting).index == 3
    assert pulled == 4
    await stream.aclose()


async def test_closing_the_paced_stream_closes_upstream():
    clock = FakeClock()
    closed = []

    async def producer():
        try:
            for i in range(100):
                yield Piece(1.0, i)
        finally:
            closed.append(True)

    stream = paced(producer(), Pacer(0.0, clock))
    await anext(stream)
    await anext(stream)
    await stream.aclose()
    assert closed == [True]


async def test_paced_audio_chunks_use_their_duration():
    clock = FakeClock()
    rate = 24000

    async def audio():
        for _ in range(6):
            yield Audio(np.zeros(rate // 2, np.float32), rate)  # 0.5 s each

    chunks = [a async for a in paced(audio(), Pacer(1.0, clock))]
    assert len(chunks) == 6
    assert sum(clock.sleeps) == pytest.approx(3.0 - 1.0 - 0.5)


async def test_one_pacer_across_streams_played_back_to_back():
    """A session's units play one after another: one playback clock spans them, so the lead stays bounded."""
    clock = FakeClock()
    pacer = Pacer(1.0, clock)

    async def unit(n):
        for i in range(n):
            yield Piece(0.5, i)

    for _ in range(3):
        async for _piece in paced(unit(4), pacer):
            assert pacer.lead() <= 1.0 + 0.5 + 1e-9
    # 6 s of audio, 1 s lead allowed, the last chunk's 0.5 s on top
    assert sum(clock.sleeps) == pytest.approx(6.0 - 1.0 - 0.5)
