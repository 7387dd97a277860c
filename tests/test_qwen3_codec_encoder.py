"""Mimi-based 12 Hz encoder: codes equal the reference ``speech_tokenizer.encode`` exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from reference_codec import reference_speech_tokenizer, tiny_checkpoint_dir

from omni_stream.models.qwen3_tts.codec import SpeechTokenizer, load_speech_tokenizer
from omni_stream.models.qwen3_tts.codec_encoder import extra_right_padding


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory):
    return tiny_checkpoint_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def ours(ckpt) -> SpeechTokenizer:
    return load_speech_tokenizer(ckpt)


@pytest.fixture(scope="module")
def reference(ckpt):
    return reference_speech_tokenizer(ckpt / "speech_tokenizer")


def _speechlike(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 24000
    tone = 0.3 * np.sin(2 * np.pi * (140 + 60 * np.sin(2 * np.pi * 3 * t)) * t)
    return (tone * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t)) + 0.05 * rng.standard_normal(n)).astype(np.float32)


# Lengths: whole frames, a ragged tail, under one frame, and longer than the 72-frame decoder window.
@pytest.mark.reference
@pytest.mark.parametrize("n_samples", [24000, 24000 + 123, 1500, 80 * 1920 + 7])
def test_codes_equal_the_reference_encoder(ours, reference, n_samples: int) -> None:
    audio = _speechlike(n_samples, seed=n_samples)
    expected = reference.encode(audio, sr=24000).audio_codes[0]
    got = ours.encode(torch.from_numpy(audio))
    assert got.shape == (math.ceil(n_samples / 1920), 16) == tuple(expected.shape)
    assert got.dtype == torch.long
    # Exact: both sides run the same fp32 ops and rank distances with torch.cdist, so ties break alike.
    assert torch.equal(got, expected.to(got.device))
    assert got.unique().numel() > min(8, got.numel() // 2)  # codes vary with the audio (not a degenerate codebook)


@pytest.mark.reference
def test_codes_equal_the_reference_encoder_in_bf16(ckpt) -> None:
    audio = _speechlike(40000, seed=9)
    expected = reference_speech_tokenizer(ckpt / "speech_tokenizer", dtype=torch.bfloat16).encode(audio, sr=24000)
    got = load_speech_tokenizer(ckpt, dtype=torch.bfloat16).encode(torch.from_numpy(audio))
    # the reference casts the audio to the model dtype; so do we, and the same codes come out
    assert torch.equal(got, expected.audio_codes[0])


def test_encode_then_decode_round_trip_shapes(ours) -> None:
    codes = ours.encode(torch.from_numpy(_speechlike(30000, 1)))
    audio = ours.decode(codes.T[None])
    assert audio.shape == (1, codes.shape[0] * 1920)


def test_encode_rejects_bad_input(ours) -> None:
    with pytest.raises(ValueError, match="mono"):
        ours.encode(torch.zeros(2, 100))
    with pytest.raises(ValueError, match="mono"):
        ours.encode(torch.zeros(0))


def test_extra_right_padding_completes_the_last_window() -> None:
    # kernel 8 stride 4 (Mimi's x4 stage): 10 samples + 4 left pad need 2 more on the right for 4 outputs
    assert extra_right_padding(10, 8, 4, 4) == 2
    assert extra_right_padding(12, 8, 4, 4) == 0
    assert extra_right_padding(5, 3, 1, 2) == 0
