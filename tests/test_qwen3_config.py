"""Config parsing and validation, weight loading (strict, dtype, dummy), real-size parameter counts."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
from reference_qwen import tiny_checkpoint
from safetensors.torch import load_file, save_file

from omni_stream.errors import ConfigError
from omni_stream.models.qwen3_tts.checkpoint import build_lm, hub_config, load_lm
from omni_stream.models.qwen3_tts.config import (
    GenerationDefaults,
    load_config,
    load_generation_defaults,
    parse_config,
    parse_generation_config,
)
from omni_stream.runtime.weights import count_parameters

CONFIGS = Path(__file__).resolve().parents[1] / "benchmarks" / "configs"


def test_real_configs_parse_with_hub_values() -> None:
    cfg = load_config(CONFIGS / "qwen3-tts-12hz-0.6b-customvoice")
    t = cfg.talker
    assert (t.decoder.hidden_size, t.decoder.num_hidden_layers, t.decoder.intermediate_size) == (1024, 28, 3072)
    assert (t.codec_pad_id, t.codec_bos_id, t.codec_eos_token_id) == (2148, 2149, 2150)
    assert (t.codec_think_id, t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id) == (
        2154,
        2155,
        2156,
        2157,
    )
    assert t.spk_id["ryan"] == 3061 and t.spk_is_dialect["dylan"] == "beijing_dialect"
    assert "beijing_dialect" not in cfg.languages and cfg.languages[0] == "auto"
    assert (cfg.tts_pad_token_id, cfg.tts_bos_token_id, cfg.tts_eos_token_id) == (151671, 151672, 151673)
    assert not cfg.supports_instructions
    big = load_config(CONFIGS / "qwen3-tts-12hz-1.7b-customvoice")
    assert big.talker.decoder.hidden_size == 2048 and big.supports_instructions
    gen = load_generation_defaults(CONFIGS / "qwen3-tts-12hz-1.7b-customvoice")
    assert gen == GenerationDefaults()  # hub file: reference defaults with max_new_tokens 8192


def _bad(mutate) -> ConfigError:
    d = copy.deepcopy(hub_config("custom_voice", "0.6b", tiny=False))
    mutate(d)
    with pytest.raises(ConfigError) as info:
        parse_config(d)
    return info.value


def _set(path: str, value=None, *, drop: bool = False):
    """A mutation of the config dict at a dotted path (set ``value``, or drop the key)."""

    def mutate(d: dict) -> None:
        *parents, leaf = path.split(".")
        for p in parents:
            d = d[p]
        if drop:
            d.pop(leaf)
        else:
            d[leaf] = value

    return mutate


T = "talker_config."
CP = "talker_config.code_predictor_config."


@pytest.mark.parametrize(
    ("field", "mutate"),
    [
        (T + "hidden_size", _set(T + "hidden_size", drop=True)),
        (T + "text_vocab_size", _set(T + "text_vocab_size", drop=True)),
        (T + "rope_scaling.rope_type", _set(T + "rope_scaling.rope_type", "yarn")),
        (T + "rope_scaling.mrope_section", _set(T + "rope_scaling.mrope_section", [24, 20, 21])),
        (T + "num_code_groups", _set(T + "num_code_groups", 32)),
        (CP + "vocab_size", _set(CP + "vocab_size", 1024)),
        (CP + "num_key_value_heads", _set(CP + "num_key_value_heads", 5)),
        (T + "hidden_act", _set(T + "hidden_act", "gelu")),
        (T + "codec_eos_token_id", _set(T + "codec_eos_token_id", 5000)),
        (T + "spk_is_dialect.eric", _set(T + "spk_is_dialect.eric", "klingon")),
        ("tts_model_type", _set("tts_model_type", "music")),
        ("tts_pad_token_id", _set("tts_pad_token_id", drop=True)),
        ("model_type", _set("model_type", "llama")),
        ("speaker_encoder_config", _set("tts_model_type", "base")),
        (
            "speaker_encoder_config.enc_dim",
            lambda d: d.update(tts_model_type="base", speaker_encoder_config={"enc_dim": 7}),
        ),
    ],
)
def test_config_errors_name_the_field(field, mutate) -> None:
    assert field in str(_bad(mutate))


def test_generation_config_validation_and_missing_files(tmp_path) -> None:
    assert parse_generation_config({"top_k": 20, "temperature": 1}).temperature == 1.0
    with pytest.raises(ConfigError, match=r"generation_config\.do_sample"):
        parse_generation_config({"do_sample": "yes"})
    with pytest.raises(ConfigError, match=r"config\.json not found"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text("{nope")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(tmp_path)
    assert load_generation_defaults(tmp_path).max_new_tokens == 2048  # no file: the reference's hard default


def _expected_counts(size: str) -> dict[str, float]:
    # QWEN3_TTS.md section 2.2 (reference classes on the meta device), millions.
    if size == "0.6b":
        return {"layers": 440.5, "attn": 176.2, "mlp": 264.2, "codec_embedding": 3.15, "codec_head": 3.15,
                "text_embedding": 311.2, "text_projection": 6.3, "cp_layers": 78.7, "cp_embedding": 31.5,
                "cp_heads": 31.5, "cp_proj": 0.0, "total": 905.8}  # fmt: skip
    return {"layers": 1409.4, "attn": 352.3, "mlp": 1057.0, "codec_embedding": 6.29, "codec_head": 6.29,
            "text_embedding": 311.2, "text_projection": 8.4, "cp_layers": 78.7, "cp_embedding": 62.9,
            "cp_heads": 31.5, "cp_proj": 2.1, "total": 1916.7}  # fmt: skip


@pytest.mark.parametrize("size", ["0.6b", "1.7b"])
def test_real_size_parameter_counts_on_meta(size) -> None:
    lm = build_lm(load_config(CONFIGS / f"qwen3-tts-12hz-{size}-customvoice"), "meta")
    assert all(p.device.type == "meta" for p in lm.parameters())
    named = list(lm.named_parameters())

    def m(pred) -> float:
        return sum(p.numel() for n, p in named if pred(n)) / 1e6

    got = {
        "layers": m(lambda n: n.startswith("talker.model.layers.")),
        "attn": m(lambda n: n.startswith("talker.model.layers.") and ".self_attn." in n),
        "mlp": m(lambda n: n.startswith("talker.model.layers.") and ".mlp." in n),
        "codec_embedding": m(lambda n: n.startswith("talker.model.codec_embedding.")),
        "codec_head": m(lambda n: n.startswith("talker.codec_head.")),
        "text_embedding": m(lambda n: n.startswith("talker.model.text_embedding.")),
        "text_projection": m(lambda n: n.startswith("talker.text_projection.")),
        "cp_layers": m(lambda n: n.startswith("talker.code_predictor.model.layers.")),
        "cp_embedding": m(lambda n: n.startswith("talker.code_predictor.model.codec_embedding.")),
        "cp_heads": m(lambda n: n.startswith("talker.code_predictor.lm_head.")),
        "cp_proj": m(lambda n: n.startswith("talker.code_predictor.small_to_mtp_projection.")),
        "total": count_parameters(lm) / 1e6,
    }
    for key, want in _expected_counts(size).items():
        tol = 0.005 if want < 10 and want != round(want, 1) else 0.05
        assert abs(got[key] - want) <= tol, (key, got[key], want)


def test_dummy_load_reads_no_weights(tmp_path) -> None:
    shutil.copy(CONFIGS / "qwen3-tts-12hz-0.6b-customvoice" / "config.json", tmp_path / "config.json")
    cfg = hub_config("custom_voice", "0.6b", tiny=True)
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # tiny sizes keep the test fast; no safetensors here
    a = load_lm(tmp_path, load_format="dummy", dtype=torch.float32, seed=3)
    b = load_lm(tmp_path, load_format="dummy", dtype=torch.float32, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    assert a.talker.codec_head.weight.device.type == "cpu"
    assert a.talker.model.rotary.inv_freq.device.type == "cpu"
    std = a.talker.model.layers[0].mlp.down_proj.weight.std().item()
    assert 0.5 / 128**0.5 < std < 2 / 128**0.5  # ~1/sqrt(fan_in)
    with pytest.raises(ConfigError, match="load_format"):
        load_lm(tmp_path, load_format="pickle")
    with pytest.raises(ConfigError, match=r"model\.safetensors"):
        load_lm(tmp_path)


def test_safetensors_load_is_strict_and_casts(tmp_path_factory, tmp_path) -> None:
    src = tiny_checkpoint(tmp_path_factory, "custom_voice", "0.6b")
    lm = load_lm(src, dtype=torch.bfloat16)
    assert lm.talker.codec_head.weight.dtype == torch.bfloat16
    state = load_file(str(src / "model.safetensors"))
    torch.testing.assert_close(
        lm.talker.codec_head.weight.float(), state["talker.codec_head.weight"].bfloat16().float()
    )

    def variant(name: str, edit) -> Path:
        d = tmp_path / name
        shutil.copytree(src, d)
        s = dict(state)
        edit(s)
        save_file(s, str(d / "model.safetensors"))
        return d

    with pytest.raises(ConfigError, match=r"missing 1 tensors: talker\.codec_head\.weight"):
        load_lm(variant("missing", lambda s: s.pop("talker.codec_head.weight")))
    with pytest.raises(ConfigError, match=r"unexpected tensors: talker\.extra"):
        load_lm(variant("extra", lambda s: s.update({"talker.extra": torch.zeros(1)})))
    with pytest.raises(ConfigError, match=r"shape mismatch .*talker\.model\.norm\.weight"):
        load_lm(variant("shape", lambda s: s.update({"talker.model.norm.weight": torch.zeros(3)})))
    # the speaker encoder's tensors belong to another module and are skipped
    load_lm(variant("spk", lambda s: s.update({"speaker_encoder.fc.weight": torch.zeros(2, 2)})))
