"""The codec's fused audio-rate stages: the Triton kernels against their torch versions, alone and in a streamed
decode, and the fused structure (biases moved into the next pass) against the module path.

Triton's interpreter runs the kernels on the CPU (fp32, in a subprocess: the interpreter is chosen at import);
the GPU test compares the bf16 kernels with the module path on the device.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from reference_codec import tiny_checkpoint_dir

from omni_stream.models.qwen3_tts import codec as codec_module
from omni_stream.models.qwen3_tts.codec import (
    TORCH_VOCODER,
    CausalConv1d,
    CausalConvTranspose1d,
    CodecDecoder,
    SnakeBeta,
    channels_last_setting,
    conv_phases,
    load_speech_tokenizer,
    snake_cat,
    snake_split,
    vocoder_kernels,
)
from omni_stream.models.qwen3_tts.codec_stream import CodecStreamState, decode_window, ramp_schedule
from omni_stream.runtime.layout import Phases, channels_last, join_phases, split_phases, to_channels_last, to_phases
from omni_stream.runtime.settings import Tuning

_CHECK = """
import itertools
import sys
from dataclasses import replace

import torch
from omni_stream.models.qwen3_tts.codec import TORCH_VOCODER, VocoderKernels, load_speech_tokenizer
from omni_stream.models.qwen3_tts.codec_stream import CodecStreamState, decode_window
from omni_stream.runtime import triton_vocoder as tv
from omni_stream.runtime.layout import Phases, channels_last, to_channels_last

torch.manual_seed(0)
ref = TORCH_VOCODER


def made(shape, last):
    # a random tensor, time-major (contiguous) or channel-major per time step
    t = torch.randn(shape)
    return to_channels_last(t) if last else t


for (b, c, n, h, with_history, with_bias), last in itertools.product(
    [(2, 3, 5, 4, True, False), (1, 4, 1500, 0, False, True), (3, 2, 7, 6, False, False), (2, 5, 9, 1, True, True),
     (2, 70, 40, 6, True, True)],
    (False, True),
):
    x = made((b, c, n + 3), last)[..., 1 : n + 1]  # a strided view, as a transposed conv's trimmed output is
    params = torch.stack([torch.rand(c) + 0.5, torch.rand(c) + 0.2])[..., None]
    history = torch.randn(b, c, h + 2)[..., 2:] if with_history else None  # the state pool's layout
    bias = torch.randn(c) if with_bias else None
    pad = 0 if with_history else h
    want, got = ref.snake_cat(x, params, history, pad, bias), tv.snake_cat(x, params, history, pad, bias)
    assert got.shape == want.shape == (b, c, h + n) and (channels_last(got) if last else got.is_contiguous())
    assert torch.allclose(got, want, atol=1e-6), (b, c, n, h, last, (got - want).abs().max())
    if not with_history:
        assert not got[..., :h].any()
    res, bias = made((b, c, n + 1), last)[..., 1:], torch.randn(c)
    got = tv.residual_add(x, bias, res)
    assert torch.allclose(got, ref.residual_add(x, bias, res), atol=1e-6) and channels_last(got) == last
    for k, dilation in ((7, 1), (3, 2), (1, 1)):
        xs = made((b, c, n + (k - 1) * dilation + 2), last)[..., 2:]
        w, bw = torch.randn(1, c, k), torch.randn(1)
        got, want = tv.conv_to_one(xs, w, bw, dilation), ref.conv_to_one(xs, w, bw, dilation)
        assert got.shape == want.shape == (b, 1, n) and torch.allclose(got, want, atol=1e-5), (k, dilation, last)

decoder = load_speech_tokenizer(sys.argv[1], with_encoder=False).decoder
# one stream (the kernels' batch offsets are checked above): the interpreter's time grows with the samples
codes = torch.randint(0, 2048, (1, 16, 6), generator=torch.Generator().manual_seed(3))
out = {}
triton = VocoderKernels("triton", tv.snake_cat, tv.residual_add, tv.conv_to_one, tv.snake_split)
# time-major, and the served defaults: channel-major with the phases written and read by the Snakes, so every
# kernel's channel-major twin (the phase structure's other forms are the torch versions' tests below, and the
# GPU's; each arm costs the interpreter ~30 s)
arms = {"triton": triton, "channels_last_phases": replace(triton, phases=frozenset({3, 9}), channels_last=True)}
twins = {}  # calls of each channel-major twin, by arm
for fn in ("_snake_cat_channels_last", "_residual_add_channels_last", "_conv_to_one_channels_last"):
    def counted(*args, _fn=getattr(tv, fn), _name=fn, **kwargs):
        # and whether the Snake wrote a convolution's input phases, or read its output's
        forms = {f"{_name} split" for _ in [1] if kwargs.get("dilation", 1) > 1}
        forms |= {f"{_name} read" for _ in [1] if isinstance(args[0], Phases)}
        twins[current] = twins.get(current, set()) | {_name} | forms
        return _fn(*args, **kwargs)
    setattr(tv, fn, counted)
