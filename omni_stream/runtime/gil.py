"""The interpreter's thread switch interval, shortened so the device worker gets the GIL back promptly.

Every torch call releases the GIL while it runs and takes it back after. When another thread (the event loop
streaming many requests) is running Python at that moment, CPython makes the returning thread wait until the
holder is asked to drop the GIL, which happens once per *switch interval* (5 ms by default). A decode step makes
a few such calls and a codec job a dozen, so under load each of them can cost up to 5 ms of wall time in which
the GPU idles. A 0.5 ms interval bounds that wait tenfold; the cost is more frequent hand-offs between
Python-bound threads (microseconds each). The setting is process-wide, so it is applied once, by the model
families that run hot loops on a GPU, and never raises an interval someone set lower.
"""

from __future__ import annotations

import logging
import sys

from omni_stream.runtime.settings import milliseconds

log = logging.getLogger(__name__)

ENV_SWITCH_INTERVAL = "OMNI_STREAM_SWITCH_INTERVAL_MS"  # milliseconds; 0 leaves the interpreter's setting alone
DEFAULT_SWITCH_INTERVAL_MS = 0.5


def requested_interval_ms(env: dict[str, str] | None = None) -> float:
    """The interval to use (ms): ``$OMNI_STREAM_SWITCH_INTERVAL_MS`` if set, else 0.5; 0 means leave it alone."""
    return milliseconds(ENV_SWITCH_INTERVAL, DEFAULT_SWITCH_INTERVAL_MS, env)


def shorten_switch_interval(env: dict[str, str] | None = None) -> float:
    """Lower the switch interval to the requested one (never raise it); returns the interval in force (s)."""
    ms = requested_interval_ms(env)
    current = sys.getswitchinterval()
    if ms > 0 and ms / 1000 < current:
        sys.setswitchinterval(ms / 1000)
        log.info("thread switch interval %.2f ms (was %.2f ms)", ms, current * 1000)
    return sys.getswitchinterval()
