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

log = logging.getLogger(__name__)


def shorten_switch_interval(ms: float) -> float:
    """Lower the switch interval to ``ms`` milliseconds (``Tuning.switch_interval_ms``; 0 leaves it alone, and it is
    never raised); returns the interval in force (s)."""
    current = sys.getswitchinterval()
    if ms > 0 and ms / 1000 < current:
        sys.setswitchinterval(ms / 1000)
        log.info("thread switch interval %.2f ms (was %.2f ms)", ms, current * 1000)
    return sys.getswitchinterval()
