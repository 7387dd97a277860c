"""benchmarks/peers/run_peers.py on CPU: the reference qwen-tts on the tiny checkpoint; faster-qwen3-tts is skipped."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

PEERS = Path(__file__).resolve().parents[1] / "benchmarks" / "peers"
FRAMES = 4
OURS = {"ttfa_p50_ms": 50.0, "xrt_per_stream_p50": 4.0}

pytestmark = pytest.mark.reference


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    if importlib.util.find_spec("qwen_tts") is None:
        pytest.skip("the reference qwen-tts-hf package is not installed")
    from omni_stream.models.qwen3_tts.checkpoint import write_tiny_checkpoint

    ckpt = write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny")
    out = tmp_path_factory.mktemp("out")
    # Our figures for the same tag, as tts_bench.py writes them, so the ratios are computed.
    level = {"concurrency": 1, **OURS}
    ours = {"transport": "inproc", "git_commit": "ours", "levels": [level]}
    (out / "tts_bench_tiny.json").write_text(json.dumps(ours))
    cmd = [sys.executable, str(PEERS / "run_peers.py"), "--checkpoint", str(ckpt), "--tag", "tiny", "--device", "cpu",
           "--frames", str(FRAMES), "--reps", "1"]  # fmt: skip
    env = {**os.environ, "OUT": str(out), "GIT_COMMIT": "test", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads((out / "peers_tiny.json").read_text()) | {"_log": proc.stdout}


def test_reference_row_has_every_figure_at_the_fixed_length(result):
    assert result["git_commit"] == "test" and result["device"] == "cpu" and result["frames"] == FRAMES
    assert result["voice"] == "ryan" and result["language"] == "English" and result["eos_suppressed"]
    assert result["versions"]["qwen-tts-hf"] and result["versions"]["torch"]
    [row] = result["rows"]
    assert row["system"] == "qwen-tts (reference)" and row["mode"] == "non-streaming" and row["reps"] == 1
    # EOS suppressed: the request returns exactly FRAMES frames (80 ms each), whatever the random weights sample.
    assert row["frames_ok"] and [r["frames"] for r in row["runs"]] == [FRAMES]
    assert row["runs"][0]["audio_s"] == pytest.approx(FRAMES * 0.08)
    # Not streaming: the first audio is the whole utterance.
    assert row["ttfa_ms_median"] == pytest.approx(1000 * row["total_s_median"])
    assert row["xrt_median"] == pytest.approx(FRAMES * 0.08 / row["total_s_median"])
    assert result["info"]["reference"]["load_s"] > 0


def test_faster_is_skipped_on_cpu_with_a_reason(result):
    assert "needs CUDA" in result["skipped"]["faster-qwen3-tts"]
    assert all(row["system"] != "faster-qwen3-tts" for row in result["rows"])
    assert "faster-qwen3-tts: skipped" in result["_log"]


def test_ratios_against_our_figures_of_the_same_tag(result):
    assert result["ours"]["ttfa_ms"] == OURS["ttfa_p50_ms"] and result["ours"]["xrt"] == OURS["xrt_per_stream_p50"]
    [row] = result["rows"]
    assert row["ours_ttfa_ratio"] == pytest.approx(row["ttfa_ms_median"] / OURS["ttfa_p50_ms"])
    assert row["ours_xrt_ratio"] == pytest.approx(OURS["xrt_per_stream_p50"] / row["xrt_median"])
    assert "ours (c = 1, inproc)" in result["_log"]


def test_rope_fallback_reads_rope_parameters_when_rope_theta_is_absent():
    sys.path.insert(0, str(PEERS))
    try:
        import compat
    finally:
        sys.path.remove(str(PEERS))
    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    def default_rope(config, device=None, *args, **kwargs):
        return 1.0 / config.rope_theta ** (torch.arange(0, 4, 2, dtype=torch.float) / 4), 1.0

    saved = ROPE_INIT_FUNCTIONS.get("default")
    ROPE_INIT_FUNCTIONS["default"] = default_rope
    try:
        assert compat.patch_rope_registry() and not compat.patch_rope_registry()  # installs once
        config = SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 100.0})
        inv_freq, _ = ROPE_INIT_FUNCTIONS["default"](config)
        assert torch.allclose(inv_freq, torch.tensor([1.0, 0.1]))
        with_theta = SimpleNamespace(rope_theta=10000.0, rope_parameters={"rope_theta": 100.0})
        assert torch.allclose(ROPE_INIT_FUNCTIONS["default"](with_theta)[0], torch.tensor([1.0, 0.01]))
    finally:
        if saved is None:
            ROPE_INIT_FUNCTIONS.pop("default", None)
        else:
            ROPE_INIT_FUNCTIONS["default"] = saved
