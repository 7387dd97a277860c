"""Short Python-bound request jobs (building and tokenizing a prompt) off the event loop, on few threads.

Preparing a prompt is ~0.1 ms of Python that holds the GIL. Through anyio's default pool up to 40 such jobs
run at once, so a burst of 128 requests first started up to 40 threads (each start blocks the event loop's
thread until the new thread runs) and then had them take turns at the GIL with the event loop and the device
worker: on the H200 a burst of 128 waited 200-270 ms for its first prefill and the event loop fell up to
250 ms behind, and a burst of 32 was split over two prefills because only part of it had been prepared
(``benchmarks/burst_probe.py``; ``benchmarks/results/tts_bench.md``, run 22). A job that holds the GIL gains
nothing from a second thread, so these jobs share :data:`PREPARE_THREADS` threads per event loop
(``$OMNI_STREAM_PREPARE_THREADS`` sets another number; measured in ``tts_bench.md``, run 22). A burst's prompts
are then ready one after another; the talker's scheduler holds the first of them until the rest are prepared
(:func:`omni_stream.admission.hold_newcomers`, run 23), so the burst still prefills in one step.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TypeVar, TypeVarTuple

import anyio.to_thread
from anyio import CapacityLimiter
from anyio.lowlevel import RunVar

from omni_stream.errors import ConfigError

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

# Two, not one: a prompt that is slow to build (a long text) does not hold up every other request's.
PREPARE_THREADS = 2
ENV_PREPARE_THREADS = "OMNI_STREAM_PREPARE_THREADS"


def prepare_threads(env: Mapping[str, str] | None = None) -> int:
    """Threads per event loop for preparation jobs: ``$OMNI_STREAM_PREPARE_THREADS`` (1-64), else 2."""
    raw = (os.environ if env is None else env).get(ENV_PREPARE_THREADS, "").strip()
    if not raw:
        return PREPARE_THREADS
    if not raw.isdigit() or not 1 <= int(raw) <= 64:
        raise ConfigError(f"{ENV_PREPARE_THREADS} must be a whole number of threads within 1..64, got {raw!r}")
    return int(raw)


_LIMITER: RunVar[CapacityLimiter] = RunVar("omni_stream_prepare_limiter")


def prepare_limiter() -> CapacityLimiter:
    """The event loop's limiter for preparation jobs (one per loop, as anyio's own default limiter)."""
    try:
        return _LIMITER.get()
    except LookupError:
        limiter = CapacityLimiter(prepare_threads())
        _LIMITER.set(limiter)
        return limiter


async def run_prepare(fn: Callable[[*Ts], T], *args: *Ts) -> T:
    """``fn(*args)`` on one of the loop's preparation threads (at most :func:`prepare_threads` at once)."""
    return await anyio.to_thread.run_sync(fn, *args, limiter=prepare_limiter())
