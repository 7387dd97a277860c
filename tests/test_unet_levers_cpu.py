"""``benchmarks/unet_levers.py --smoke``: the image denoiser's levers measured on the tiny InstructPix2Pix on a CPU
(the GPU run measures the real sizes). Each lever must keep the UNet's output (NHWC and fused q/k/v reorder sums
only), every call is timed, and the VAE's encode and decode are timed in both layouts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("diffusers")
BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"


def test_unet_levers_smoke(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    monkeypatch.setenv("OUT", str(tmp_path))
    sys.modules.pop("unet_levers", None)
    import unet_levers

    result = unet_levers.main(["--smoke"])
    assert [row["lever"] for row in result["unet"]] == ["as loaded", "channels_last", "channels_last+fused_qkv"]
    for row in result["unet"]:
        for rows in ("rows1", "rows3"):
            cell = row[rows]
            assert cell["ms"] > 0 and cell["ms_per_row"] == pytest.approx(cell["ms"] / int(rows[4:]), abs=0.01)
            assert cell["max_abs_diff"] < 1e-3, row  # the same output as loaded (float32 on a CPU)
    assert result["gflop_per_row"] > 0
    assert set(result["vae"]["by_layout"]) == {"as loaded", "channels_last"}
    assert all(v["encode_ms"] > 0 and v["decode_ms"] > 0 for v in result["vae"]["by_layout"].values())
    assert json.loads((tmp_path / "unet_levers_tiny.json").read_text())["unet"] == result["unet"]


def test_unet_levers_picks_levers(tmp_path, monkeypatch):
    """``--levers`` measures the ones named after the reference; a name it does not know is refused, not skipped."""
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    monkeypatch.setenv("OUT", str(tmp_path))
    sys.modules.pop("unet_levers", None)
    import unet_levers

    result = unet_levers.main(["--smoke", "--levers", "fused_qkv,cudnn_benchmark,profile"])
    assert [row["lever"] for row in result["unet"]] == ["as loaded", "cudnn_benchmark", "channels_last+fused_qkv"]
    profile = result["profile"]  # the as-loaded call at the most rows, its time by kind of op
    assert profile["rows"] == 3 and profile["total_ms"] > 0
    assert profile["by_kind_ms"]["convolution"] > 0 and profile["by_kind_ms"]["normalization"] > 0
    assert sum(profile["by_kind_share"].values()) == pytest.approx(1.0, abs=0.01)
    assert profile["longest"] and all(k["ms"] > 0 for k in profile["longest"])
    assert unet_levers.kernel_kind("sm90_xmma_fprop_implicit_gemm_bf16") == "convolution"
    assert unet_levers.kernel_kind("pytorch_flash::flash_fwd_kernel") == "attention"
    moments = "void at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel"  # group norm's statistics
    assert unet_levers.kernel_kind(moments) == "normalization"
    with pytest.raises(SystemExit, match="unknown levers"):
        unet_levers.main(["--smoke", "--levers", "fused_qkv,tensorrt"])
