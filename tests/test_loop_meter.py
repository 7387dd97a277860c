"""The benchmarks' event-loop meter (``benchmarks/loop_meter.py``) times asyncio's callbacks, and says so when the
loop it is installed on runs them elsewhere (uvloop's, in C: uvicorn's choice where uvloop is installed), instead of
reporting an idle loop."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    for name in ("loop_meter", "worklog"):
        sys.modules.pop(name, None)
    import loop_meter
    import worklog

    return loop_meter, worklog


def test_an_asyncio_loop_is_timed_callback_by_callback(bench):
    loop_meter, worklog = bench
    meter = loop_meter.LoopMeter(sample_after=1.0)

    async def main() -> dict:
        meter.install()
        try:
            for _ in range(5):
                await asyncio.sleep(0)
            return meter.report()
        finally:
            meter.uninstall()

    report = asyncio.run(main())
    assert report["measurable"] and report["loop"].startswith("asyncio."), report
    assert report["callbacks"] >= 4 and report["longest_wall"], report  # the task's steps after install()
    assert "not measured" not in worklog.loop_line(report)


def test_a_loop_outside_asyncios_handles_is_reported_unmeasured(bench, monkeypatch):
    loop_meter, worklog = bench

    class CLoop:  # stands for uvloop.Loop: not an asyncio.BaseEventLoop, its callbacks never reach Handle._run
        pass

    monkeypatch.setattr(asyncio, "get_running_loop", lambda: CLoop())
    meter = loop_meter.LoopMeter()
    meter.install()
    try:
        report = meter.report()
    finally:
        meter.uninstall()
    assert report["measurable"] is False and report["loop"].endswith("CLoop"), report
    line = worklog.loop_line(report)
    assert "not measured" in line and "CLoop" in line and "serve --loop asyncio" in line


def test_callbacks_over_a_millisecond_are_kept_on_a_timeline_in_monotonic_time(bench):
    loop_meter, _ = bench
    meter = loop_meter.LoopMeter(sample_after=1.0)

    def hold(seconds: float) -> None:
        until = time.perf_counter() + seconds
        while time.perf_counter() < until:
            pass

    async def main() -> tuple[dict, float, float]:
        meter.install()
        try:
            before = time.monotonic()
            asyncio.get_running_loop().call_soon(hold, 0.005)
            await asyncio.sleep(0.01)
            return meter.report(timeline=True), before, time.monotonic()
        finally:
            meter.uninstall()

    report, before, after = asyncio.run(main())
    (kept,) = [c for c in report["timeline"] if c["what"].endswith("hold")]
    assert kept["ms"] >= 5.0 and before <= kept["at"] <= after, kept
    assert "timeline" not in meter.report()  # only when asked: other reports stay small


def test_a_window_counts_only_the_callbacks_that_started_inside_it(bench):
    loop_meter, _ = bench
    report = {
        "measurable": True,
        "timeline": [
            {"at": 9.99, "what": "task before", "ms": 50.0, "cpu_ms": 50.0},
            {"at": 10.02, "what": "task speech", "ms": 4.0, "cpu_ms": 4.0},
            {"at": 10.05, "what": "task image", "ms": 30.0, "cpu_ms": 29.0},
            {"at": 10.07, "what": "task speech", "ms": 2.0, "cpu_ms": 2.0},
            {"at": 10.10, "what": "task after", "ms": 80.0, "cpu_ms": 80.0},
        ],
    }
    held = loop_meter.window(report, 10.0, 10.1)
    assert held["window_ms"] == 100.0 and held["callbacks"] == 3 and held["held_ms"] == 36.0
    assert held["by_what_ms"] == {"task image": 30.0, "task speech": 6.0}
    assert held["longest"][0] == {"what": "task image", "ms": 30.0, "at_ms": 50.0}
    assert "held 36 ms by 3 callbacks" in loop_meter.window_line("server", held)
    assert loop_meter.window({"measurable": False, "timeline": []}, 10.0, 10.1) == {}  # uvloop's: not measured
    assert loop_meter.window(report, 10.0, None) == {}  # no speech first audio: no window
