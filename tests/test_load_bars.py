"""A model's load bar: drawn on a terminal, off in a log file (every redraw would land there, and log lines would
run onto the bar's) and when the caller asked for no progress."""

from __future__ import annotations

import io
import sys

from omni_stream.family import LoadOptions


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_load_bar_is_drawn_on_a_terminal_only(monkeypatch):
    monkeypatch.setattr(sys, "stderr", Terminal())
    with LoadOptions(progress=True).progress_bar(total=3) as bar:
        assert not bar.disable
        bar.update(3)
    assert "0/3" in sys.stderr.getvalue()  # drawn when it opened
    with LoadOptions(progress=False).progress_bar(total=3) as bar:
        assert bar.disable
    log = io.StringIO()  # a log file: not a terminal
    monkeypatch.setattr(sys, "stderr", log)
    with LoadOptions(progress=True).progress_bar(total=3) as bar:
        assert bar.disable
        bar.update(3)
    assert log.getvalue() == ""
