"""The benchmarks' event-loop meter (``benchmarks/loop_meter.py``) times asyncio's callbacks, and says so when the
loop it is installed on runs them elsewhere (uvloop's, in C: uvicorn's choice where uvloop is installed), instead of
reporting an idle loop."""

from __future__ import annotations

import asyncio
import sys
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
