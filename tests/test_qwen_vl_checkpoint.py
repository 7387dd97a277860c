"""Qwen2.5-VL checkpoints and image policy: the tiny checkpoint in the hub layout loads name for name here and in
transformers, ``--from-config`` lays out a real-size vocabulary, and the image and position policies compute
what transformers' image processor and ``get_rope_index`` compute."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from vl_helpers import tiny_vl_checkpoint

from omni_stream.errors import ConfigError, InvalidRequestError
from omni_stream.models.qwen_vl.checkpoint import build_vl_tokenizer, write_dummy_checkpoint, write_reference_config
from omni_stream.models.qwen_vl.config import load_config, load_image_spec, parse_config
from omni_stream.models.qwen_vl.model import build_vl, load_vl
from omni_stream.models.qwen_vl.vision import expand_image_pads, prepare_image, rope_positions

transformers = pytest.importorskip("transformers")
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_vl_checkpoint(tmp_path_factory)


@pytest.fixture(scope="module")
def hf_model(ckpt):
    return transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(str(ckpt), dtype=torch.float32).eval()


def _hub_name(name: str) -> str:
    """transformers 5's module names -> the hub's tensor names."""
    if name.startswith("model.visual."):
        return name.removeprefix("model.")
    return name.replace("model.language_model.", "model.", 1)


def test_make_checkpoint_cli_writes_the_hub_layout(tmp_path):
    out = tmp_path / "vl"
    cmd = [sys.executable, "-m", "omni_stream.cli", "make-checkpoint", "--tiny", "--kind", "vl", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "qwen2_5_vl" and cfg["rope_scaling"]["mrope_section"] == [2, 3, 3]
    assert {"vision_config", "image_token_id", "vision_start_token_id"} <= set(cfg)
    names = set(load_file(out / "model.safetensors"))
    assert "visual.patch_embed.proj.weight" in names and "model.layers.0.self_attn.q_proj.bias" in names
    assert "visual.merger.mlp.2.weight" in names and "lm_head.weight" in names
    pre = json.loads((out / "preprocessor_config.json").read_text())
    assert pre["image_processor_type"] == "Qwen2VLImageProcessor" and pre["merge_size"] == 2


def test_the_tiny_checkpoint_loads_name_for_name_here_and_in_transformers(ckpt, hf_model):
    ours = load_vl(ckpt, dtype=torch.float32).state_dict()
    theirs = {_hub_name(k): v for k, v in hf_model.state_dict().items()}
    assert set(theirs) == set(ours)
    for name, value in theirs.items():
        assert torch.equal(ours[name], value), name
    biases = [ours[f"model.layers.{i}.self_attn.{p}_proj.bias"] for i in range(2) for p in "qkv"]
    assert all(b.abs().sum() > 0 for b in biases)  # random biases: the parity tests see them


def test_a_missing_or_misshapen_tensor_is_refused_by_name(ckpt, tmp_path):
    state = load_file(ckpt / "model.safetensors")
    for f in ckpt.iterdir():
        if f.name != "model.safetensors":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    del state["visual.blocks.1.attn.qkv.bias"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"visual\.blocks\.1\.attn\.qkv\.bias"):
        load_vl(tmp_path)


def test_config_errors_name_the_field(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    with pytest.raises(ConfigError, match="mrope_section"):
        parse_config({**cfg, "rope_scaling": {"type": "mrope", "mrope_section": [2, 2, 2]}})
    with pytest.raises(ConfigError, match="out_hidden_size"):
        parse_config({**cfg, "vision_config": {**cfg["vision_config"], "out_hidden_size": 32}})
    with pytest.raises(ConfigError, match="use_sliding_window"):
        parse_config({**cfg, "use_sliding_window": True})
    nested = {k: v for k, v in cfg.items() if k not in ("hidden_size", "rope_scaling")}
    nested["text_config"] = {"hidden_size": 64, "rope_parameters": {"rope_theta": 1e6, "mrope_section": [2, 3, 3]}}
    assert parse_config(nested) == parse_config(cfg)  # transformers 5's nested layout reads the same


def test_from_config_writes_a_3b_class_checkpoint_with_a_full_vocabulary(tmp_path):
    src = write_reference_config(tmp_path / "src")
    out = write_dummy_checkpoint(src, tmp_path / "out", weights=False)
    cfg = load_config(out)
    assert (cfg.text.hidden_size, cfg.text.num_hidden_layers, cfg.mrope_section) == (2048, 36, (16, 24, 24))
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(str(out))
    assert len(tok) == cfg.text.vocab_size == 151936
    assert tok.convert_ids_to_tokens(cfg.image_token_id) == "<|image_pad|>"
    assert tok.convert_tokens_to_ids("<|im_end|>") in cfg.text.eos_token_ids
    params = sum(p.numel() for p in build_vl(cfg).parameters())  # on the meta device: no memory
    assert 3.7e9 < params < 3.8e9  # Qwen2.5-VL-3B: 3.75 B with tied embeddings
    assert load_image_spec(out, cfg.vision).max_pixels == 12845056


@pytest.mark.parametrize("size", [(56, 84), (70, 100), (20, 30), (400, 300)])
def test_images_become_the_patches_transformers_makes(ckpt, size):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    cfg = load_config(ckpt)
    spec = load_image_spec(ckpt, cfg.vision)
    image = np.random.default_rng(sum(size)).integers(0, 256, (*size, 3), dtype=np.uint8)
    ours = prepare_image(image, spec)
    theirs = Qwen2VLImageProcessorPil.from_pretrained(str(ckpt))(images=[image], return_tensors="np")
    assert [list(ours.grid)] == theirs["image_grid_thw"].tolist()
    assert ours.tokens == ours.grid[1] * ours.grid[2] // 4 <= 24  # the tiny max_pixels bound
    np.testing.assert_allclose(ours.patches, theirs["pixel_values"], atol=1e-5)


def test_bad_images_are_refused_naming_messages(ckpt):
    spec = load_image_spec(ckpt, load_config(ckpt).vision)
    with pytest.raises(InvalidRequestError, match="uint8 RGB") as err:
        prepare_image(np.zeros((56, 56), dtype=np.uint8), spec)
    assert err.value.param == "messages"
    with pytest.raises(InvalidRequestError, match="ratio"):
        prepare_image(np.zeros((1, 300, 3), dtype=np.uint8), spec)


def test_positions_are_transformers_rope_index(ckpt, hf_model):
    cfg = load_config(ckpt)
    tok = build_vl_tokenizer()
    parts = [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Which differs?"}]
    msgs = [{"role": "user", "content": parts}, {"role": "assistant", "content": "The second."},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "And this?"}]}]  # fmt: skip
    ids = list(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)["input_ids"])
    grids = [(1, 4, 6), (1, 8, 4), (1, 6, 6)]
    ids = expand_image_pads(ids, cfg.image_token_id, [t * h * w // 4 for t, h, w in grids])
    ours, delta = rope_positions(ids, cfg.image_token_id, grids, 2)
    x = torch.tensor([ids])
    mm = (x == cfg.image_token_id).int()
    theirs, their_delta = hf_model.model.get_rope_index(x, mm, torch.tensor(grids))
    assert torch.equal(theirs[:, 0], torch.from_numpy(ours)) and delta == int(their_delta) < 0
    with pytest.raises(InvalidRequestError, match="2 images"):
        expand_image_pads([1, cfg.image_token_id, 2], cfg.image_token_id, [4, 4])
