"""The event loop under a mixed load on the no-argument server (``benchmarks/health_load.py --smoke``: speech over
SSE and WebSocket, chat, image edits, video and realtime at once, the real tiny families): what runs on the loop is
counted, not timed. While it serves, the loop imports no module, opens no file and runs no tensor work (a torch
call other than reading a tensor's attributes); each of those can hold the loop for milliseconds to seconds, and
with them out of it ``/health`` answers within PROTOCOLS' 100 ms (the benchmark reports that figure).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("diffusers", reason="needs the [image] and [video] extras (diffusers)")

BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"


def test_the_loop_runs_no_import_file_or_tensor_work_under_mixed_load(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setenv("GIT_COMMIT", "test")
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    for name in ("health_load", "loop_meter"):
        sys.modules.pop(name, None)
    import health_load

    assert health_load.main(["--smoke"]) == 0
    result = json.loads((tmp_path / "health_load_smoke.json").read_text())
    loop = result["loop"]
    assert result["health"]["n"] > 10 and not result["requests_failed"], result
    assert sum(result["requests_done"].values()) > 0 and loop["callbacks"] > 1000  # it was loaded
    assert loop["imports_on_loop"] == [], loop["imports_on_loop"]
    assert loop["files_opened_on_loop"] == [], loop["files_opened_on_loop"]
    tensor_work = [c for c in loop["torch_calls_on_loop"] if not c["what"].startswith("__get__")]
    assert tensor_work == [], tensor_work