for current, kernels in (("module", None), *arms.items()):
    decoder.use_kernels(kernels)
    state = CodecStreamState.zeros(decoder, 1)
    with torch.inference_mode():
        parts = [decode_window(decoder, codes[..., s : s + n], state) for s, n in ((0, 1), (1, 2), (3, 3))]
        out[current] = (torch.cat(parts, dim=-1), decoder(codes).squeeze(1).float(), state.tensors)
assert twins.keys() == {"channels_last_phases"} and len(twins["channels_last_phases"]) == 5, twins
(streamed, whole, state) = out["module"]
for name in arms:
    f_streamed, f_whole, f_state = out[name]
    assert (f_streamed - streamed).abs().max() < 1e-5 and (f_whole - whole).abs().max() < 1e-5, name
    assert state.keys() == f_state.keys()
    assert all(torch.allclose(state[k].float(), f_state[k].float(), atol=1e-5) for k in state), name
print("vocoder kernels ok")
"""


def test_the_triton_kernels_equal_the_torch_versions(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Alone (history, zero padding, bias, strided inputs, dilations, both layouts) and in a decoder streamed and
    whole, also with the dilated convolutions over their input's phases and with channel-major activations."""
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


@pytest.mark.parametrize("last", [False, True], ids=["time-major", "channel-major"])
@pytest.mark.parametrize(
    "k, dilation, n, groups", [(7, 9, 40, 1), (7, 3, 1, 1), (7, 9, 2000, 1), (3, 2, 13, 1), (7, 3, 25, 4), (1, 5, 8, 1)]
)
def test_a_convolution_over_its_phases_equals_the_dilated_convolution(
    k: int, dilation: int, n: int, groups: int, last: bool
) -> None:
    """Every output length against the input's phase count (a multiple of the dilation or not), a strided
    input (a concatenation's slice) in either layout, with and without bias, grouped; float64, so only the order
    of sums differs. The phases keep the input's layout, and the output the convolution's."""
    g = torch.Generator().manual_seed(k * 100 + dilation * 10 + n)
    x = torch.randn(3, 8, n + (k - 1) * dilation + 2, dtype=torch.float64, generator=g)
    x = (to_channels_last(x) if last else x)[..., 2:]
    weight = torch.randn(4, 8 // groups, k, dtype=torch.float64, generator=g)
    bias = torch.randn(4, dtype=torch.float64, generator=g)
    for b in (bias, None):
        want = F.conv1d(x, weight, b, dilation=dilation, groups=groups)
        got = conv_phases(x, weight, b, dilation, groups)
        assert got.shape == want.shape == (3, 4, n)
        assert torch.allclose(got, want, rtol=0, atol=1e-12), (got - want).abs().max()
    whole = x[..., : (x.shape[2] // dilation) * dilation]
    split = split_phases(whole, dilation)
    assert channels_last(split) == last and torch.equal(join_phases(split, dilation), whole)
    assert torch.equal(split[1], whole[0, :, 1::dilation]) if dilation > 1 else True
    assert channels_last(join_phases(to_channels_last(split), dilation))
    padded = to_phases(x, dilation)  # any length: zeros past it
    q = -(-x.shape[2] // dilation)
    assert padded.shape == (3 * dilation, 8, q) and channels_last(padded) == last
    assert torch.equal(Phases(padded, dilation, x.shape[2]).joined(), x)
    assert not join_phases(padded, dilation)[..., x.shape[2] :].any()


@pytest.mark.parametrize("in_place", [True, False], ids=["split-by-the-snake", "copied"])
def test_the_dilated_convolutions_stream_over_their_phases_as_the_module_path(
    decoder: CodecDecoder, monkeypatch, in_place: bool
):
    """Phases for dilations 3 and 9: the same audio and states as the module path, each of those convolutions
    (and only those) computed over its phases in every window: the Snake before it writing the phases and the one
    after reading them (``snake_split``), or the phases copied out and back (:func:`conv_phases`)."""
    calls: list[int] = []

    def counted(x, weight, bias, dilation, groups=1):
        calls.append(dilation)
        return conv_phases(x, weight, bias, dilation, groups)

    def counted_split(x, params, history, pad, keep, dilation):
        calls.append(dilation)
        return snake_split(x, params, history, pad, keep, dilation)

    monkeypatch.setattr(codec_module, "conv_phases", counted)
    codes = torch.randint(0, 2048, (2, 16, 60), generator=torch.Generator().manual_seed(6))
    audio, state = _streamed(decoder, codes, None)
    assert not calls
    phased = replace(TORCH_VOCODER, phases=frozenset({3, 9}), snake_split=counted_split if in_place else None)
    p_audio, p_state = _streamed(decoder, codes, phased)
    windows = len(ramp_schedule(60, 1, 25))
    blocks = len(decoder.cfg.upsample_rates)
    assert sorted(set(calls)) == [3, 9] and len(calls) == 2 * blocks * windows
    convs = [m for m in decoder.modules() if isinstance(m, CausalConv1d)]
    assert {m.conv.dilation[0] for m in convs if m.phases} == {3, 9}
    decoder.use_kernels(None)
    assert not any(m.phases for m in convs)
    assert (p_audio - audio).abs().max() < 1e-5
    assert all(torch.allclose(state[k].float(), p_state[k].float(), atol=1e-5) for k in state)
    # a whole decode (no state: zero left padding) too
    with torch.inference_mode():
        whole = decoder(codes)
        decoder.use_kernels(phased)
        assert (decoder(codes) - whole).abs().max() < 1e-5
    decoder.use_kernels(None)


def test_channel_major_weights_stream_as_the_module_path(decoder: CodecDecoder) -> None:
    """The vocoder's convolution weights channel-major (so are the activations they make; the output convolution
    to one channel stays as it is) with phases for 9: the same audio and states as the module path (fp32); the
    module path puts the weights back."""
    codes = torch.randint(0, 2048, (2, 16, 40), generator=torch.Generator().manual_seed(8))
    audio, state = _streamed(decoder, codes, None)
    vocoder = [m.conv for m in decoder.decoder.modules() if isinstance(m, (CausalConv1d, CausalConvTranspose1d))]
    assert vocoder and not any(channels_last(c.weight) for c in vocoder)
    l_audio, l_state = _streamed(decoder, codes, replace(TORCH_VOCODER, phases=frozenset({9}), channels_last=True))
    assert [channels_last(c.weight) for c in vocoder] == [c.out_channels > 1 for c in vocoder]
    decoder.use_kernels(None)
    assert all(c.weight.is_contiguous() and not channels_last(c.weight) for c in vocoder)
    assert (l_audio - audio).abs().max() < 1e-5
    assert all(torch.allclose(state[k].float(), l_state[k].float(), atol=1e-5) for k in state)


def test_the_phase_and_layout_settings_reach_the_vocoder_kernels() -> None:
    # by default channel-major exactly when no dilated convolution is left (cuDNN's NHWC ones are slow)
    assert channels_last_setting(Tuning()) and Tuning().codec_phases == {3, 9}  # measured the fastest (run 24)
    assert not channels_last_setting(Tuning(codec_phases=frozenset({9})))
    assert not channels_last_setting(Tuning(codec_phases=frozenset()))
    assert not channels_last_setting(Tuning(codec_channels_last=False))
    assert channels_last_setting(Tuning(codec_phases=frozenset(), codec_channels_last=True))
    pytest.importorskip("triton")
    kernels = vocoder_kernels("cuda", Tuning.from_env({"OMNI_STREAM_CODEC_PHASES": "9"}))
    assert kernels is not None and kernels.phases == {9} and not kernels.channels_last
    kernels = vocoder_kernels("cuda", Tuning.from_env({"OMNI_STREAM_CODEC_CHANNELS_LAST": "on"}))
    assert kernels is not None and kernels.phases == {3, 9} and kernels.channels_last


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


def test_the_loader_fuses_on_cuda_only(decoder: CodecDecoder) -> None:
    acts = [m for m in decoder.modules() if isinstance(m, SnakeBeta)]
    assert acts and all(m.kernels is None for m in acts)  # CPU: the module path, the reference's rounding
    assert vocoder_kernels("cpu") is None
    pytest.importorskip("triton")
    assert vocoder_kernels("cuda", Tuning(fused=False)) is None
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


@pytest.mark.gpu
def test_the_dilated_convolutions_over_their_phases_on_cuda(tmp_path_factory: pytest.TempPathFactory) -> None:
    """bf16 on the device: the phase path (cuDNN's kernels for a convolution without dilation) and channel-major
    activations (cuDNN's NHWC kernels, the kernels' channel-major twins), the served defaults among them, against
    the plain fused path, streamed."""
    gpu = load_speech_tokenizer(
        tiny_checkpoint_dir(tmp_path_factory), device="cuda", dtype=torch.bfloat16, with_encoder=False
    ).decoder
    served = vocoder_kernels("cuda")
    assert served is not None and served.phases == {3, 9} and served.channels_last  # the defaults
    fused = replace(served, phases=frozenset(), channels_last=False)
    codes = torch.randint(0, 2048, (3, 16, 96), device="cuda", generator=torch.Generator("cuda").manual_seed(7))
    arms = [served, replace(fused, phases=frozenset({3, 9})), replace(fused, channels_last=True)]
    arms.append(replace(fused, phases=frozenset({9}), channels_last=True))
    want = _streamed(gpu, codes, fused)[0]
    for kernels in arms:
        got = _streamed(gpu, codes, kernels)[0]
        assert (got - want).abs().max().item() < 0.05 * want.abs().max().item(), kernels
    gpu.use_kernels(served)
