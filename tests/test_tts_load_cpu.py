"""benchmarks/tts_load.py on CPU: open-loop arrivals on the tiny checkpoints, in process and through the real server
(HTTP, WS), CustomVoice and Base (reference audio with each request, uploaded voices), fixed and drawn lengths,
and arms that set a switch for their own engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
BENCH = BENCH_DIR / "tts_load.py"
RATES = (3.0, 6.0)
DURATION = 2.0


def run(out: Path, *args: str, timeout: int = 900) -> str:
    cmd = [sys.executable, str(BENCH), "--tiny", "--size", "0.6b", "--device", "cpu", "--server-timeout", "120",
           "--sample-ms", "200", *args]  # fmt: skip
    env = {**os.environ, "OUT": str(out), "GIT_COMMIT": "test"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


def load(out: Path, name: str) -> dict:
    return json.loads((out / f"tts_load_{name}.json").read_text())


@pytest.fixture(scope="module")
def schedule():
    sys.path.insert(0, str(BENCH_DIR))
    try:
        from tts_load import Lengths, schedule
    finally:
        sys.path.remove(str(BENCH_DIR))
    return lambda rate, duration, spec: schedule(rate, duration, Lengths.parse(spec), 0)


@pytest.fixture(scope="module")
def custom(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("load")
    log = run(out, "--transport", "inproc,http,ws", "--rates", ",".join(map(str, RATES)), "--duration",
              str(DURATION), "--lengths", "0.4-0.8,0.48")  # fmt: skip
    (out / "log.txt").write_text(log)
    return out


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("load-base")
    run(out, "--voice-mode", "clone,voice-xvec", "--transport", "inproc,ws", "--rates", "5", "--duration", "1.5",
        "--lengths", "0.4-0.8", "--ref-seconds", "1.5", "--ref-pool", "2")  # fmt: skip
    return out


@pytest.mark.parametrize("transport", ["inproc", "http", "ws"])
def test_every_rate_sends_its_poisson_arrivals_and_reports_the_figures(custom, schedule, transport):
    for spec in ("0.4-0.8", "0.48"):
        tag = "0.4-0.8s" if "-" in spec else "0.48s"
        res = load(custom, f"tiny-0.6b_{tag}_{transport}")
        assert res["transport"] == transport and res["benchmark"].startswith("open loop")
        assert res["lengths_s"] == ([0.4, 0.8] if "-" in spec else [0.48, 0.48]) and res["git_commit"] == "test"
        assert [lv["rate"] for lv in res["rates"]] == list(RATES)
        for lv in res["rates"]:
            plan = schedule(lv["rate"], DURATION, spec)
            assert lv["requests"] == lv["completed"] == len(plan) > 0 and lv["failed"] == 0
            # every request arrived at its scheduled time and got exactly its drawn length (EOS suppressed)
            detail = lv["requests_detail"]
            assert [[a, f] for a, f, *_ in detail] == [[round(at, 4), s.frames] for at, s in plan]
            assert lv["exact_length_rate"] == 1.0
            assert lv["offered_audio_s_per_s"] == pytest.approx(sum(s.frames for _, s in plan) * 0.08 / DURATION)
            assert 0 < lv["ttfa_p50_ms"] <= lv["ttfa_p95_ms"] <= lv["ttfa_p99_ms"] <= lv["ttfa_max_ms"] < 60_000
            assert 0 <= lv["underrun_share"] <= 1 and 0 <= lv["continuity_ok_rate"] <= 1
            assert lv["audio_s_per_s"] > 0 and lv["in_flight_mean"] > 0 and lv["send_lag_ms_p99"] < 1000
            # every request's audio came back, over at least the window it was offered in
            assert lv["audio_s_per_s"] <= lv["offered_audio_s_per_s"] * (1 + 1e-9)
            # the engine's live batch over time, beside the client's own count of requests in flight
            assert lv["timeline"] and all(p["running"] is not None and p["batch_mean"] >= 0 for p in lv["timeline"])
            assert max(p["batch_mean"] for p in lv["timeline"]) >= 1
            assert all(0 <= p["in_flight"] <= len(plan) for p in lv["timeline"])
            ts = [p["t"] for p in lv["timeline"]]
            assert ts == sorted(ts) and ts[-1] >= max(a for a, *_ in detail)
            if transport == "ws":
                assert lv["ttfa_arrival_p95_ms"] >= lv["ttfa_p50_ms"]
            if transport == "inproc":
                assert lv["prefill_steps"] >= 1 and lv["talker_steps"] >= max(s.frames for _, s in plan)
                work = lv["work"]  # the worker's time while the rate ran: the talker's steps among it
                assert work["complete"] and 0 < work["busy_fraction"] <= 1 and work["counts"]["step:talker"] > 0
                assert abs(sum(work["seconds"].values()) - work["span_s"]) < 0.01 * len(work["seconds"])
                # each first audio split at the talker call that admitted its request: every completed request
                # found its call, and the parts are consecutive (none negative, the call itself takes time)
                split = lv["first_audio_split"]
                assert split["requests"] == lv["completed"], split
                assert all(split[p]["p50"] >= 0 and split[p]["slowest_5pct_mean"] >= 0 for p in PARTS)
                assert split["admitting_call"]["p50"] > 0, split
            else:
                assert lv["server_step_ms_mean"] > 0 and lv["talker_steps"] > 0
                assert "work" not in lv  # a server's worker is not this process's
        frames = {f for lv in res["rates"] for _, f, *_ in lv["requests_detail"]}
        assert frames == {6} if "-" not in spec else (min(frames) >= 5 and max(frames) <= 10 and len(frames) > 1)


PARTS = ("to_admitting_call", "admitting_call", "after_it")


def test_first_audio_split_parts_add_up_and_the_slowest_are_named():
    sys.path.insert(0, str(BENCH_DIR))
    try:
        from tts_load import FIRST_AUDIO_PARTS, first_audio_split
    finally:
        sys.path.remove(str(BENCH_DIR))
    assert FIRST_AUDIO_PARTS == PARTS
    # 20 requests sent at 10.0 s: request i waits i ms for its admitting call, which takes 2 ms, then 5 ms more
    records = [{"request_id": f"r{i}", "start": 10.0, "ttfa": (i + 2 + 5) / 1000} for i in range(20)]
    admitted = {f"r{i}": (10.0 + i / 1000, 10.0 + (i + 2) / 1000) for i in range(20)}
    records.append({"request_id": "never-admitted", "start": 10.0, "ttfa": 0.5})  # no call found: left out
    records.append({"error": "failed"})
    split = first_audio_split(records, admitted)
    assert split["requests"] == 20
    assert split["admitting_call"]["p50"] == 2.0 and split["after_it"]["p95"] == 5.0
    assert split["to_admitting_call"]["p50"] == 9.5 and split["to_admitting_call"]["slowest_5pct_mean"] == 19.0
    assert first_audio_split([], admitted) == {"requests": 0}


def test_summarize_prints_a_row_per_run_and_rate(custom):
    env = {**os.environ, "OUT": str(custom)}
    table = subprocess.run([sys.executable, str(BENCH), "--summarize"], env=env, capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    assert table.returncode == 0, table.stderr
    rows = [line.split(" | ")[:2] for line in table.stdout.splitlines() if line.startswith("| tiny-0.6b")]
    runs = [f"tiny-0.6b_{lengths}_{t}" for lengths in ("0.48s", "0.4-0.8s") for t in ("http", "inproc", "ws")]
    assert sorted(rows) == sorted([f"| {name}", f"{rate:g}"] for name in runs for rate in RATES)
    pytest.importorskip("matplotlib")
    assert (custom / "tts_load.png").stat().st_size > 10_000


def test_base_requests_with_reference_audio_extract_it_each_time_and_prefill_its_codes(base):
    """In context (``clone``) every request's reference is extracted on the worker and its codes prefilled; an
    uploaded voice named by x-vector (``voice-xvec``) extracts once before the run and prefills a short prompt."""
    clone = load(base, "tiny-0.6b-clone_0.4-0.8s_inproc")
    xvec = load(base, "tiny-0.6b-voice-xvec_0.4-0.8s_inproc")
    assert clone["voice_mode"] == "clone" and clone["ref_codes_frames"] == 19 and clone["ref_pool"] == 2
    (c,), (x,) = clone["rates"], xvec["rates"]
    assert c["completed"] == c["requests"] > 0 and x["completed"] == x["requests"] > 0
    assert c["voice_extractions"] == c["requests"] and x["voice_extractions"] == 0
    assert xvec["voice_prompt_s"] > 0 and clone["voice_prompt_s"] == 0  # the upload's extraction, before the clock
    assert c["prefill_positions_per_newcomer_mean"] > x["prefill_positions_per_newcomer_mean"] + 15
    for mode in ("clone", "voice-xvec"):
        ws = load(base, f"tiny-0.6b-{mode}_0.4-0.8s_ws")
        (lv,) = ws["rates"]
        assert lv["completed"] == lv["requests"] > 0 and lv["exact_length_rate"] == 1.0
        assert ws["voice_upload_s"] > 0 if mode == "voice-xvec" else ws["voice_upload_s"] == 0


def test_arms_load_their_own_engine_with_their_switches(tmp_path):
    run(tmp_path, "--transport", "inproc", "--rates", "4", "--duration", "1", "--lengths", "0.32",
        "--arm", "sync:OMNI_STREAM_STEP_AHEAD=off", "--arm", "ahead:OMNI_STREAM_STEP_AHEAD=on")  # fmt: skip
    for arm, ahead in (("sync", False), ("ahead", True)):
        res = load(tmp_path, f"tiny-0.6b_0.32s_{arm}_inproc")
        assert res["arm"] == arm and res["arm_env"] == {"OMNI_STREAM_STEP_AHEAD": "on" if ahead else "off"}
        assert res["step_ahead"] is ahead
        (lv,) = res["rates"]
        assert lv["completed"] == lv["requests"] > 0


def test_bad_arguments_are_refused_naming_the_option():
    for args, word in ((["--voice-mode", "custom,clone"], "--voice-mode"), (["--arm", "x:PATH=1"], "--arm"),
                       (["--lengths", "5-2"], "lengths"), (["--rates", "0"], "--rates"),
                       (["--retune", "x:bogus=1", "--transport", "inproc"], "bogus"),
                       (["--retune", "x:step_ahead=on"], "--retune"),
                       (["--arm", "x:--http=h11", "--transport", "inproc"], "--arm")):  # fmt: skip
        proc = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and word in proc.stderr, (args, proc.stderr)


def test_retune_arms_take_turns_on_one_engine_and_each_runs_the_bursts_too(tmp_path):
    log = run(tmp_path, "--transport", "inproc", "--rates", "4", "--duration", "1", "--lengths", "0.32",
              "--retune", "plain:admit_after_collect=off,first_window_wait_ms=0",
              "--retune", "levers:step_ahead=on,admit_after_collect=on,first_window_wait_ms=20",
              "--bursts", "1,2", "--burst-frames", "4")  # fmt: skip
    assert log.count("loaded in") == 1  # one engine for both arms
    for arm, ahead in (("plain", False), ("levers", True)):
        res = load(tmp_path, f"tiny-0.6b_0.32s_{arm}_inproc")
        assert res["retune"] == arm and "admit_after_collect=" in res["tuning"]
        (lv,) = res["rates"]
        assert lv["completed"] == lv["requests"] > 0
        assert lv["talker"] == {
            "step_ahead": ahead,
            "admit_after_collect": ahead,
            "first_window_wait_ms": 20.0 if ahead else 0.0,
            "prefill_budget": 0,
            "voice_cache": 0,
        }
        bursts = json.loads((tmp_path / f"tts_bench_tiny-0.6b_{arm}.json").read_text())
        assert [b["concurrency"] for b in bursts["levels"]] == [1, 2]
        assert all(b["exact_length_rate"] == 1.0 for b in bursts["levels"])


def test_a_server_arm_starts_its_server_with_its_flags(tmp_path):
    log = run(tmp_path, "--transport", "http", "--rates", "4", "--duration", "1", "--lengths", "0.32",
              "--arm", "h11:--http=h11,OMNI_STREAM_BURST_HOLD_MS=0")  # fmt: skip
    assert "OMNI_STREAM_BURST_HOLD_MS=0 " in log and " --http h11" in log  # the server's command line
    res = load(tmp_path, "tiny-0.6b_0.32s_h11_http")
    assert res["arm_env"] == {"--http": "h11", "OMNI_STREAM_BURST_HOLD_MS": "0"}
    (lv,) = res["rates"]
    assert lv["completed"] == lv["requests"] > 0
