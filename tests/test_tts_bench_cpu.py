"""benchmarks/tts_bench.py end to end on CPU: the tiny checkpoint, in process and through the real server (HTTP, WS)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "tts_bench.py"
FRAMES = 6
LEVELS = (1, 2)
LEVEL_FIELDS = (
    "concurrency", "frames_per_request", "audio_s_per_request", "exact_length_rate", "ttfa_p50_ms", "ttfa_p95_ms",
    "ttfa_max_ms", "xrt_per_stream_p50", "xrt_per_stream_min", "aggregate_xrt", "wall_s", "underrun_p50_ms",
    "underrun_p99_ms", "continuity_ok_rate", "talker_steps",
)  # fmt: skip


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench")
    cmd = [sys.executable, str(BENCH), "--device", "cpu", "--tiny", "--size", "0.6b", "--levels", "1,2",
           "--frames", str(FRAMES), "--transport", "inproc,http,ws", "--server-timeout", "120"]  # fmt: skip
    env = {**os.environ, "OUT": str(out), "GIT_COMMIT": "test"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    table = subprocess.run([sys.executable, str(BENCH), "--summarize", "--tiny"], env=env, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert table.returncode == 0, table.stderr
    names = {"inproc": "tts_bench_tiny-0.6b.json", "http": "tts_bench_tiny-0.6b_http.json",
             "ws": "tts_bench_tiny-0.6b_ws.json"}  # fmt: skip
    found = {t: json.loads((out / name).read_text()) for t, name in names.items()}
    return found | {"_log": proc.stdout, "_table": table.stdout}


@pytest.mark.parametrize("transport", ["inproc", "http", "ws"])
def test_each_transport_reports_every_level_with_sane_figures(results, transport):
    res = results[transport]
    assert res["transport"] == transport and res["size"] == "tiny-0.6b" and res["device"] == "cpu"
    assert res["samples_per_frame"] == 1920 and res["git_commit"] == "test"
    assert [lv["concurrency"] for lv in res["levels"]] == list(LEVELS)
    for lv in res["levels"]:
        for field in LEVEL_FIELDS:
            assert lv[field] is not None, field
        # ignore_eos: every request returns exactly FRAMES frames of audio (80 ms each).
        assert lv["frames_per_request"] == FRAMES and lv["exact_length_rate"] == 1.0
        assert lv["audio_s_per_request"] == pytest.approx(FRAMES * 0.08)
        assert 0 < lv["ttfa_p50_ms"] <= lv["ttfa_p95_ms"] <= lv["ttfa_max_ms"] < 60_000
        assert 0 < lv["xrt_per_stream_min"] <= lv["xrt_per_stream_p50"]
        # Aggregate x real time: all audio over one wall clock, so at most the sum of the per-stream rates
        # (c * p50 is that sum for one or two streams).
        assert 0 < lv["aggregate_xrt"] <= lv["concurrency"] * lv["xrt_per_stream_p50"] * 1.001 + 1e-9
        assert lv["wall_s"] > 0
        assert 0 <= lv["underrun_p50_ms"] <= lv["underrun_p99_ms"]
        assert 0 <= lv["continuity_ok_rate"] <= 1
        assert lv["talker_steps"] >= FRAMES  # one talker step per frame at least


def test_the_server_transports_report_the_engine_step_time(results):
    for transport in ("http", "ws"):
        for lv in results[transport]["levels"]:
            assert lv["server_step_ms_mean"] > 0 and 1 <= lv["server_batch_size_mean"] <= lv["concurrency"]
            # the server's own view of the first chunk: queued part of it, both inside the client's TTFA
            assert 0 <= lv["server_queue_ms_mean"] < lv["server_ttfa_ms_mean"] < lv["ttfa_max_ms"]
        assert results[transport]["server_ready_s"] > 0
    assert "--load-format dummy --enable-benchmark-fields --device cpu" in results["_log"]


def test_http_levels_report_the_client_side_of_the_time_to_first_audio(results):
    for lv in results["http"]["levels"]:
        for q in (50, 95):
            # each request: connected <= request sent <= first audio; so are their percentiles
            phases = [lv[f"http_{p}_ms_p{q}"] for p in ("connected", "sent")]
            assert 0 < phases[0] <= phases[1] <= lv[f"ttfa_p{q}_ms"], phases
    assert "client p50 / p95: connected" in results["_log"]
    for transport in ("inproc", "ws"):
        assert not any(k.startswith("http_") for lv in results[transport]["levels"] for k in lv)


def test_summarize_prints_one_markdown_row_per_transport_and_level(results):
    rows = [line for line in results["_table"].splitlines() if line.startswith("| tiny-0.6b |")]
    assert [row.split(" | ")[1:3] for row in rows] == [[t, str(c)] for t in ("inproc", "http", "ws") for c in LEVELS]


@pytest.fixture(scope="module")
def base_results(tmp_path_factory) -> dict:
    """Every voice-cloning mode on the tiny Base checkpoint, in process and over HTTP (one server for all modes)."""
    out = tmp_path_factory.mktemp("bench-base")
    cmd = [sys.executable, str(BENCH), "--device", "cpu", "--tiny", "--size", "0.6b", "--levels", "2", "--frames", "4",
           "--transport", "inproc,http", "--voice-mode", "clone,clone-xvec,voice,voice-xvec", "--ref-seconds", "1.5",
           "--server-timeout", "120"]  # fmt: skip
    env = {**os.environ, "OUT": str(out), "GIT_COMMIT": "test"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return {
        (mode, t): json.loads((out / f"tts_bench_tiny-0.6b-{mode}{'' if t == 'inproc' else '_' + t}.json").read_text())
        for mode in MODES
        for t in ("inproc", "http")
    }


MODES = ("clone", "clone-xvec", "voice", "voice-xvec")


@pytest.mark.parametrize("mode", MODES)
def test_every_voice_cloning_mode_streams_exact_lengths_on_a_base_checkpoint(base_results, mode):
    for transport in ("inproc", "http"):
        res = base_results[(mode, transport)]
        assert res["voice_mode"] == mode and res["model"] == "tiny-0.6b-base" and res["size"] == f"tiny-0.6b-{mode}"
        (lv,) = res["levels"]
        assert lv["concurrency"] == 2 and lv["exact_length_rate"] == 1.0 and lv["ttfa_p50_ms"] > 0
    uploaded = mode.startswith("voice")
    # uploaded voices: the prompt is extracted once, before the levels (in process) or by the upload (server)
    assert (base_results[(mode, "inproc")]["voice_prompt_s"] > 0) is uploaded
    assert (base_results[(mode, "http")]["voice_upload_s"] > 0) is uploaded


def test_reference_audio_is_extracted_per_request_and_in_context_prompts_prefill_its_codes(base_results):
    """What the reference costs a batch, in process: each request that carries reference audio is extracted on the
    worker (an uploaded voice's never is), and an in-context prompt prefills the reference codes (~12.5 a second)."""
    level = {mode: base_results[(mode, "inproc")]["levels"][0] for mode in MODES}
    assert [level[m]["voice_extractions"] for m in MODES] == [2, 2, 0, 0]
    assert level["clone"]["voice_extraction_wall_ms_p50"] > 0
    positions = {m: level[m]["prefill_positions_per_newcomer_mean"] for m in MODES}
    assert positions["clone"] == positions["voice"] >= positions["clone-xvec"] + 18 == positions["voice-xvec"] + 18
    for m in MODES:
        assert level[m]["prefill_steps"] >= 1 and level[m]["prefill_step_wall_ms_p50"] > 0
