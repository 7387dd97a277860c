"""Request timings as pure functions over :class:`~omni_stream.requests.Timings`, and Prometheus collectors.

Units: seconds everywhere. The collectors live in a registry the engine owns (never the global one), so
several engines in one process (tests) never clash; serve them with
``prometheus_client.generate_latest(engine.metrics.registry)``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from omni_stream.requests import Timings

# --- pure functions ---


def ttfa(t: Timings) -> float | None:
    """Seconds from request creation to the first audio chunk (None before it)."""
    return None if t.first_chunk is None else t.first_chunk - t.created


def chunk_gaps(t: Timings) -> list[float]:
    """Seconds between consecutive chunk arrivals."""
    return [b - a for a, b in itertools.pairwise(t.chunk_times)]


def underrun_of(arrivals: Sequence[float], durations: Sequence[float]) -> float:
    """Worst deficit of a player that starts at the first arrival and plays in real time, floored at 0.

    max over chunks i of (arrival_i - (arrival_0 + sum of durations of chunks before i)).
    """
    if len(arrivals) != len(durations):
        raise ValueError(f"{len(arrivals)} arrivals but {len(durations)} durations")
    if not arrivals:
        return 0.0
    start, played, worst = arrivals[0], 0.0, 0.0
    for arrival, duration in zip(arrivals, durations, strict=True):
        worst = max(worst, arrival - (start + played))
        played += duration
    return worst


def underrun(t: Timings) -> float:
    """:func:`underrun_of` over a request's recorded chunks (seconds)."""
    return underrun_of(t.chunk_times, t.chunk_durations)


def realtime_factor(t: Timings) -> float | None:
    """Seconds of audio per wall second from creation to the last chunk (x real time); None without chunks."""
    if not t.chunk_times:
        return None
    wall = t.chunk_times[-1] - t.created
    return None if wall <= 0 else t.audio_seconds / wall


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation; nan when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


# --- Prometheus ---

_STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8)


class SchedulerMetrics:
    """One scheduler's view of the engine's collectors (labelled by scheduler name)."""

    def __init__(self, engine: EngineMetrics, name: str) -> None:
        self.running = engine.requests_running.labels(name)
        self.waiting = engine.requests_waiting.labels(name)
        self.paused = engine.requests_paused.labels(name)
        self.batch_size = engine.batch_size.labels(name)
        self.step_seconds = engine.step_seconds.labels(name)
        self.queue_seconds = engine.queue_seconds.labels(name)

    def observe_admission(self, waited: float) -> None:
        """Record the seconds a sequence waited from its request's creation to its admission into a batch."""
        self.queue_seconds.observe(waited)

    def observe_batch(self, batch_size: int, seconds: float) -> None:
        """Record one step's batch size and model time (worker thread; the collectors are thread-safe)."""
        self.batch_size.observe(batch_size)
        self.step_seconds.observe(seconds)

    def observe_queues(self, running: int, waiting: int, paused: int) -> None:
        """Set the queue gauges; the scheduler calls it under its lock whenever a sequence changes queue."""
        self.running.set(running)
        self.waiting.set(waiting)
        self.paused.set(paused)


class EngineMetrics:
    """The engine's collectors, in their own ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None, *, namespace: str = "omni_stream") -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r, ns = self.registry, namespace
        self.requests_running = Gauge(
            "requests_running", "Sequences in the batch", ["scheduler"], namespace=ns, registry=r
        )
        self.requests_waiting = Gauge(
            "requests_waiting", "Sequences waiting for a slot", ["scheduler"], namespace=ns, registry=r
        )
        self.requests_paused = Gauge(
            "requests_paused", "Sequences paused by backpressure (slot kept)", ["scheduler"], namespace=ns, registry=r
        )
        self.batch_size = Histogram(
            "batch_size", "Sequences per model step", ["scheduler"], buckets=_BATCH_BUCKETS, namespace=ns, registry=r
        )
        self.step_seconds = Histogram(
            "step_seconds", "Model step time (s)", ["scheduler"], buckets=_STEP_BUCKETS, namespace=ns, registry=r
        )
        self.queue_seconds = Histogram(
            "queue_seconds",
            "Request creation to admission into a batch (s)",
            ["scheduler"],
            buckets=_LATENCY_BUCKETS,
            namespace=ns,
            registry=r,
        )
        self.ttfa_seconds = Histogram(
            "ttfa_seconds",
            "Request creation to first audio chunk (s)",
            buckets=_LATENCY_BUCKETS,
            namespace=ns,
            registry=r,
        )
        self.chunk_gap_seconds = Histogram(
            "chunk_gap_seconds",
            "Time between audio chunks of a request (s)",
            buckets=_LATENCY_BUCKETS,
            namespace=ns,
            registry=r,
        )
        self.requests_total = Counter(
            "requests_total", "Finished requests by outcome", ["outcome"], namespace=ns, registry=r
        )
        self.audio_seconds_total = Counter("audio_seconds_total", "Audio streamed (s)", namespace=ns, registry=r)

    def scheduler(self, name: str) -> SchedulerMetrics:
        return SchedulerMetrics(self, name)

    def observe_request(self, t: Timings, outcome: str) -> None:
        """Record one finished request: ``outcome`` is ``ok``, ``error``, ``cancelled`` or ``deadline``."""
        first = ttfa(t)
        if first is not None:
            self.ttfa_seconds.observe(first)
        for gap in chunk_gaps(t):
            self.chunk_gap_seconds.observe(gap)
        self.audio_seconds_total.inc(t.audio_seconds)
        self.requests_total.labels(outcome).inc()
