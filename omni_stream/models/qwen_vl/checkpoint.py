"""Random-weight Qwen2.5-VL checkpoints in the hub layout, built offline (tests, benchmarks).

``omni-stream make-checkpoint --tiny --kind vl OUT`` writes a tiny one: ``config.json`` in the hub's layout (text
fields at the top, ``rope_scaling`` with ``mrope_section``, ``vision_config``), ``generation_config.json``,
``preprocessor_config.json`` (Qwen2-VL's image processor, with a small ``max_pixels`` so frames stay a few
tokens), ``model.safetensors`` with the hub's names, and the causal LM's byte-level tokenizer
(:func:`omni_stream.models.causal_lm.checkpoint.build_tokenizer`) plus Qwen2.5-VL's vision tokens
(``<|vision_start|>``, ``<|vision_end|>``, ``<|vision_pad|>``, ``<|image_pad|>``, ``<|video_pad|>``) and a ChatML
template whose user turns may hold image parts (``<|vision_start|><|image_pad|><|vision_end|>`` per image, before
the text). ``--from-config DIR`` writes random weights at the sizes of ``DIR/config.json`` with a tokenizer of the
full vocabulary (the vision tokens last; the written ``config.json`` names their ids);
:func:`write_reference_config` writes a Qwen2.5-VL-3B-Instruct ``config.json`` for it. transformers reads every
checkpoint written here (``Qwen2_5_VLForConditionalGeneration``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from omni_stream.errors import ConfigError
from omni_stream.models.causal_lm.checkpoint import CHATML, build_tokenizer, generation_config, write_weights
from omni_stream.models.qwen_vl.config import CLIP_MEAN, CLIP_STD, parse_config
from omni_stream.models.qwen_vl.model import random_vl
from omni_stream.runtime.weights import parse_dtype

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
_USER_TURN = "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>"
_RENDER = (
    "{% macro render(content) %}{% if content is string %}{{ content }}{% else %}{% for part in content %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}{% endmacro %}"
)
if CHATML.count(_USER_TURN) != 1:  # the causal LM's template changed shape: this family's must follow
    raise RuntimeError("the ChatML template's user turn is not where Qwen2.5-VL's template expects it")
# The causal LM's ChatML (tools included) whose user and system turns render image parts.
CHAT_TEMPLATE = _RENDER + CHATML.replace(
    _USER_TURN, "<|im_start|>{{ message['role'] }}\n{{ render(message['content']) }}<|im_end|>"
)

TINY_TEXT = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=4096, rope_theta=1000000.0, rms_norm_eps=1e-6, hidden_act="silu",
    rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, tie_word_embeddings=False,
    use_sliding_window=False, sliding_window=4096, max_window_layers=2, attention_dropout=0.0,
)  # fmt: skip
# window_size 56: windows of 2 x 2 merged patches, so a 4 x 6 merged grid mixes windowed and full attention.
TINY_VISION = dict(
    depth=2, hidden_size=32, intermediate_size=64, num_heads=2, in_chans=3, patch_size=14, spatial_merge_size=2,
    temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1], tokens_per_second=2, hidden_act="silu",
)  # fmt: skip
TINY_MAX_PIXELS = 28 * 28 * 24  # at most 24 image tokens per image

# Qwen2.5-VL-3B-Instruct's config.json (the hub's), for --from-config at real sizes.
QWEN2_5_VL_3B: dict[str, Any] = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
    "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "vision_start_token_id": 151652,
    "vision_end_token_id": 151653, "vision_token_id": 151654, "image_token_id": 151655, "video_token_id": 151656,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 11008,
    "max_position_embeddings": 128000, "max_window_layers": 70, "num_attention_heads": 16, "num_hidden_layers": 36,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
    "vision_config": {
        "depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
        "in_chans": 3, "out_hidden_size": 2048, "patch_size": 14, "spatial_merge_size": 2, "spatial_patch_size": 14,
        "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2,
        "temporal_patch_size": 2,
    },
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vocab_size": 151936,
}  # fmt: skip
REFERENCE_MAX_PIXELS = 12845056  # Qwen2.5-VL's preprocessor_config.json


def build_vl_tokenizer(first_special: int | None = None, vocab_size: int | None = None) -> Any:
    """The causal LM's Qwen tokenizer with the vision tokens after its specials (``vocab_size``: reserved tokens
    fill the ids up to it, the vision tokens last) and :data:`CHAT_TEMPLATE`."""
    from tokenizers import AddedToken

    room = None if vocab_size is None else vocab_size - len(VISION_TOKENS)
    tok = build_tokenizer("qwen3", first_special=first_special, vocab_size=room)
    tok.add_special_tokens(
        {"additional_special_tokens": [AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS]}
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _token_ids(tok: Any) -> dict[str, int]:
    ids = {name: int(tok.convert_tokens_to_ids(t)) for name, t in zip(
        ("vision_start_token_id", "vision_end_token_id", "vision_token_id", "image_token_id", "video_token_id"),
        VISION_TOKENS, strict=True)}  # fmt: skip
    return ids


def preprocessor_config(max_pixels: int, min_pixels: int = 56 * 56) -> dict[str, Any]:
    """Qwen2-VL's image processor settings (transformers' ``AutoImageProcessor`` reads them)."""
    return {
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor",
        "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "do_convert_rgb": True, "resample": 3, "image_mean": list(CLIP_MEAN), "image_std": list(CLIP_STD),
        "min_pixels": min_pixels, "max_pixels": max_pixels, "patch_size": 14, "temporal_patch_size": 2,
        "merge_size": 2,
    }  # fmt: skip


def tiny_config(tok: Any) -> dict[str, Any]:
    """A tiny hub ``config.json`` at ``tok``'s vocabulary and ids."""
    first = int(tok.convert_tokens_to_ids("<|endoftext|>"))
    end = int(tok.convert_tokens_to_ids("<|im_end|>"))
    vision = dict(TINY_VISION, out_hidden_size=TINY_TEXT["hidden_size"])
    return dict(architectures=["Qwen2_5_VLForConditionalGeneration"], model_type="qwen2_5_vl", **TINY_TEXT,
                vocab_size=len(tok), bos_token_id=first, eos_token_id=end, torch_dtype="float32",
                vision_config=vision, **_token_ids(tok))  # fmt: skip


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _write_processor_files(out: Path, tok: Any, max_pixels: int) -> None:
    tok.save_pretrained(str(out))
    _write_json(out / "preprocessor_config.json", preprocessor_config(max_pixels))


