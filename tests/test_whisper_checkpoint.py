"""Whisper checkpoints in the hub layout: tiny random ones, real-size dummies, the make-checkpoint command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from asr_helpers import utterance

from omni_stream.engine import AsyncEngine
from omni_stream.errors import ConfigError
from omni_stream.family import ModelKind
from omni_stream.models.whisper.checkpoint import build_model, write_dummy_checkpoint
from omni_stream.transcription.spec import TranscriptionRequest

pytest_plugins = ("asr_fixtures",)

CONFIGS = Path(__file__).resolve().parents[1] / "benchmarks" / "configs"
HUB_FILES = {"config.json", "generation_config.json", "model.safetensors", "preprocessor_config.json",
             "tokenizer.json", "tokenizer_config.json"}  # fmt: skip


def test_the_tiny_checkpoint_has_the_hub_layout_and_whispers_real_special_ids(tiny_whisper):
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperTokenizer

    assert HUB_FILES <= {p.name for p in tiny_whisper.iterdir()}
    tok = WhisperTokenizer.from_pretrained(str(tiny_whisper))
    ids = tok.convert_tokens_to_ids
    assert len(tok) == 51865
    assert [ids(t) for t in ("<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|zh|>", "<|translate|>",
                             "<|transcribe|>", "<|startofprev|>", "<|notimestamps|>", "<|0.00|>", "<|30.00|>")] == [
        50257, 50258, 50259, 50260, 50358, 50359, 50361, 50363, 50364, 51864]  # fmt: skip
    assert ids("Ġ") == 220  # byte-level order: begin_suppress_tokens [220, 50257] mean what they mean upstream
    text = " hello world this is a test"
    assert tok.decode(tok(text, add_special_tokens=False).input_ids) == text
    gen = json.loads((tiny_whisper / "generation_config.json").read_text())
    assert gen["lang_to_id"]["<|de|>"] == 50261 and gen["no_timestamps_token_id"] == 50363 and gen["is_multilingual"]
    model = WhisperForConditionalGeneration.from_pretrained(str(tiny_whisper))
    assert model.config.vocab_size == 51865 and model.proj_out.weight is model.model.decoder.embed_tokens.weight
    assert WhisperFeatureExtractor.from_pretrained(str(tiny_whisper)).feature_size == 80


def test_the_english_only_layout_shifts_the_specials_down_by_one(tiny_whisper_en):
    from transformers import WhisperTokenizer

    tok = WhisperTokenizer.from_pretrained(str(tiny_whisper_en))
    assert len(tok) == 51864
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|startoftranscript|>", "<|notimestamps|>"]) == [
        50256, 50257, 50362]  # fmt: skip
    gen = json.loads((tiny_whisper_en / "generation_config.json").read_text())
    assert not gen["is_multilingual"] and "lang_to_id" not in gen


@pytest.mark.parametrize(
    ("name", "params", "mels"), [("whisper-small", 241_734_912, 80), ("whisper-large-v3-turbo", 808_878_080, 128)]
)
def test_benchmark_configs_have_the_published_sizes(name, params, mels):
    config = json.loads((CONFIGS / name / "config.json").read_text())
    model = build_model(config, device="meta")
    assert sum(p.numel() for p in model.parameters()) == params and config["num_mel_bins"] == mels


async def test_from_config_writes_a_checkpoint_that_loads_with_dummy_weights(tmp_path):
    # The real layout at a small size (the real configs are exercised on the GPU machine).
    small = dict(json.loads((CONFIGS / "whisper-large-v3-turbo" / "config.json").read_text()),
                 d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                 decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128)  # fmt: skip
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(json.dumps(small))
    out = write_dummy_checkpoint(tmp_path / "cfg", tmp_path / "dummy", weights=False)
    assert not (out / "model.safetensors").exists()
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["lang_to_id"]["<|yue|>"] == 50358 and gen["no_timestamps_token_id"] == 50364  # v3: 100 languages
    async with await AsyncEngine.from_pretrained(out, progress=False, load_format="dummy") as engine:
        family = engine.models.get(ModelKind.TRANSCRIPTION)
        assert family.features.feature_size == 128 and "yue" in family.info.languages
        async with engine.generate(TranscriptionRequest(utterance("noise", 1.0), language="yue", max_tokens=3)) as s:
            deltas = [o.chunk async for o in s]
        assert deltas[-1].final and s.usage["transcription"].output_tokens == 3
    with pytest.raises(ConfigError, match="not a Whisper config"):
        write_dummy_checkpoint(CONFIGS / "qwen3-tts-12hz-0.6b-customvoice", tmp_path / "nope", weights=False)


def test_make_checkpoint_command_writes_a_tiny_asr_checkpoint(tmp_path):
    out = tmp_path / "asr"
    cmd = [sys.executable, "-m", "omni_stream.cli", "make-checkpoint", "--tiny", "--kind", "asr", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {out}" in proc.stdout and HUB_FILES <= {p.name for p in out.iterdir()}
    assert json.loads((out / "config.json").read_text())["model_type"] == "whisper"
