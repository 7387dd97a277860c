"""Streaming codec decode: exact equality with the full decode, batched == solo, windowed fallback bounds."""

from __future__ import annotations

import pytest
import torch
from reference_codec import tiny_checkpoint_dir

from omni_stream.models.qwen3_tts.codec import CodecDecoder, load_speech_tokenizer
from omni_stream.models.qwen3_tts.codec_stream import (
    CodecStatePool,
    CodecStreamState,
    decode_window,
    decode_windows,
    frames_to_samples,
    prime,
    ramp_schedule,
    ramp_window,
    receptive_field_frames,
    windowed_decode,
)

FRAMES = 170  # > 2 x the 72-frame attention window, and above the tiny decoder's receptive field (154)
TOL = 1e-4


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> CodecDecoder:
    return load_speech_tokenizer(tiny_checkpoint_dir(tmp_path_factory), with_encoder=False).decoder


@pytest.fixture(scope="module")
def codes() -> torch.Tensor:
    return torch.randint(0, 2048, (3, 16, FRAMES), generator=torch.Generator().manual_seed(7))


@pytest.fixture(scope="module")
def full(decoder: CodecDecoder, codes: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return decoder(codes).squeeze(1).float()


def _stream(decoder: CodecDecoder, codes: torch.Tensor, schedule: list[int]) -> torch.Tensor:
    state = CodecStreamState.zeros(decoder, codes.shape[0])
    parts, start = [], 0
    for n in schedule:
        parts.append(decode_window(decoder, codes[..., start : start + n], state))
        start += n
    assert start == codes.shape[-1]
    assert state.tensors["position"].tolist() == [start] * codes.shape[0]
    return torch.cat(parts, dim=-1)


@pytest.mark.parametrize(
    "schedule",
    [
        ramp_schedule(FRAMES, 2, 25),  # 2, 4, 8, 16, 25, 25, ...
        [1] * 6 + [FRAMES - 6],  # single frames, then one window far wider than the attention window
        [FRAMES // 2, FRAMES - FRAMES // 2],
        [7] * (FRAMES // 7) + [FRAMES % 7],
    ],
    ids=["ramp", "ones-then-wide", "halves", "sevens"],
)
def test_streamed_decode_equals_full_decode(decoder, codes, full, schedule: list[int]) -> None:
    schedule = [n for n in schedule if n]
    streamed = _stream(decoder, codes, schedule)
    assert streamed.shape == full.shape
    err = (streamed - full).abs().max().item()
    assert err < TOL, err


def test_long_decode_in_chunks_is_exact(decoder, codes, full) -> None:
    with torch.inference_mode():
        chunked = decoder.decode_long(codes, chunk_frames=40).squeeze(1)
    assert (chunked - full).abs().max().item() < TOL


def test_primed_stream_continues_the_context_exactly(decoder, codes, full) -> None:
    # ICL: reference codes go in as context; the generated frames then decode as the tail of the joint decode
    state = CodecStreamState.zeros(decoder, 3)
    prime(decoder, codes[..., :50], state)
    tail = torch.cat([decode_window(decoder, codes[..., s : s + 20], state) for s in range(50, 110, 20)], dim=-1)
    assert (tail - full[..., 50 * 1920 : 110 * 1920]).abs().max().item() < TOL


def test_stream_without_state_would_differ(decoder, codes, full) -> None:
    # guards the test above: restarting each window from zero state is visibly wrong
    restarted = torch.cat(
        [
            decode_window(decoder, codes[..., s : s + 10], CodecStreamState.zeros(decoder, 3))
            for s in range(0, FRAMES, 10)
        ],
        dim=-1,
    )
    assert (restarted - full).abs().max().item() > 1e-2


def test_batched_windows_equal_solo_streams(decoder, codes) -> None:
    # streams at different positions (one starts late) share batched calls with equal window lengths
    solo_states = [CodecStreamState.zeros(decoder) for _ in range(3)]
    batch_states = [CodecStreamState.zeros(decoder) for _ in range(3)]
    for row in range(2):  # rows 0, 1 get a head start of 4 frames, decoded alone
        decode_window(decoder, codes[row : row + 1, :, :4], solo_states[row])
        decode_window(decoder, codes[row : row + 1, :, :4], batch_states[row])
    offsets = [4, 4, 0]
    for step, n in enumerate([3, 9, 80]):
        solo = []
        for row in range(3):
            start = offsets[row]
            solo.append(decode_window(decoder, codes[row : row + 1, :, start : start + n], solo_states[row]))
        windows = [codes[row : row + 1, :, offsets[row] : offsets[row] + n] for row in range(3)]
        batched = decode_windows(decoder, windows, batch_states)
        for row in range(3):
            assert (batched[row] - solo[row]).abs().max().item() < 1e-5, (step, row)
            offsets[row] += n
    assert [s.tensors["position"].item() for s in batch_states] == [96, 96, 92]


def test_batched_windows_need_equal_lengths(decoder, codes) -> None:
    states = [CodecStreamState.zeros(decoder) for _ in range(2)]
    with pytest.raises(ValueError, match="equal frame counts"):
        decode_windows(decoder, [codes[:1, :, :2], codes[1:2, :, :3]], states)


def test_state_pool_streams_equal_full_decode(decoder, codes, full) -> None:
    pool = CodecStatePool(decoder, capacity=5)
    slots = torch.tensor([4, 0, 2])
    pool.reset(slots)
    parts, start = [], 0
    for n in ramp_schedule(FRAMES, 2, 25):
        parts.append(pool.decode(codes[..., start : start + n], slots))
        start += n
    err = (torch.cat(parts, dim=-1) - full).abs().max().item()
    assert err < TOL, err
    # reusing a slot after reset starts a fresh stream
    pool.reset(slots[:1])
    again = pool.decode(codes[:1, :, :5], slots[:1])
    assert (again - full[:1, : 5 * 1920]).abs().max().item() < TOL


def test_windowed_redecode_is_exact_when_context_covers_receptive_field(decoder, codes, full) -> None:
    rf = receptive_field_frames(decoder.cfg)
    assert rf == 154  # 2 (pre_conv) + 2 layers x 71 (attention) + 10 (convs after the transformer)
    start, end = FRAMES - 12, FRAMES
    exact = full[..., start * 1920 : end * 1920]
    err = (windowed_decode(decoder, codes, start, end, rf) - exact).abs().max().item()
    assert err < TOL, err


def test_windowed_redecode_with_short_context_is_approximate(decoder, codes, full) -> None:
    # Measured on this tiny random decoder: 25 frames of context (the vllm-omni / faster-qwen3-tts default)
    # leaves ~7e-3 max abs error (about 7 % of the signal RMS); no context at all leaves ~0.45.
    start, end = FRAMES - 12, FRAMES
    exact = full[..., start * 1920 : end * 1920]
    rms = exact.pow(2).mean().sqrt().item()
    err_25 = (windowed_decode(decoder, codes, start, end, 25) - exact).abs().max().item()
    err_0 = (windowed_decode(decoder, codes, start, end, 0) - exact).abs().max().item()
    print(f"windowed re-decode max abs error: ctx 25 -> {err_25:.2e}, ctx 0 -> {err_0:.2e} (signal rms {rms:.2e})")
    assert TOL < err_25 < 0.2 * rms
    assert err_0 > err_25
    # at the stream start the context is clipped to what exists, which is exact
    head = windowed_decode(decoder, codes, 0, 10, 25)
    assert (head - full[..., : 10 * 1920]).abs().max().item() < TOL


def test_ramp_window_doubles_to_the_steady_size() -> None:
    assert [ramp_window(i, 2, 25) for i in range(7)] == [2, 4, 8, 16, 25, 25, 25]
    assert [ramp_window(i, 30, 25) for i in range(2)] == [25, 25]
    assert ramp_window(10**9, 1, 300) == 300
    with pytest.raises(ValueError):
        ramp_window(0, 0, 25)


def test_ramp_schedule_covers_exactly_the_frames() -> None:
    assert ramp_schedule(0, 2, 25) == []
    assert ramp_schedule(5, 2, 25) == [2, 3]
    assert ramp_schedule(100, 2, 25) == [2, 4, 8, 16, 25, 25, 20]
    # every window is at most the frames already decoded plus the first window: no playback gap on a fast producer
    sizes = ramp_schedule(1000, 4, 50)
    assert sum(sizes) == 1000
    assert all(n <= sum(sizes[:i]) + sizes[0] for i, n in enumerate(sizes))


def test_frames_to_samples() -> None:
    assert frames_to_samples(0) == 0
    assert frames_to_samples(25) == 48000
    assert frames_to_samples(3, 960) == 2880
    with pytest.raises(ValueError):
        frames_to_samples(-1)


def test_state_stack_and_split_round_trip(decoder) -> None:
    a, b = CodecStreamState.zeros(decoder), CodecStreamState.zeros(decoder)
    a.tensors["position"] += 3
    stacked = CodecStreamState.stack([a, b])
    assert stacked.batch == 2
    back = stacked.split()
    assert back[0].tensors["position"].item() == 3 and back[1].tensors["position"].item() == 0
    assert set(back[0].tensors) == set(a.tensors)


def test_streaming_state_is_small_and_fixed_size(decoder) -> None:
    state = CodecStreamState.zeros(decoder)
    before = {k: v.shape for k, v in state.tensors.items()}
    decode_window(decoder, torch.zeros(1, 16, 90, dtype=torch.long), state)
    assert {k: v.shape for k, v in state.tensors.items()} == before
    kv = [k for k in state.tensors if k.endswith(".k")]
    assert len(kv) == decoder.cfg.num_hidden_layers
    assert all(state.tensors[k].shape[2] == 71 for k in kv)


@pytest.mark.gpu
def test_cuda_graph_replay_of_a_pool_step_equals_eager_streaming(tmp_path_factory: pytest.TempPathFactory) -> None:
    # the codec stage captures one graph per (batch, window) bucket; state lives in the pool's static buffers
    gpu = load_speech_tokenizer(
        tiny_checkpoint_dir(tmp_path_factory), device="cuda", dtype=torch.bfloat16, with_encoder=False
    ).decoder
    batch, n, frames = 3, 4, 96
    codes = torch.randint(0, 2048, (batch, 16, frames), device="cuda", generator=None)
    slots = torch.arange(batch, device="cuda")
    eager_pool = CodecStatePool(gpu, batch)
    eager = torch.cat([eager_pool.decode(codes[..., s : s + n], slots) for s in range(0, frames, n)], dim=-1)

    pool = CodecStatePool(gpu, batch)
    static_codes = torch.zeros(batch, 16, n, dtype=torch.long, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        pool.decode(static_codes, slots)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = pool.decode(static_codes, slots)
    pool.reset(slots)
    parts = []
    for s in range(0, frames, n):
        static_codes.copy_(codes[..., s : s + n])
        graph.replay()
        parts.append(out.clone())
    assert torch.equal(torch.cat(parts, dim=-1), eager)
    with torch.inference_mode():
        full = gpu(codes).squeeze(1).float()
    assert (eager - full).abs().max().item() < 0.05 * full.abs().max().item()  # bf16: same signal
