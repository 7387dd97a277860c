"""benchmarks/colocation_bench.py --smoke: one server with every kind's embedded tiny model, speech over HTTP and
WebSocket, a voice agent, an image edit and a video session, alone, together and apart, and the one-request
speech probes alone and beside an image edit and a video session: every figure is measured (no timing is
asserted: the benchmark prints them)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("diffusers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import colocation_bench


@pytest.mark.timeout(1200)
def test_the_smoke_run_measures_every_workload_in_every_scenario(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    result = colocation_bench.main(["--smoke", "--arm", "prio:realtime_priority=on"])
    assert result["mode"] == "smoke" and list(result["policies"]) == ["deadlines", "prio"]
    assert result["arms"] == {"prio": ["realtime_priority=on"]}
    # the A/B arm: its own server, the mixed scenarios measured again against the first run's workloads alone
    arm, first = result["policies"]["prio"], result["policies"]["deadlines"]
    assert arm["alone"] is first["alone"] and not arm["probe"]
    for mine, theirs in zip(arm["levels"], first["levels"], strict=True):
        assert mine["alone"] is theirs["alone"] and mine["together"] is not theirs["together"]
        speech = f"speech_{mine['transport']}"
        assert mine["together"][speech]["n"] == 2 and not mine["together"][speech]["errors"]
        assert mine["apart_vs_alone"][speech]["ttfa_p95_ratio"] > 0 and mine["together_worker"]["window_ms"] > 0
    body = first
    probe = body["probe"]
    for under in ("alone", "image", "video"):
        assert probe[under]["n"] >= 1 and not probe[under]["errors"] and probe[under]["ttfa_ms"]["p50"] > 0
    assert probe["ttfa_p50_ratio_image"] > 0 and probe["ttfa_p50_ratio_video"] > 0
    assert set(body["alone"]) == {"agent", "image", "video"}
    assert [(lv["transport"], lv["speech_c"]) for lv in body["levels"]] == [("http", 2), ("ws", 2)]
    for level in body["levels"]:
        speech = f"speech_{level['transport']}"
        figures = [body["alone"] | level["alone"], level["together"], level["apart"]]
        for figure in figures:
            assert set(figure) == {speech, "agent", "image", "video"}
            assert all(not f["errors"] and f["n"] >= 1 for f in figure.values()), figure
            assert figure[speech]["n"] == 2 and figure[speech]["ttfa_ms"]["p95"] > 0
            assert figure["agent"]["v2v_ms"]["p50"] is not None
            # ... split into the turn's stages as the client saw them, each from the end of the one before
            stages = figure["agent"]["split_ms_p50"]
            assert list(stages) == ["turn_decision", "transcript", "lm_first_clause", "tts_first_audio"], stages
            assert all(ms >= 0 for ms in stages.values()) and stages["turn_decision"] > 0, stages
            assert figure["image"]["final_s"]["p50"] > 0 and figure["video"]["xrt"]["p50"] > 0
        # what the server's device worker ran until the speech streams' last first audio, from its own log
        for kind in ("alone", "together", "apart"):
            window = level[f"{kind}_worker"]
            assert window["window_ms"] > 0 and window["complete"] and 0 < window["busy_fraction"] <= 1
            assert any(key.startswith("step:") for key in window["seconds"]), window  # the talker's steps
            assert window["longest"] and all(p["ms"] >= 0 and p["piece"] != "idle" for p in window["longest"])
            assert window["longest"][0]["ms"] == max(p["ms"] for p in window["longest"]) > 0
            # ... and what its event loop ran meanwhile: the scenario's requests and sockets, timed callback by callback
            loop = level[f"{kind}_loop"]
            assert loop["callbacks"] > 0 and loop["longest_wall"][0]["max_ms"] > 0, loop
            assert loop["measurable"] and loop["loop"].startswith("asyncio."), loop  # serve --loop asyncio
            assert "timeline" not in loop  # summarized into the window below, not kept raw
            # ... and, for the server's loop and this process's, what held each inside the window: the callbacks
            # over a millisecond (the tiny models' requests and sockets take some on a CPU), each inside it
            for which in ("loop", "client_loop"):
                held = level[f"{kind}_{which}_window"]
                assert held["window_ms"] == window["window_ms"] and held["callbacks"] >= len(held["longest"]), held
                assert held["held_ms"] >= sum(c["ms"] for c in held["longest"]) - 0.5, held
                assert all(0 <= c["at_ms"] <= held["window_ms"] and c["ms"] >= 1.0 for c in held["longest"]), held
            assert level[f"{kind}_client_loop"]["measurable"] and level[f"{kind}_client_loop"]["callbacks"] > 0
        for kind in ("together_vs_alone", "apart_vs_alone"):
            assert set(level[kind]) == {speech, "agent", "image", "video"}
            assert level[kind][speech]["ttfa_p95_ratio"] > 0
    assert (tmp_path / "colocation_bench_smoke.json").is_file()
    assert "probe TTFA p50" in colocation_bench.table(result)
