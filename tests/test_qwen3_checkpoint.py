"""``omni-stream make-checkpoint``: the hub layout, loadable by the reference and by us; benchmark configs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from reference_qwen import CodeRecorder, import_qwen_tts

from omni_stream.cli import main
from omni_stream.models.qwen3_tts.checkpoint import GENERATION_CONFIG, hub_config, load_lm
from omni_stream.models.qwen3_tts.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "benchmarks" / "configs"


@pytest.mark.reference
def test_cli_writes_a_hub_layout_the_reference_loads(tmp_path) -> None:
    pytest.importorskip("omni_stream.models.qwen3_tts.codec_checkpoint")
    out = tmp_path / "base"
    assert main(["make-checkpoint", "--tiny", "--kind", "base", "--size", "1.7b", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "vocab.json", "merges.txt",
            "tokenizer_config.json", "preprocessor_config.json", "speech_tokenizer"} <= names  # fmt: skip
    assert (out / "speech_tokenizer" / "model.safetensors").exists()
    cfg = load_config(out)
    assert cfg.tts_model_type == "base" and cfg.talker.decoder.hidden_size == 96
    assert cfg.code_predictor.hidden_size == 64  # 1.7B-shaped: the small_to_mtp projection is a Linear
    assert json.loads((out / "generation_config.json").read_text()) == GENERATION_CONFIG
    load_lm(out)

    import_qwen_tts()
    from qwen_tts import Qwen3TTSModel

    ref = Qwen3TTSModel.from_pretrained(str(out), dtype=torch.float32, attn_implementation="eager")
    wav = (np.random.default_rng(0).standard_normal(24000) * 0.1).astype(np.float32)
    items = ref.create_voice_clone_prompt(ref_audio=(wav, 24000), ref_text="Hello.")  # speaker encoder + Mimi
    assert items[0].ref_spk_embedding.shape == (96,) and items[0].ref_code.shape[1] == 16
    ref.model.load_speech_tokenizer(recorder := CodeRecorder())
    ref.generate_voice_clone(text="Hello world.", language="English", voice_clone_prompt=items, max_new_tokens=4,
                             do_sample=False, subtalker_dosample=False)  # fmt: skip
    assert recorder.codes[0].shape[1] == 16


def test_bf16_tiny_checkpoint(tmp_path) -> None:
    out = tmp_path / "cv"
    main(["make-checkpoint", "--tiny", "--kind", "custom_voice", "--dtype", "bfloat16", str(out)])
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert load_lm(out).talker.codec_head.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("size", ["0.6b", "1.7b"])
def test_benchmark_configs_are_the_real_hub_configs(size) -> None:
    d = CONFIGS / f"qwen3-tts-12hz-{size}-customvoice"
    raw = json.loads((d / "config.json").read_text())
    raw.pop("dtype")
    assert raw == hub_config("custom_voice", size, tiny=False)
    assert json.loads((d / "generation_config.json").read_text()) == GENERATION_CONFIG
    cfg = load_config(d)
    assert len(cfg.speakers) == 9 and cfg.tts_model_size == ("0b6" if size == "0.6b" else "1b7")
