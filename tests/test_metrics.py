"""Timing functions (TTFA, gaps, underrun as PERFORMANCE.md defines it) and the engine's collectors."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from omni_stream.metrics import (
    EngineMetrics,
    chunk_gaps,
    percentile,
    realtime_factor,
    ttfa,
    underrun,
    underrun_of,
)
from omni_stream.requests import Timings


def timings(arrivals: list[float], durations: list[float], created: float = 0.0) -> Timings:
    t = Timings(created=created)
    for arrival, duration in zip(arrivals, durations, strict=True):
        t.record_chunk(duration, now=arrival)
    return t


def test_underrun_is_zero_when_every_chunk_arrives_before_the_player_needs_it():
    # Player starts at 1.0; it needs chunk 2 at 1.5 and chunk 3 at 2.0.
    assert underrun_of([1.0, 1.4, 1.9], [0.5, 0.5, 0.5]) == 0.0


def test_underrun_is_the_worst_lateness_against_audio_already_received():
    # Chunk 2 is needed at 1.5 (0.2 late); chunk 3 at 1.5 + 0.5 = 2.0, arrives 2.6 (0.6 late).
    assert underrun_of([1.0, 1.7, 2.6], [0.5, 0.5, 0.5]) == pytest.approx(0.6)
    # Lateness does not accumulate into the schedule: the player's clock is first arrival + audio received.
    assert underrun_of([0.0, 0.08, 0.5, 0.58], [0.08, 0.08, 0.08, 0.08]) == pytest.approx(0.5 - 0.16)


def test_underrun_of_edge_cases():
    assert underrun_of([], []) == 0.0
    assert underrun_of([3.0], [0.1]) == 0.0  # the first chunk defines the start: never late
    with pytest.raises(ValueError):
        underrun_of([1.0], [])


def test_timing_functions_over_a_request():
    t = timings([0.2, 0.3, 0.6], [0.16, 0.16, 0.16], created=0.0)
    assert ttfa(t) == pytest.approx(0.2)
    assert chunk_gaps(t) == pytest.approx([0.1, 0.3])
    assert underrun(t) == pytest.approx(0.6 - (0.2 + 0.32))
    assert realtime_factor(t) == pytest.approx(0.48 / 0.6)
    empty = Timings(created=0.0)
    assert ttfa(empty) is None and chunk_gaps(empty) == [] and underrun(empty) == 0.0
    assert realtime_factor(empty) is None


def test_percentile_interpolates():
    assert percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert percentile([5.0], 99) == 5.0
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)
    assert percentile([], 50) != percentile([], 50)  # nan


def test_collectors_live_in_their_own_registry():
    a, b = EngineMetrics(), EngineMetrics()  # two engines in one process never clash
    sched = a.scheduler("talker")
    sched.observe_batch(batch_size=3, seconds=0.004)
    sched.observe_queues(running=3, waiting=2, paused=1)
    sched.observe_admission(0.3)
    a.observe_request(timings([0.1, 0.2], [0.08, 0.08]), "ok")
    a.observe_request(Timings(), "cancelled")
    text = generate_latest(a.registry).decode()
    assert 'omni_stream_requests_running{scheduler="talker"} 3.0' in text
    assert 'omni_stream_requests_waiting{scheduler="talker"} 2.0' in text
    assert 'omni_stream_requests_paused{scheduler="talker"} 1.0' in text
    assert 'omni_stream_batch_size_sum{scheduler="talker"} 3.0' in text
    assert 'omni_stream_step_seconds_count{scheduler="talker"} 1.0' in text
    assert 'omni_stream_queue_seconds_sum{scheduler="talker"} 0.3' in text
    assert "omni_stream_ttfa_seconds_count 1.0" in text
    assert "omni_stream_chunk_gap_seconds_count 1.0" in text
    assert 'omni_stream_requests_total{outcome="cancelled"} 1.0' in text
    assert "omni_stream_audio_seconds_total 0.16" in text
    assert "talker" not in generate_latest(b.registry).decode()
