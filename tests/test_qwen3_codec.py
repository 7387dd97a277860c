"""12 Hz codec decoder: parity with the reference, strict loading, config validation, checkpoint writer."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
from reference_codec import reference_speech_tokenizer, tiny_checkpoint_dir
from safetensors.torch import load_file, save_file

from omni_stream.errors import ConfigError
from omni_stream.models.qwen3_tts.codec import SpeechTokenizer, load_speech_tokenizer
from omni_stream.models.qwen3_tts.codec_checkpoint import (
    real_speech_tokenizer_config,
    tiny_speech_tokenizer_config,
    write_tiny_speech_tokenizer,
)
from omni_stream.models.qwen3_tts.codec_config import SpeechTokenizerConfig


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def ours(ckpt: Path) -> SpeechTokenizer:
    return load_speech_tokenizer(ckpt)


@pytest.fixture(scope="module")
def reference(ckpt: Path):
    return reference_speech_tokenizer(ckpt / "speech_tokenizer")


def _codes(batch: int, frames: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 2048, (batch, 16, frames), generator=torch.Generator().manual_seed(seed))


@pytest.mark.reference
def test_reference_loads_written_checkpoint_with_the_same_tensors(ckpt: Path, ours: SpeechTokenizer, reference) -> None:
    ref_state = reference.model.state_dict()
    our_state = ours.state_dict()
    assert set(ref_state) == set(our_state)
    for name, value in our_state.items():
        assert torch.equal(ref_state[name].float(), value.float()), name
    assert reference.model.config.decoder_config.sliding_window == 72
    assert (ckpt / "speech_tokenizer" / "preprocessor_config.json").is_file()


@pytest.mark.reference
def test_decoder_matches_reference_fp32(ours: SpeechTokenizer, reference) -> None:
    codes = _codes(2, 90)  # > 72 frames: the sliding window is exercised
    with torch.inference_mode():
        expected = reference.model.decoder(codes).squeeze(1)
    got = ours.decode(codes)
    assert got.shape == (2, 90 * 1920) and got.dtype == torch.float32
    err = (got - expected).abs().max().item()
    assert err < 1e-4, err
    # the tiny weights make audible, unclipped audio, so the comparison is not between silences
    rms = got.pow(2).mean().sqrt().item()
    assert 0.01 < rms < 0.5, rms
    assert (got.abs() >= 1.0).float().mean().item() < 1e-3


@pytest.mark.reference
def test_decoder_matches_reference_in_bf16(ckpt: Path) -> None:
    # the reference runs the codec in the talker's dtype (QWEN3_TTS.md pitfall 11); we round the same way
    reference_bf16 = reference_speech_tokenizer(ckpt / "speech_tokenizer", dtype=torch.bfloat16)
    ours_bf16 = load_speech_tokenizer(ckpt, dtype=torch.bfloat16, with_encoder=False)
    codes = _codes(1, 80, seed=5)
    with torch.inference_mode():
        expected = reference_bf16.model.decoder(codes).squeeze(1).float()
    got = ours_bf16.decode(codes)
    fp32 = load_speech_tokenizer(ckpt, with_encoder=False).decode(codes)
    bf16_vs_fp32 = (got - fp32).abs().max().item()
    err = (got - expected).abs().max().item()
    assert err <= 0.05 * bf16_vs_fp32, (err, bf16_vs_fp32)  # measured: 0.0 (same kernels, same rounding points)


def test_decoder_runs_in_the_model_dtype(ckpt: Path) -> None:
    bf16 = load_speech_tokenizer(ckpt, dtype=torch.bfloat16, with_encoder=False)
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    codes = _codes(1, 12)
    audio = bf16.decode(codes)
    assert audio.dtype == torch.float32 and audio.shape == (1, 12 * 1920)
    fp32 = load_speech_tokenizer(ckpt, with_encoder=False).decode(codes)
    diff = (audio - fp32).abs().max().item()
    assert 0 < diff < 0.5  # bf16 rounding shows, but it is the same signal


def test_folded_weights_follow_in_place_weight_updates(ckpt: Path) -> None:
    # SnakeBeta exponentials and codebook tables are cached between calls; edits must invalidate them
    def edit(model: SpeechTokenizer) -> None:
        with torch.no_grad():
            model.get_parameter("decoder.decoder.5.alpha").add_(0.5)
            model.get_parameter("decoder.quantizer.rvq_rest.vq.layers.3._codebook.cluster_usage").mul_(2.0)

    codes = _codes(1, 6, seed=11)
    used = load_speech_tokenizer(ckpt, with_encoder=False)
    before = used.decode(codes)
    edit(used)
    after = used.decode(codes)
    fresh = load_speech_tokenizer(ckpt, with_encoder=False)
    edit(fresh)
    assert not torch.equal(before, after)
    assert torch.equal(after, fresh.decode(codes))


def test_prefix_decode_is_the_prefix_of_the_full_decode(ours: SpeechTokenizer) -> None:
    codes = _codes(1, 80, seed=3)
    full = ours.decode(codes)
    prefix = ours.decode(codes[..., :33])
    assert (prefix - full[..., : 33 * 1920]).abs().max().item() < 1e-5


def test_writer_is_deterministic_in_the_seed(tmp_path: Path, ckpt: Path) -> None:
    write_tiny_speech_tokenizer(tmp_path / "a", seed=0)
    write_tiny_speech_tokenizer(tmp_path / "b", seed=1)
    same = load_file(str(tmp_path / "a" / "speech_tokenizer" / "model.safetensors"))
    base = load_file(str(ckpt / "speech_tokenizer" / "model.safetensors"))
    other = load_file(str(tmp_path / "b" / "speech_tokenizer" / "model.safetensors"))
    assert all(torch.equal(same[k], base[k]) for k in base)
    assert not torch.equal(other["decoder.pre_conv.conv.weight"], base["decoder.pre_conv.conv.weight"])
    assert {t.dtype for t in base.values()} == {torch.float32}
    cfg = json.loads((ckpt / "speech_tokenizer" / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_tts_tokenizer_12hz" and cfg["decoder_config"]["upsample_rates"] == [8, 5, 4, 3]


def _copy_with_weights(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src / "speech_tokenizer", dst / "speech_tokenizer")
    path = dst / "speech_tokenizer" / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))
    return dst


def test_load_rejects_a_missing_weight_and_names_it(tmp_path: Path, ckpt: Path) -> None:
    key = "decoder.pre_transformer.layers.1.mlp.up_proj.weight"
    bad = _copy_with_weights(ckpt, tmp_path, lambda t: t.pop(key))
    with pytest.raises(ConfigError, match=r"1 missing weights.*mlp\.up_proj"):
        load_speech_tokenizer(bad)


def test_load_rejects_an_unexpected_weight_and_names_it(tmp_path: Path, ckpt: Path) -> None:
    bad = _copy_with_weights(ckpt, tmp_path, lambda t: t.update({"decoder.extra.weight": torch.zeros(2)}))
    with pytest.raises(ConfigError, match=r"1 unexpected weights.*decoder\.extra\.weight"):
        load_speech_tokenizer(bad)


def test_load_rejects_a_mis_shaped_weight(tmp_path: Path, ckpt: Path) -> None:
    key = "decoder.pre_conv.conv.bias"
    bad = _copy_with_weights(ckpt, tmp_path, lambda t: t.update({key: torch.zeros(7)}))
    with pytest.raises(ConfigError, match=r"pre_conv\.conv\.bias.*shape"):
        load_speech_tokenizer(bad)


def test_decoder_only_load_ignores_encoder_weights(ckpt: Path) -> None:
    model = load_speech_tokenizer(ckpt, with_encoder=False)
    assert model.encoder is None
    with pytest.raises(RuntimeError, match="without its encoder"):
        model.encode(torch.zeros(4000))


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda c: c["decoder_config"].pop("codebook_dim"), "decoder_config.codebook_dim"),
        (lambda c: c["decoder_config"].pop("head_dim"), "decoder_config.head_dim"),
        (lambda c: c["decoder_config"].update(sliding_window="72"), "decoder_config.sliding_window"),
        (lambda c: c["decoder_config"].update(upsample_rates=[]), "decoder_config.upsample_rates"),
        (lambda c: c["decoder_config"].update(num_key_value_heads=3), "decoder_config.num_key_value_heads"),
        (lambda c: c["encoder_config"].update(hidden_act="relu"), "encoder_config.hidden_act"),
        (lambda c: c["encoder_config"].update(frame_rate=25.0, _frame_rate=25.0), "encoder_config.frame_rate"),
        (lambda c: c.update(decode_upsample_rate=960), "decode_upsample_rate"),
        (lambda c: c.update(encoder_valid_num_quantizers=8), "encoder_valid_num_quantizers"),
        (lambda c: c.update(model_type="qwen3_tts_tokenizer_25hz"), "model_type"),
        (lambda c: c.pop("decoder_config"), "decoder_config"),
    ],
)
def test_config_errors_name_the_field(edit, field: str) -> None:
    config = tiny_speech_tokenizer_config()
    edit(config)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        SpeechTokenizerConfig.from_dict(config)


def test_missing_config_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="speech_tokenizer"):
        load_speech_tokenizer(tmp_path)


def test_dummy_load_needs_no_weights_file(tmp_path: Path) -> None:
    (tmp_path / "speech_tokenizer").mkdir()
    (tmp_path / "speech_tokenizer" / "config.json").write_text(json.dumps(tiny_speech_tokenizer_config()))
    model = load_speech_tokenizer(tmp_path, load_format="dummy")
    audio = model.decode(_codes(1, 4))
    assert audio.shape == (1, 4 * 1920) and audio.abs().max().item() > 0


def test_real_config_has_the_hub_geometry_and_sizes() -> None:
    cfg = SpeechTokenizerConfig.from_dict(real_speech_tokenizer_config())
    assert cfg.decoder.samples_per_frame == 1920 and cfg.decoder.head_dim * cfg.decoder.num_attention_heads == 1024
    with torch.device("meta"):
        model = SpeechTokenizer(cfg)
    decoder_params = sum(p.numel() for p in model.decoder.parameters())
    assert 113e6 < decoder_params < 116e6, decoder_params  # 114.3M (QWEN3_TTS.md section 2.2)
    assert real_speech_tokenizer_config() == copy.deepcopy(real_speech_tokenizer_config())
