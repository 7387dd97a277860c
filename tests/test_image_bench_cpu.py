"""benchmarks/image_bench.py --smoke in process: tiny InstructPix2Pix behind the synthetic text model, c = 1, 2."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

pytest.importorskip("diffusers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import image_bench


async def test_the_smoke_run_measures_every_milestone_in_order():
    args = image_bench.parse(["--smoke"])
    result = await image_bench.main(args)
    assert [lv["concurrency"] for lv in result["levels"]] == [1, 2]
    assert result["device"] == "cpu" and result["preview"] == "tiny-autoencoder" and result["steps"] == 3
    for lv in result["levels"]:
        # a model call per step (3 denoising, 1 decode; and as they start, 2 text encodings and 1 image encoding)
        # for all of them together, or for each alone at most
        assert lv["requests"] == lv["concurrency"] and 7 <= lv["model_calls"] <= 7 * lv["concurrency"]
        text, preview, final = (lv[k]["p50_ms"] for k in ("first_ar_delta", "first_preview", "final_image"))
        assert 0 < text <= preview <= final and lv["images_per_s"] > 0
        # where the level's time went: each batched call's time, counted per call ...
        device = lv["device_ms"]
        assert sum(v["calls"] for v in device.values()) == lv["model_calls"], device
        assert set(device) == {"text", "encode", "denoise", "decode"}, device
        assert all(v["total_ms"] > 0 and v["mean_ms"] > 0 for v in device.values())
        # ... and the worker thread's split: the requests' starts, the calls, the requests' work between calls
        worker = lv["worker_s"]["seconds"]
        assert {"join:image", "denoise:image", "requests:image", "decode:image"} <= set(worker), worker
        assert lv["worker_s"]["counts"]["requests:image"] == lv["model_calls"]  # one after every call
        assert sum(worker.values()) <= lv["wall_s"] + 0.01
        # the first round's timeline: the text model's steps, then the image's start (its encodings), then steps
        kinds = [piece.split(" x")[0] for piece in lv["first_round"]]
        assert kinds[0] == "step:lm" and kinds.index("join") < kinds.index("text") < kinds.index("denoise"), kinds
        assert 0 < lv["rewrite_done"]["p50_ms"] <= lv["first_preview"]["p50_ms"]
    assert "first AR delta" in image_bench.table(result) and "worker thread" in image_bench.table(result)


def test_sync_points_are_counted_by_their_callers():
    """``--sync-debug``'s counter (CUDA's warnings stood in for by hand here): each synchronizing call counted by
    where it was made, other warnings left alone."""

    def blocking_copy():
        warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)

    with warnings.catch_warnings(record=True) as others, image_bench.SyncPoints(cuda=False) as syncs:
        for _ in range(3):
            blocking_copy()
        warnings.warn("something else", UserWarning, stacklevel=1)
    (top,) = syncs.top()
    assert top["count"] == 3 and top["where"].startswith("test_image_bench_cpu.py:") and "blocking_copy" in top["where"]
    assert [str(w.message) for w in others] == ["something else"]


def test_sync_debug_needs_a_gpu():
    with pytest.raises(SystemExit):
        image_bench.parse(["--sync-debug"])
