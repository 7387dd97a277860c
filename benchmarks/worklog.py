"""The device worker's log from a benchmark's own server process, on the clients' clock.

A benchmark server that loads its engine with ``record=True`` adds :func:`worklog_route`; the benchmark reads the
entries with :func:`fetch_worklog` and sums a window of them with :func:`omni_stream.runtime.work_profile.work_profile`
(where the worker's time went while the clients waited) or lists its longest pieces with :func:`longest_pieces`
(one piece of work that held every other model). Server and clients run on one machine: ``time.monotonic()`` is
one clock for both processes.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

from omni_stream.device_policy import WorkClass
from omni_stream.worker import WorkRecord


def worklog_route(app: Any) -> Any:
    """``GET /bench/worklog?after=SEQ`` (a benchmark's server only): the device worker's log entries after ``SEQ``
    as ``[seq, kind, name, work class, at, rows]``, ``at`` on ``time.monotonic()`` (the clients' clock), ``rows`` a
    scheduler step's batch (newcomers, running rows) or null; ``?last=1``: the newest entry only."""
    from starlette.responses import JSONResponse

    async def worklog(request: Any) -> Any:
        after = int(request.query_params.get("after", "-1"))
        offset = time.monotonic() - time.perf_counter()  # the log's perf_counter times -> the clients' clock
        log = app.state.omni.engine.worker.log
        records = list(log)[-1:] if request.query_params.get("last") else list(log)
        entries = [[r.seq, r.kind, r.name, str(r.work_class), r.at + offset, r.rows] for r in records if r.seq > after]
        return JSONResponse(entries)

    return worklog


def fetch_worklog(base_url: str, after: int) -> list[WorkRecord]:
    """The worker's log entries after ``after`` (:func:`worklog_route` at ``base_url``), ``at`` on
    ``time.monotonic()``."""
    return _read(f"{base_url}/bench/worklog?after={after}")


def _read(url: str) -> list[WorkRecord]:
    with urllib.request.urlopen(url, timeout=30) as response:
        rows = json.loads(response.read())
    return [
        WorkRecord(seq, kind, name, WorkClass(cls), at=at, rows=tuple(batch) if batch else None)
        for seq, kind, name, cls, at, batch in rows
    ]


def last_seq(base_url: str) -> int:
    """The newest log entry's sequence number now (-1: none): a window's entries are the ones after it."""
    return max((r.seq for r in _read(f"{base_url}/bench/worklog?last=1")), default=-1)


def longest_pieces(log: list[WorkRecord], start: float, end: float, top: int = 5) -> list[dict[str, Any]]:
    """The ``top`` longest single pieces of work within ``[start, end)`` (a piece lasts until the next entry; idle
    is left out), each as ``{"piece": "kind:name", "class", "ms", "at_ms"}`` (``at_ms``: its start after ``start``)."""
    pieces = [
        {"piece": _label(piece), "class": str(piece.work_class), "ms": round(1000 * (hi - lo), 1),
         "at_ms": round(1000 * (lo - start), 1)}
        for piece, lo, hi in _within(log, start, end) if piece.kind != "idle"
    ]  # fmt: skip
    return sorted(pieces, key=lambda p: -p["ms"])[:top]


def _within(log: list[WorkRecord], start: float, end: float) -> Iterator[tuple[WorkRecord, float, float]]:
    """Each piece of the log that overlaps ``[start, end)``, in order, with its span cut to the window (a piece
    lasts until the next entry)."""
    for piece, nxt in zip(log, [*log[1:], None], strict=True):
        lo, hi = max(piece.at, start), min(end, nxt.at if nxt is not None else end)
        if hi > lo:
            yield piece, lo, hi


def _label(piece: WorkRecord) -> str:
    return f"{piece.kind}:{piece.name}" if piece.name else piece.kind


def step_sequence(log: list[WorkRecord], start: float, end: float, most: int = 40) -> list[list[Any]]:
    """Each piece of work within ``[start, end)`` in order, idle included, as ``[label, ms, newcomers, running]``
    (the last two a scheduler step's batch, else null): the order in which models held the device, at most
    ``most`` pieces (the first ones)."""
    pieces: list[list[Any]] = []
    for piece, lo, hi in _within(log, start, end):
        newcomers, running = piece.rows if piece.rows is not None else (None, None)
        pieces.append([_label(piece), round(1000 * (hi - lo), 1), newcomers, running])
        if len(pieces) == most:
            break
    return pieces


def step_sequence_line(pieces: list[list[Any]]) -> str:
    """:func:`step_sequence` in one line: ``text+3/29 12.1`` is a text step that prefilled 3 newcomers beside 29
    running rows in 12.1 ms."""
    parts = []
    for label, ms, newcomers, running in pieces:
        name = label.split(":", 1)[-1] if label.startswith("step:") else label
        rows = f"+{newcomers}/{running}" if newcomers is not None else ""
        parts.append(f"{name}{rows} {ms:.1f}")
    return ", ".join(parts)


def loop_route(meter: Any) -> Any:
    """``GET /bench/loop`` (a benchmark's server only): what its event loop ran since the last call
    (``loop_meter.LoopMeter.report``: the longest callbacks, the code sampled inside them, stalls, and the
    timeline of callbacks over a millisecond), then forgets it. The first call installs the meter on the loop (the
    handler runs on the loop's thread)."""
    from starlette.responses import JSONResponse

    async def loop(request: Any) -> Any:
        if meter._thread is None:
            meter.install()
        report = meter.report(5, timeline=True)
        meter.reset()
        return JSONResponse(report)

    return loop


def fetch_loop(base_url: str) -> dict[str, Any]:
    """:func:`loop_route`'s report at ``base_url`` (and the meter starts a new window)."""
    with urllib.request.urlopen(f"{base_url}/bench/loop", timeout=30) as response:
        return dict(json.loads(response.read()))


def loop_line(report: dict[str, Any], top: int = 3) -> str:
    """A :func:`fetch_loop` report in one line: the longest single callbacks (wall ms) and where the longest ran;
    for a loop the meter cannot time (uvloop's), that it was not measured."""
    if report.get("measurable") is False:
        loop = report.get("loop") or "its loop"
        return f"    event loop: not measured ({loop} runs its callbacks outside asyncio's; serve --loop asyncio)"
    longest = ", ".join(f"{r['what']} {r['max_ms']:.0f} ms" for r in report.get("longest_wall", [])[:top])
    inside = "; ".join(f"{s['where']} ({s['samples']})" for s in report.get("sampled_inside_long_callbacks", [])[:2])
    stalls = len(report.get("stalls", []))
    where = f"; inside: {inside}" if inside else ""
    return f"    event loop: longest callbacks {longest or '-'}; stalls {stalls}{where}"
