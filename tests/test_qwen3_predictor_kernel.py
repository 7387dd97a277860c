"""The code predictor's one-row frame as one persistent kernel gives the loop's codes (Triton's interpreter on
the CPU, fp32; the GPU suite runs it over a full grid at real sizes)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_CHECK = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import torch

    from omni_stream.runtime import decoder_kernels as fused
    from omni_stream.models.qwen3_tts.checkpoint import load_lm, write_tiny_checkpoint
    from omni_stream.models.qwen3_tts.predictor_kernel import PredictorKernel
    from omni_stream.requests import SamplingParams
    from omni_stream.runtime.sampling import SamplingTensors

    torch.set_num_threads(1)
    for size in ("1.7b", "0.6b"):  # with the predictor's input projection, and without (equal widths)
        path = write_tiny_checkpoint(Path(sys.argv[1]) / size, "custom_voice", size, speech_tokenizer=False)
        lm = load_lm(path, dtype=torch.float32)
        cp = lm.talker.code_predictor
        cp.use_kernels(fused.TORCH)
        frame = PredictorKernel(cp)
        assert frame.programs == 1 and (frame.proj is not None) == (size == "1.7b")
        width = cp.model.codec_embedding[0].weight.shape[1]
        gen = torch.Generator().manual_seed(0)
        for sampled in (False, True):
            hidden, c0 = torch.randn(1, width, generator=gen), torch.randn(1, width, generator=gen)
            params = SamplingTensors.from_params([SamplingParams(do_sample=sampled, temperature=0.9, top_k=50)])
            noise = torch.empty(1, 15, 2048).exponential_(generator=gen) if sampled else None
            with torch.no_grad():
                want = cp.generate(hidden, c0, params, noise)  # the fused loop's torch functions
                got = frame(hidden, c0, params, noise)
                assert got.shape == (1, 15) and got.dtype == torch.int64
                assert torch.equal(got, want), (size, sampled, got.tolist(), want.tolist())
                cp.use_kernels(None)
                assert torch.equal(cp.generate(hidden, c0, params, noise), want)  # and the modules'
                cp.use_kernels(fused.TORCH)
            print(size, "sampled" if sampled else "greedy", got.tolist())
        try:
            frame(torch.zeros(2, width), torch.zeros(2, width), params, None)
        except ValueError as e:
            assert "one row" in str(e)
        else:
            raise AssertionError("two rows accepted")
    print("frame kernel ok")
    """
)


def test_frame_kernel_gives_the_loops_codes(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    script = tmp_path / "check.py"
    script.write_text(_CHECK)
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "frame kernel ok" in done.stdout
