"""The objects a model load leaves, kept out of the garbage collector's full passes while an engine is open.

A full (generation 2) collection walks every tracked object, and after loading a model that is millions of
them (torch, transformers, the model's modules). The first burst of requests allocates enough to start one:
it held the GIL for 222 ms on CPU (128 requests at once on the tiny model, ``benchmarks/burst_probe.py``),
and every thread waits meanwhile: the event loop, the device worker between its steps, every stream.
Freezing moves the objects alive after loading into the permanent generation, which collections skip (vLLM
and SGLang freeze after start-up for the same reason); objects made later are collected as before. Holds are
counted (each open engine, and the serving app while it runs); when the last is given back the heap is unfrozen,
so a process that loads and closes engines (a test suite) does not keep their cyclic garbage for good. A process
that exits with an engine still open unfreezes at exit: frozen objects are never collected at shutdown, and
extension modules (triton's nanobind) then report them as leaked.
"""

from __future__ import annotations

import atexit
import gc
import logging
import threading

log = logging.getLogger(__name__)

_lock = threading.Lock()
_holders = 0  # open engines that froze the heap
_exit_hook = False


def freeze_loaded_heap() -> None:
    """Collect once, then freeze everything alive (blocking: the collection walks the whole heap once)."""
    global _holders, _exit_hook
    with _lock:
        gc.collect()
        gc.freeze()
        _holders += 1
        if not _exit_hook:  # an engine never closed: unfreeze at exit, so the interpreter's last pass sees it all
            atexit.register(gc.unfreeze)
            _exit_hook = True
        log.debug("froze %d objects out of garbage collection", gc.get_freeze_count())


def release_loaded_heap() -> None:
    """One holder is done; the last one unfreezes the heap."""
    global _holders
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        if _holders == 0:
            gc.unfreeze()
