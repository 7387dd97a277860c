"""The codec's fused audio-rate stages: the Triton kernels against their torch versions, alone and in a streamed
decode, and the fused structure (biases moved into the next pass) against the module path.

Triton's interpreter runs the kernels on the CPU (fp32, in a subprocess: the interpreter is chosen at import);
the GPU test compares the bf16 kernels with the module path on the device.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from reference_codec import tiny_checkpoint_dir

from omni_stream.models.qwen3_tts.codec import (
    TORCH_VOCODER,
    CodecDecoder,
    SnakeBeta,
    load_speech_tokenizer,
    snake_cat,
    vocoder_kernels,
)
from omni_stream.models.qwen3_tts.codec_stream import CodecStreamState, decode_window, ramp_schedule

_CHECK = """
import sys
import torch
from omni_stream.models.qwen3_tts.codec import TORCH_VOCODER, VocoderKernels, load_speech_tokenizer
from omni_stream.models.qwen3_tts.codec_stream import CodecStreamState, decode_window
from omni_stream.runtime import triton_vocoder as tv

torch.manual_seed(0)
ref = TORCH_VOCODER
for b, c, n, h, with_history, with_bias in [
    (2, 3, 5, 4, True, False), (1, 4, 1500, 0, False, True), (3, 2, 7, 6, False, False), (2, 5, 9, 1, True, True)
]:
    x = torch.randn(b, c, n + 3)[..., 1 : n + 1]  # a strided view, as a transposed conv's trimmed output is
    params = torch.stack([torch.rand(c) + 0.5, torch.rand(c) + 0.2])[..., None]
    history = torch.randn(b, c, h + 2)[..., 2:] if with_history else None
    bias = torch.randn(c) if with_bias else None
    pad = 0 if with_history else h
    want, got = ref.snake_cat(x, params, history, pad, bias), tv.snake_cat(x, params, history, pad, bias)
    assert got.shape == want.shape == (b, c, h + n) and got.is_contiguous()
    assert torch.allclose(got, want, atol=1e-6), (b, c, n, h, (got - want).abs().max())
    if not with_history:
        assert not got[..., :h].any()
    res, bias = torch.randn(b, c, n + 1)[..., 1:], torch.randn(c)
    assert torch.allclose(tv.residual_add(x, bias, res), ref.residual_add(x, bias, res), atol=1e-6)
    for k, dilation in ((7, 1), (3, 2), (1, 1)):
        xs = torch.randn(b, c, n + (k - 1) * dilation + 2)[..., 2:]
        w, bw = torch.randn(1, c, k), torch.randn(1)
        got, want = tv.conv_to_one(xs, w, bw, dilation), ref.conv_to_one(xs, w, bw, dilation)
        assert got.shape == want.shape == (b, 1, n) and torch.allclose(got, want, atol=1e-5), (k, dilation)

decoder = load_speech_tokenizer(sys.argv[1], with_encoder=False).decoder
codes = torch.randint(0, 2048, (2, 16, 20), generator=torch.Generator().manual_seed(3))
out = {}
triton = VocoderKernels("triton", tv.snake_cat, tv.residual_add, tv.conv_to_one)
for name, kernels in (("module", None), ("triton", triton)):
    decoder.use_kernels(kernels)
    state = CodecStreamState.zeros(decoder, 2)
    with torch.inference_mode():
        parts = [decode_window(decoder, codes[..., s : s + n], state) for s, n in ((0, 1), (1, 4), (5, 15))]
        out[name] = (torch.cat(parts, dim=-1), decoder(codes).squeeze(1).float(), state.tensors)
