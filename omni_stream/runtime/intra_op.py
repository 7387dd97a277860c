"""Per-request torch work on CPU threads beside the device worker runs on one intra-op thread.

A request's small CPU jobs (a VAD chunk, an utterance's log-mel features) run on the event loop's preparation
threads or anyio's, many at once when many sessions speak. With torch's default, each calling thread's ops start a
team of one thread per core: sixteen sessions' teams then spun on the cores the device worker and the event loop
needed (found with Silero on the GPU host). These shapes are too small to gain from sharing. Under OpenMP the
setting belongs to the calling thread, so the caller's own is put back afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def one_intra_op_thread() -> Iterator[None]:
    """The block's torch ops on the calling thread alone (see the module docstring)."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