def write_tiny_checkpoint(out: str | Path, *, dtype: torch.dtype = torch.float32, seed: int = 0) -> Path:
    """A tiny random Qwen2.5-VL checkpoint in the hub layout; returns its directory."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_vl_tokenizer()
    cfg = tiny_config(tok)
    if dtype != torch.float32:
        cfg["torch_dtype"] = "bfloat16"
    _write_processor_files(out, tok, TINY_MAX_PIXELS)
    _write_json(out / "config.json", cfg)
    _write_json(out / "generation_config.json", generation_config("qwen3", cfg["bos_token_id"]))
    model = random_vl(parse_config(cfg), seed=seed, dtype=dtype, tiny=True)
    write_weights(out, {k: v.contiguous() for k, v in model.state_dict().items()})
    return out


def write_reference_config(out: str | Path) -> Path:
    """``out/config.json``: Qwen2.5-VL-3B-Instruct's (for ``--from-config``); returns ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "config.json", QWEN2_5_VL_3B)
    return out


def write_dummy_checkpoint(
    config_dir: str | Path, out: str | Path, *, dtype: torch.dtype = torch.bfloat16, seed: int = 0, weights: bool = True
) -> Path:
    """Random weights at the sizes of ``config_dir/config.json`` with a full-vocabulary tokenizer; the written
    ``config.json`` names the tokenizer's vision ids. ``weights=False`` writes no weight file
    (``load_format="dummy"``)."""
    src = Path(config_dir)
    cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    parse_config(cfg)
    first, vocab = cfg.get("bos_token_id"), cfg.get("vocab_size")
    if not isinstance(first, int) or not isinstance(vocab, int):
        raise ConfigError(f"{src / 'config.json'}: bos_token_id and vocab_size are needed to lay out tokens")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_vl_tokenizer(first_special=first, vocab_size=vocab)
    cfg = dict(cfg, **_token_ids(tok), eos_token_id=int(tok.convert_tokens_to_ids("<|im_end|>")))
    _write_processor_files(out, tok, REFERENCE_MAX_PIXELS)
    _write_json(out / "config.json", cfg)
    _write_json(out / "generation_config.json", generation_config("qwen3", first))
    if weights:
        model = random_vl(parse_config(cfg), seed=seed, dtype=dtype)
        write_weights(out, {k: v.contiguous() for k, v in model.state_dict().items()})
    return out


def make(args: argparse.Namespace) -> Path:
    """``make-checkpoint --kind vl`` (``omni_stream.make_checkpoint``)."""
    dtype = parse_dtype(args.dtype, "cpu")
    if args.tiny:
        return write_tiny_checkpoint(args.out, dtype=dtype, seed=args.seed)
    return write_dummy_checkpoint(args.from_config, args.out, dtype=dtype, seed=args.seed)
