"""Where the device worker's time went: its log (:class:`~omni_stream.worker.WorkRecord`) summed by piece of work.

The worker does one thing at a time and notes each piece as it starts, so a piece lasts until the next entry (the
last one until ``end``). :func:`work_profile` sums those spans per ``(kind, name)`` over a window of the log:
``idle`` is the worker waiting for work, ``step`` / ``resume`` a scheduler's step (``resume``: a throughput step
going on after the realtime work of one of its yield points), ``job`` / ``batch`` one-off and batched jobs (a
codec window, an encoder call), ``hold`` a throughput step waiting at a yield point for a stream's next job.

Benchmarks read it to say whether a slow stream waited on the device (busy with what) or on something else (the
worker idle meanwhile): the voice bench prints it per level (``benchmarks/voice_bench.py --work-profile``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from omni_stream.worker import WorkRecord

IDLE = "idle"


@dataclass(slots=True, frozen=True)
class WorkShare:
    """``count`` pieces of one ``(kind, name)`` lasting ``seconds`` in all."""

    kind: str
    name: str
    count: int
    seconds: float


@dataclass(slots=True, frozen=True)
class WorkProfile:
    """A window of ``span_s`` seconds of the worker's log: its shares, the longest first. ``complete`` False when
    the log had already dropped entries of the window (it keeps the last ``LOG_SIZE``), so it starts late."""

    span_s: float
    shares: tuple[WorkShare, ...]
    complete: bool = True

    @property
    def idle_s(self) -> float:
        return sum(s.seconds for s in self.shares if s.kind == IDLE)

    @property
    def busy_fraction(self) -> float:
        """The share of the window the worker was not idle (0 for an empty window)."""
        return 0.0 if self.span_s <= 0 else 1.0 - self.idle_s / self.span_s

    def summary(self) -> dict[str, object]:
        """A JSON-ready form: seconds per ``kind:name`` (rounded to ms), the busy fraction, the pieces counted."""
        return {
            "span_s": round(self.span_s, 3),
            "busy_fraction": round(self.busy_fraction, 3),
            "complete": self.complete,
            "seconds": {_label(s): round(s.seconds, 3) for s in self.shares},
            "counts": {_label(s): s.count for s in self.shares},
        }


def _label(share: WorkShare) -> str:
    return f"{share.kind}:{share.name}" if share.name else share.kind


def work_profile(records: Iterable[WorkRecord], start: float, end: float, after_seq: int = -1) -> WorkProfile:
    """The log's pieces within ``[start, end)`` (``perf_counter`` times) summed per ``(kind, name)``.

    A piece that began before ``start`` counts from ``start``; ``after_seq``: the last entry a previous window
    read (entries up to it are skipped, and ``complete`` is False when the first entry left is not the next one).
    Before the first entry of the window the worker's state is unknown, so the window begins at the earlier of that
    entry and the piece running at ``start`` (the last entry before it)."""
    if end < start:
        raise ValueError(f"the window ends ({end}) before it starts ({start})")
    entries = [r for r in records if r.seq > after_seq and r.at < end]
    complete = not entries or after_seq < 0 or entries[0].seq == after_seq + 1
    before = [r for r in entries if r.at <= start]
    inside = [r for r in entries if r.at > start]
    pieces = ([before[-1]] if before else []) + inside
    if not pieces:
        return WorkProfile(0.0, (), complete)
    begin = max(start, pieces[0].at)
    totals: dict[tuple[str, str], list[float]] = {}
    for piece, nxt in zip(pieces, [*pieces[1:], None], strict=True):
        lo = max(piece.at, begin)
        hi = end if nxt is None else nxt.at
        entry = totals.setdefault((piece.kind, piece.name), [0, 0.0])
        entry[0] += 1
        entry[1] += max(0.0, hi - lo)
    shares = sorted(
        (WorkShare(kind, name, int(count), seconds) for (kind, name), (count, seconds) in totals.items()),
        key=lambda s: (-s.seconds, s.kind, s.name),
    )
    return WorkProfile(end - begin, tuple(shares), complete)
