"""Speaker encoder (ECAPA-TDNN x-vector) and its log-mel front end against librosa and the reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from reference_codec import reference_mel, reference_speaker_encoder
from safetensors.torch import save_file

from omni_stream.errors import ConfigError
from omni_stream.models.qwen3_tts.codec_checkpoint import random_speaker_encoder_state, tiny_speaker_encoder_config
from omni_stream.models.qwen3_tts.mel import log_mel_spectrogram, slaney_mel_filterbank
from omni_stream.models.qwen3_tts.speaker_encoder import (
    SpeakerEncoder,
    SpeakerEncoderConfig,
    load_speaker_encoder,
)

ENC_DIM = 64


def _audio(n: int = 24000 + 321, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(n) / 24000
    voice = 0.4 * torch.sin(2 * torch.pi * 180 * t) * torch.sin(2 * torch.pi * 2 * t)
    return (voice + 0.05 * torch.randn(n, generator=g)).float()


@pytest.fixture(scope="module")
def state() -> dict[str, torch.Tensor]:
    return random_speaker_encoder_state(tiny_speaker_encoder_config(ENC_DIM), seed=0)


@pytest.fixture(scope="module")
def ours(state) -> SpeakerEncoder:
    model = SpeakerEncoder(SpeakerEncoderConfig.from_dict(tiny_speaker_encoder_config(ENC_DIM))).eval()
    model.load_state_dict({k.removeprefix("speaker_encoder."): v for k, v in state.items()}, strict=True)
    return model


@pytest.fixture(scope="module")
def reference(state):
    return reference_speaker_encoder(tiny_speaker_encoder_config(ENC_DIM), state)


@pytest.mark.parametrize(("sr", "n_fft", "n_mels", "fmax"), [(24000, 1024, 128, 12000.0), (16000, 512, 80, 7600.0)])
def test_slaney_filterbank_matches_librosa(sr: int, n_fft: int, n_mels: int, fmax: float) -> None:
    librosa = pytest.importorskip("librosa")
    expected = librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels, fmin=0.0, fmax=fmax)
    got = slaney_mel_filterbank(sr, n_fft, n_mels, 0.0, fmax).numpy()
    assert got.shape == expected.shape and got.dtype == np.float32
    assert np.abs(got - expected).max() < 1e-7 * max(1.0, np.abs(expected).max()) * 10


@pytest.mark.reference
def test_log_mel_matches_reference() -> None:
    audio = _audio()
    expected = reference_mel(audio)
    got = log_mel_spectrogram(audio)
    assert got.shape == expected.shape == (1, 128, (audio.numel() + 768 - 1024) // 256 + 1)
    assert (got - expected).abs().max().item() < 1e-4


@pytest.mark.reference
def test_xvector_matches_reference_on_the_same_mels(ours, reference) -> None:
    mels = log_mel_spectrogram(_audio(seed=1)).transpose(1, 2)
    with torch.inference_mode():
        expected = reference(mels)
        got = ours(mels)
    assert got.shape == (1, ENC_DIM)
    assert (got - expected).abs().max().item() < 1e-4
    assert got.abs().max().item() > 1e-2  # not a vanishing output


@pytest.mark.reference
def test_embed_from_audio_matches_the_reference_pipeline(ours, reference) -> None:
    audio = _audio(40000, seed=2)
    with torch.inference_mode():
        expected = reference(reference_mel(audio).transpose(1, 2))[0]
    got = ours.embed(audio)
    assert got.shape == (ENC_DIM,)
    assert (got - expected).abs().max().item() < 1e-4
    # different voices give different x-vectors
    assert (ours.embed(_audio(40000, seed=3) * 0.3) - got).abs().max().item() > 1e-3


def test_random_state_is_prefixed_and_deterministic(state) -> None:
    assert all(k.startswith("speaker_encoder.") for k in state)
    assert {
        "speaker_encoder.fc.weight",
        "speaker_encoder.asp.tdnn.conv.weight",
        "speaker_encoder.mfa.conv.bias",
    } <= set(state)
    again = random_speaker_encoder_state(tiny_speaker_encoder_config(ENC_DIM), seed=0)
    other = random_speaker_encoder_state(tiny_speaker_encoder_config(ENC_DIM), seed=1)
    assert all(torch.equal(again[k], state[k]) for k in state)
    assert not torch.equal(other["speaker_encoder.fc.weight"], state["speaker_encoder.fc.weight"])


def test_load_from_root_checkpoint_reads_only_speaker_weights(tmp_path: Path, state, ours) -> None:
    talker = {"talker.model.norm.weight": torch.ones(8)}
    save_file({**talker, **{k: v.to(torch.bfloat16) for k, v in state.items()}}, str(tmp_path / "model.safetensors"))
    model = load_speaker_encoder(tmp_path, tiny_speaker_encoder_config(ENC_DIM), dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    audio = _audio(30000, seed=4)
    got = model.embed(audio)
    assert got.dtype == torch.bfloat16
    assert (got.float() - ours.embed(audio)).abs().max().item() < 0.1 * ours.embed(audio).abs().max().item()


def test_load_is_strict_about_speaker_weights(tmp_path: Path, state) -> None:
    partial = dict(state)
    partial.pop("speaker_encoder.asp.conv.weight")
    save_file(partial, str(tmp_path / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"missing weights.*asp\.conv\.weight"):
        load_speaker_encoder(tmp_path, tiny_speaker_encoder_config(ENC_DIM))
    save_file({**state, "speaker_encoder.extra": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"unexpected weights.*extra"):
        load_speaker_encoder(tmp_path, tiny_speaker_encoder_config(ENC_DIM))


def test_dummy_load_has_the_real_size() -> None:
    config = dict(
        tiny_speaker_encoder_config(1024),
        enc_channels=[512, 512, 512, 512, 1536],
        enc_attention_channels=128,
        enc_se_channels=128,
    )
    model = load_speaker_encoder("unused", config, load_format="dummy")
    params = sum(p.numel() for p in model.parameters())
    assert 8.5e6 < params < 9.3e6, params  # 8.9M for 0.6B-Base (QWEN3_TTS.md section 2.2)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda c: c.pop("enc_dim"), "speaker_encoder_config.enc_dim"),
        (lambda c: c.update(enc_channels=[32, 32, 32, 32, 64]), "speaker_encoder_config.enc_channels"),
        (lambda c: c.update(enc_kernel_sizes=[5, 3]), "enc_kernel_sizes"),
        (lambda c: c.update(enc_res2net_scale=5), "speaker_encoder_config.enc_res2net_scale"),
        (lambda c: c.update(enc_se_channels=0), "speaker_encoder_config.enc_se_channels"),
        (lambda c: c.update(sample_rate=16000), "sample_rate"),
    ],
)
def test_config_errors_name_the_field(edit, field: str) -> None:
    config = tiny_speaker_encoder_config(ENC_DIM)
    edit(config)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        SpeakerEncoderConfig.from_dict(config)