(streamed, whole, state), (f_streamed, f_whole, f_state) = out["module"], out["triton"]
assert (f_streamed - streamed).abs().max() < 1e-5 and (f_whole - whole).abs().max() < 1e-5
assert state.keys() == f_state.keys()
assert all(torch.allclose(state[k].float(), f_state[k].float(), atol=1e-5) for k in state)
print("vocoder kernels ok")
"""


def test_the_triton_kernels_equal_the_torch_versions(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Alone (history, zero padding, bias, strided inputs, dilations) and in a decoder streamed and whole."""
    pytest.importorskip("triton")
    script = tmp_path / "check.py"
    script.write_text(_CHECK)
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    ckpt = tiny_checkpoint_dir(tmp_path_factory)
    done = subprocess.run(
        [sys.executable, str(script), str(ckpt)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "vocoder kernels ok" in done.stdout


def _streamed(decoder: CodecDecoder, codes: torch.Tensor, kernels) -> tuple[torch.Tensor, dict]:
    """``codes [B, 16, T]`` decoded window by window (the 1-frame ramp to 25) with ``kernels``: audio, state."""
    decoder.use_kernels(kernels)
    state, parts, start = CodecStreamState.zeros(decoder, codes.shape[0]), [], 0
    with torch.inference_mode():
        for n in ramp_schedule(codes.shape[-1], 1, 25):
            parts.append(decode_window(decoder, codes[..., start : start + n], state))
            start += n
    return torch.cat(parts, dim=-1), state.tensors


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> CodecDecoder:
    return load_speech_tokenizer(tiny_checkpoint_dir(tmp_path_factory), with_encoder=False).decoder


def test_the_fused_structure_streams_as_the_module_path(decoder: CodecDecoder) -> None:
    """Biases moved into the next pass, the output convolution apart: the same audio and states (fp32)."""
    codes = torch.randint(0, 2048, (2, 16, 60), generator=torch.Generator().manual_seed(4))
    (audio, state), (f_audio, f_state) = (_streamed(decoder, codes, k) for k in (None, TORCH_VOCODER))
    decoder.use_kernels(None)
    assert (f_audio - audio).abs().max() < 1e-5
    assert all(torch.allclose(state[k].float(), f_state[k].float(), atol=1e-5) for k in state)


def test_the_torch_versions_are_the_operations_they_replace() -> None:
    act = SnakeBeta(3)
    with torch.no_grad():
        act.alpha.copy_(torch.tensor([0.1, -0.2, 0.3]))
        act.beta.copy_(torch.tensor([0.0, 0.5, -0.5]))
    x, history, bias = torch.randn(2, 3, 4), torch.randn(2, 3, 2), torch.randn(3)
    alpha, beta = act.alpha[:, None], act.beta[:, None]
    want = x + 1 / (torch.exp(beta) + 1e-9) * torch.sin(torch.exp(alpha) * x) ** 2
    assert torch.allclose(act(x), want, atol=1e-6)
    assert torch.equal(act.cat(x, history), torch.cat([history, act(x)], dim=-1))
    assert torch.equal(act.cat(x, None, 3), torch.cat([torch.zeros(2, 3, 3), act(x)], dim=-1))
    assert torch.equal(act.cat(x, None, 0, bias), act(x + bias[:, None]))
    assert torch.equal(snake_cat(x, act.params(), None), act(x))
    w, b = torch.randn(1, 3, 7), torch.randn(1)
    xs = torch.randn(2, 3, 10)
    assert torch.equal(TORCH_VOCODER.conv_to_one(xs, w, b, 1), F.conv1d(xs, w, b))
    assert torch.equal(TORCH_VOCODER.residual_add(x, bias, history[..., :1]), x + bias[:, None] + history[..., :1])


def test_the_loader_fuses_on_cuda_only(decoder: CodecDecoder, monkeypatch) -> None:
    acts = [m for m in decoder.modules() if isinstance(m, SnakeBeta)]
    assert acts and all(m.kernels is None for m in acts)  # CPU: the module path, the reference's rounding
    assert vocoder_kernels("cpu") is None
    pytest.importorskip("triton")
    monkeypatch.setenv("OMNI_STREAM_NO_FUSED", "1")
    assert vocoder_kernels("cuda") is None
    monkeypatch.delenv("OMNI_STREAM_NO_FUSED")
    kernels = vocoder_kernels("cuda")
    assert kernels is not None and kernels.name == "triton"


@pytest.mark.gpu
def test_the_triton_kernels_stream_as_the_module_path_on_cuda(tmp_path_factory: pytest.TempPathFactory) -> None:
    gpu = load_speech_tokenizer(
        tiny_checkpoint_dir(tmp_path_factory), device="cuda", dtype=torch.bfloat16, with_encoder=False
    ).decoder
    acts = [m.kernels for m in gpu.modules() if isinstance(m, SnakeBeta)]
    assert acts and all(k is not None and k.name == "triton" for k in acts)
    fused = acts[0]
    codes = torch.randint(0, 2048, (3, 16, 96), device="cuda", generator=torch.Generator("cuda").manual_seed(5))
    out = [_streamed(gpu, codes, kernels)[0] for kernels in (fused, None)]
    gpu.use_kernels(fused)
    # fp32 arithmetic rounded once against bf16 rounding after every operation: the same signal
    assert (out[0] - out[1]).abs().max().item() < 0.05 * out[1].abs().max().item()
