"""The codec's fused Snake activation: the Triton kernel against the torch version, alone and in a streamed decode.

Triton's interpreter runs the kernel on the CPU (fp32, in a subprocess: the interpreter is chosen at import);
the GPU test compares the bf16 kernel with the module path on the device.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from reference_codec import tiny_checkpoint_dir

from omni_stream.models.qwen3_tts.codec import SnakeBeta, load_speech_tokenizer, snake_cat, snake_kernel
from omni_stream.models.qwen3_tts.codec_stream import CodecStreamState, decode_window, ramp_schedule

_CHECK = """
import sys
import torch
from omni_stream.models.qwen3_tts.codec import load_speech_tokenizer, snake_cat
from omni_stream.models.qwen3_tts.codec_stream import CodecStreamState, decode_window
from omni_stream.runtime.triton_snake import snake_cat as fused

torch.manual_seed(0)
for b, c, n, h, with_history in [(2, 3, 5, 4, True), (1, 4, 1500, 0, False), (3, 2, 7, 6, False), (2, 5, 9, 1, True)]:
    x = torch.randn(b, c, n + 3)[..., 1 : n + 1]  # a strided view, as a transposed conv's trimmed output is
    params = torch.stack([torch.rand(c) + 0.5, torch.rand(c) + 0.2])[..., None]
    history = torch.randn(b, c, h + 2)[..., 2:] if with_history else None
    pad = 0 if with_history else h
    want, got = snake_cat(x, params, history, pad), fused(x, params, history, pad)
    assert got.shape == want.shape == (b, c, h + n) and got.is_contiguous()
    assert torch.allclose(got, want, atol=1e-6), (b, c, n, h, (got - want).abs().max())
    if not with_history:
        assert not got[..., :h].any()

decoder = load_speech_tokenizer(sys.argv[1], with_encoder=False).decoder
codes = torch.randint(0, 2048, (2, 16, 20), generator=torch.Generator().manual_seed(3))
out = {}
for name, kernel in (("module", None), ("fused", fused)):
    decoder.use_kernel(kernel)
    state = CodecStreamState.zeros(decoder, 2)
    with torch.inference_mode():
        parts = [decode_window(decoder, codes[..., s : s + n], state) for s, n in ((0, 1), (1, 4), (5, 15))]
        out[name] = (torch.cat(parts, dim=-1), decoder(codes).squeeze(1).float(), state.tensors)
(streamed, whole, state), (f_streamed, f_whole, f_state) = out["module"], out["fused"]
assert (f_streamed - streamed).abs().max() < 1e-5 and (f_whole - whole).abs().max() < 1e-5
assert state.keys() == f_state.keys()
assert all(torch.allclose(state[k].float(), f_state[k].float(), atol=1e-5) for k in state)
print("fused snake ok")
"""


def test_the_fused_kernel_equals_the_torch_version(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Alone (history, zero padding, strided inputs) and in a decoder streamed window by window and whole."""
    pytest.importorskip("triton")
    script = tmp_path / "check.py"
    script.write_text(_CHECK)
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    ckpt = tiny_checkpoint_dir(tmp_path_factory)
    done = subprocess.run(
        [sys.executable, str(script), str(ckpt)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "fused snake ok" in done.stdout


def test_the_torch_version_is_the_activation_then_the_context() -> None:
    act = SnakeBeta(3)
    with torch.no_grad():
        act.alpha.copy_(torch.tensor([0.1, -0.2, 0.3]))
        act.beta.copy_(torch.tensor([0.0, 0.5, -0.5]))
    x, history = torch.randn(2, 3, 4), torch.randn(2, 3, 2)
    alpha, beta = act.alpha[:, None], act.beta[:, None]
    want = x + 1 / (torch.exp(beta) + 1e-9) * torch.sin(torch.exp(alpha) * x) ** 2
    assert torch.allclose(act(x), want, atol=1e-6)
    assert torch.equal(act.cat(x, history), torch.cat([history, act(x)], dim=-1))
    assert torch.equal(act.cat(x, None, 3), torch.cat([torch.zeros(2, 3, 3), act(x)], dim=-1))
    assert torch.equal(snake_cat(x, act.params(), None), act(x))


def test_the_loader_fuses_on_cuda_only(tmp_path_factory: pytest.TempPathFactory, monkeypatch) -> None:
    decoder = load_speech_tokenizer(tiny_checkpoint_dir(tmp_path_factory), with_encoder=False).decoder
    acts = [m for m in decoder.modules() if isinstance(m, SnakeBeta)]
    assert acts and all(m.kernel is None for m in acts)  # CPU: the module path, the reference's rounding
    assert snake_kernel("cpu") is None
    pytest.importorskip("triton")
    monkeypatch.setenv("OMNI_STREAM_NO_FUSED", "1")
    assert snake_kernel("cuda") is None
    monkeypatch.delenv("OMNI_STREAM_NO_FUSED")
    assert snake_kernel("cuda") is not None


@pytest.mark.gpu
def test_the_fused_kernel_streams_as_the_module_path_on_cuda(tmp_path_factory: pytest.TempPathFactory) -> None:
    decoder = load_speech_tokenizer(
        tiny_checkpoint_dir(tmp_path_factory), device="cuda", dtype=torch.bfloat16, with_encoder=False
    ).decoder
    fused = snake_kernel("cuda")
    assert fused is not None and all(m.kernel is fused for m in decoder.modules() if isinstance(m, SnakeBeta))
    codes = torch.randint(0, 2048, (3, 16, 96), device="cuda", generator=torch.Generator("cuda").manual_seed(5))
    out = []
    for kernel in (fused, None):
        decoder.use_kernel(kernel)
        state, parts, start = CodecStreamState.zeros(decoder, 3), [], 0
        with torch.inference_mode():
            for n in ramp_schedule(96, 1, 25):
                parts.append(decode_window(decoder, codes[..., start : start + n], state))
                start += n
        out.append(torch.cat(parts, dim=-1))
    decoder.use_kernel(fused)
    # fp32 arithmetic rounded once against bf16 rounding after every operation: the same signal
    assert (out[0] - out[1]).abs().max().item() < 0.05 * out[1].abs().max().item()
