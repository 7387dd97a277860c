"""The CUDA streams the device worker launches on, by the class of its work (:mod:`omni_stream.device_policy`).

- Throughput steps (denoising, video chunks) on a side stream of their own (``DevicePolicy.throughput_stream``), so
  their kernels may run beside the realtime models' instead of queueing behind them.
- Realtime work on the default stream, or with ``DevicePolicy.realtime_priority`` on a stream of higher priority
  (:data:`REALTIME_PRIORITY`). CUDA's stream priorities order the blocks waiting for a multiprocessor: at equal
  priority, blocks of a kernel launched earlier go first, so a speech step's small kernels each wait until a large
  denoising GEMM or attention kernel queued before them has handed out all of its blocks; at a higher priority
  they wait only for blocks already running. The side stream has the lowest priority (0, the default stream's),
  so without this switch the two classes are equals on the device whatever the worker's order on the host.
- With ``DevicePolicy.throughput_fence``, no throughput step starts before the last one's device work is done. The
  host launches a large model's step far faster than the device runs it, so without it the side stream can queue
  many steps, and a step that reads results back (a preview, a finished image, a video chunk's frames) blocks the
  worker, and every realtime launch behind it, until the whole queue has run.
- With ``DevicePolicy.realtime_streams``, each realtime model's steps on a stream of its own (measured slower,
  off by default; :func:`realtime_streams`).

The realtime stream is the worker thread's current stream for all of its work (jobs, steps, CUDA graph replays),
and the families are loaded with it current, so what a load puts on the device (weights, graph captures, warm-up)
is ordered before the worker's first step on the same stream. Work of other threads (a Base reference's
extraction, the end-of-turn model) keeps its own streams and hands its results over through the host.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from omni_stream.worker import StepSource

# PyTorch keeps stream pools at priorities 0 (the lowest, the default stream's) to -3 (it clamps a request beyond
# that); -3 stays for the shortest work on every turn's critical path (codec windows, the end-of-turn model).
REALTIME_PRIORITY = -2

StreamContext = Callable[[], AbstractContextManager[object]]


def make_realtime_stream(device: str) -> torch.cuda.Stream | None:
    """A stream of :data:`REALTIME_PRIORITY` on ``device`` (None off CUDA). Blocking: it may initialise CUDA."""
    if not device.startswith("cuda"):
        return None
    return torch.cuda.Stream(device, priority=REALTIME_PRIORITY)


def current_on(stream: torch.cuda.Stream | None) -> Callable[[], None] | None:
    """The worker's ``init``: make ``stream`` its thread's current stream (None: nothing to do)."""
    if stream is None:
        return None
    return lambda: torch.cuda.set_stream(stream)


def loading_on(stream: torch.cuda.Stream | None) -> StreamContext:
    """Around a family's load (on a loading thread): ``stream`` current (a no-op context for None)."""
    if stream is None:
        return contextlib.nullcontext
    return lambda: torch.cuda.stream(stream)


def throughput_stream(device: str, realtime: torch.cuda.Stream | None = None) -> tuple[StreamContext | None, ...]:
    """On CUDA, two contexts: one that makes a side stream of its own current (made on first use, on the worker
    thread), for image and video steps; one that makes the realtime stream current again (``realtime``, or the
    default stream), for realtime work run at a yield point inside such a step. (None, None) elsewhere."""
    if not device.startswith("cuda"):
        return None, None
    made: list[torch.cuda.Stream] = []

    def side() -> AbstractContextManager[object]:
        if not made:
            made.append(torch.cuda.Stream(device))  # priority 0: the lowest
        return torch.cuda.stream(made[0])

    def back() -> AbstractContextManager[object]:
        return torch.cuda.stream(realtime if realtime is not None else torch.cuda.default_stream(device))

    return side, back


def throughput_fence(device: str) -> Callable[[], torch.cuda.Event] | None:
    """On CUDA, what the worker calls at the end of each throughput step, on its side stream: an event recorded
    there (``DevicePolicy.throughput_fence``). None elsewhere (a CPU step's work is done when it returns)."""
    if not device.startswith("cuda"):
        return None

    def fence() -> torch.cuda.Event:
        event = torch.cuda.Event()
        event.record()  # on the current stream: the step's side stream
        return event

    return fence


def realtime_streams(device: str, priority: int = 0) -> Callable[[StepSource], AbstractContextManager[object]] | None:
    """On CUDA, a context per realtime step source that makes a stream of the source's own current (of
    ``priority``, made on first use, on the worker thread), after the worker's stream's work so far (the jobs, whose
    device outputs a step may read). One model's step then neither queues its kernels behind another's nor waits, in
    the copy that ends it, for the other's work; what one model hands another goes through the host (tokens, text,
    codec codes). None elsewhere. Measured on the H200 (voice_bench run 37) it made the voice agent slower under load
    (the steps' kernels contend instead of queueing): off by default."""
    if not device.startswith("cuda"):
        return None
    streams: dict[int, tuple[StepSource, torch.cuda.Stream]] = {}  # id(source) -> (source, its stream)

    @contextlib.contextmanager
    def on_own_stream(source: StepSource) -> Iterator[None]:
        held = streams.get(id(source))
        if held is None or held[0] is not source:
            held = streams[id(source)] = (source, torch.cuda.Stream(device, priority=priority))
        stream = held[1]
        stream.wait_stream(torch.cuda.current_stream(device))  # the worker's stream: default or realtime
        with torch.cuda.stream(stream):
            yield

    return on_own_stream
