"""Checkpoints in the hub layout: loading, real-size dummy builds, and tiny random checkpoints for tests.

``omni-stream make-checkpoint --tiny --kind custom_voice OUT`` writes a small random-weight checkpoint
with the real token ids, codec vocabulary (3072 / 16 x 2048) and text vocabulary size (151936), a
synthetic Qwen2-style byte-level BPE tokenizer with the real special-token ids, and ``speech_tokenizer/``.
``--from-config DIR`` writes random weights at the sizes of a real ``config.json`` instead.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from omni_stream.errors import ConfigError
from omni_stream.models.qwen3_tts.config import Qwen3TTSConfig, load_config, parse_config
from omni_stream.models.qwen3_tts.talker import Qwen3TTSLM
from omni_stream.runtime.weights import init_dummy, load_safetensors, parse_dtype, safetensors_files

KINDS = ("custom_voice", "voice_design", "base")
SIZES = ("0.6b", "1.7b")

LANGUAGE_IDS = {
    "chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071, "spanish": 2054,
    "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069, "beijing_dialect": 2074,
    "sichuan_dialect": 2062,
}  # fmt: skip
SPEAKER_IDS = {
    "vivian": 3065, "serena": 3066, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861, "ono_anna": 2873,
    "sohee": 2864, "eric": 2875, "dylan": 2878,
}  # fmt: skip
SPEAKER_DIALECTS: dict[str, str | bool] = {name: False for name in SPEAKER_IDS}
SPEAKER_DIALECTS.update(eric="sichuan_dialect", dylan="beijing_dialect")
GENERATION_CONFIG = {
    "do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0, "top_k": 50,
    "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_p": 1.0, "subtalker_top_k": 50,
    "max_new_tokens": 8192,
}  # fmt: skip
SPECIAL_TOKENS = {
    151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>", 151646: "<|object_ref_start|>",
    151647: "<|object_ref_end|>", 151648: "<|box_start|>", 151649: "<|box_end|>", 151650: "<|quad_start|>",
    151651: "<|quad_end|>", 151652: "<|vision_start|>", 151653: "<|vision_end|>", 151654: "<|vision_pad|>",
    151655: "<|image_pad|>", 151656: "<|video_pad|>", 151657: "<tool_call>", 151658: "</tool_call>",
    151659: "<|fim_prefix|>", 151660: "<|fim_middle|>", 151661: "<|fim_suffix|>", 151662: "<|fim_pad|>",
    151663: "<|repo_name|>", 151664: "<|file_sep|>", 151665: "<tool_response>", 151666: "</tool_response>",
    151667: "<think>", 151668: "</think>", 151669: "<|audio_start|>", 151670: "<|audio_end|>",
    151671: "<|tts_pad|>", 151672: "<|tts_bos|>", 151673: "<|tts_eos|>",
}  # fmt: skip
FIRST_SPECIAL = 151643
# Words that must be single tokens at their real Qwen2 ids: the reference slices prompts by position.
FIXED_WORDS = {"assistant": 77091, "user": 872}
COMMON_WORDS = (
    "Hello", "ĠHello", "Ġworld", "Ġthe", "Ġis", "Ġa", "Ġof", "Ġand", "Ġto", "Ġspeech", "Ġvoice", "Ġtest",
    "Ġspeak", "Ġslowly", "Ġcalm", "Ġhappy", "Ġwarm", "Ġdeep", "Ġmale", "Ġfemale", "The", "This", "Good",
)  # fmt: skip


def hub_config(kind: str, size: str = "0.6b", *, tiny: bool = True) -> dict[str, Any]:
    """A hub-style ``config.json`` dict: real ids and vocabularies; tiny or real layer sizes."""
    if kind not in KINDS:
        raise ConfigError(f"kind must be one of {KINDS}, got {kind!r}")
    if size not in SIZES:
        raise ConfigError(f"size must be one of {SIZES}, got {size!r}")
    big = size == "1.7b"
    if tiny:
        hidden, inter, layers, heads, kv, hd, text_hidden = (96 if big else 64), 128, 2, 4, 2, 16, 32
        cp = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16)  # fmt: skip
        section, max_pos = [2, 3, 3], 4096
    else:
        hidden, inter = (2048, 6144) if big else (1024, 3072)
        layers, heads, kv, hd, text_hidden = 28, 16, 8, 128, 2048
        cp = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=5, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128)  # fmt: skip
        section, max_pos = [24, 20, 20], 32768
    talker = dict(
        vocab_size=3072, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd, text_vocab_size=151936,
        text_hidden_size=text_hidden, num_code_groups=16, max_position_embeddings=max_pos, rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        rope_scaling={"mrope_section": section, "interleaved": True, "rope_type": "default", "type": "default"},
        hidden_act="silu", attention_bias=False, use_sliding_window=False, sliding_window=None,
        codec_bos_id=2149, codec_eos_token_id=2150, codec_pad_id=2148, codec_think_id=2154, codec_nothink_id=2155,
        codec_think_bos_id=2156, codec_think_eos_id=2157, codec_language_id=dict(LANGUAGE_IDS),
        spk_id=dict(SPEAKER_IDS) if kind == "custom_voice" else {},
        spk_is_dialect=dict(SPEAKER_DIALECTS) if kind == "custom_voice" else {},
        code_predictor_config=dict(
            vocab_size=2048, num_code_groups=16, max_position_embeddings=65536, rms_norm_eps=1e-6,
            rope_theta=1000000.0, rope_scaling=None, hidden_act="silu", attention_bias=False,
            use_sliding_window=False, **cp,
        ),
    )  # fmt: skip
    cfg: dict[str, Any] = dict(
        architectures=["Qwen3TTSForConditionalGeneration"], model_type="qwen3_tts", talker_config=talker,
        tokenizer_type="qwen3_tts_tokenizer_12hz", tts_model_size="1b7" if big else "0b6", tts_model_type=kind,
        im_start_token_id=151644, im_end_token_id=151645, tts_pad_token_id=151671, tts_bos_token_id=151672,
        tts_eos_token_id=151673, transformers_version="4.57.3",
    )  # fmt: skip
    if kind == "base":
        cfg["speaker_encoder_config"] = _speaker_encoder_config(hidden, tiny)
    return cfg


def _speaker_encoder_config(enc_dim: int, tiny: bool) -> dict[str, Any]:
    if tiny:
        from omni_stream.models.qwen3_tts.codec_checkpoint import tiny_speaker_encoder_config

        return tiny_speaker_encoder_config(enc_dim)
    return dict(
        mel_dim=128, enc_dim=enc_dim, enc_channels=[512, 512, 512, 512, 1536], enc_kernel_sizes=[5, 3, 3, 3, 1],
        enc_dilations=[1, 2, 3, 4, 1], enc_attention_channels=128, enc_res2net_scale=8, enc_se_channels=128,
        sample_rate=24000,
    )  # fmt: skip


# -- building and loading ---------------------------------------------------------------------------------


def build_lm(cfg: Qwen3TTSConfig, device: torch.device | str = "meta") -> Qwen3TTSLM:
    """The module tree without weights (``meta``: no memory, for parameter counts and dummy loads)."""
    with torch.device(device):
        return Qwen3TTSLM(cfg)


def _fix_buffers(lm: Qwen3TTSLM, device: torch.device | str) -> None:
    # Rotary tables are not stored in checkpoints; rebuild them where the weights now live.
    for mod in lm.modules():
        if hasattr(mod, "inv_freq") and mod.inv_freq.device.type == "meta":
            d = mod.inv_freq.numel() * 2
            theta_src = lm.config.talker.decoder if mod is lm.talker.model.rotary else lm.config.code_predictor
            inv = 1.0 / (theta_src.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
            mod.inv_freq = inv.to(device)


def load_lm(
    model_dir: str | Path,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    load_format: str = "auto",
    seed: int = 0,
) -> Qwen3TTSLM:
    """Talker + code predictor from ``model_dir`` (``load_format`` auto|safetensors|dummy; dummy reads no weights)."""
    cfg = load_config(model_dir)
    lm = build_lm(cfg, "meta")
    if load_format == "dummy":
        init_dummy(lm, seed=seed, dtype=dtype or torch.bfloat16, device=device)
    elif load_format in ("auto", "safetensors"):
        load_safetensors(
            lm, safetensors_files(model_dir), dtype=dtype, device=device, ignore_prefixes=("speaker_encoder.",)
        )
    else:
        raise ConfigError(f"load_format must be auto, safetensors or dummy, got {load_format!r}")
    _fix_buffers(lm, device)
    return lm.eval()


# -- synthetic tokenizer ------------------------------------------------------------------------------------


def write_tokenizer(out_dir: Path) -> None:
    """A Qwen2-style byte-level BPE with the real special-token ids and ``assistant``/``user``/``\\n`` ids."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_chars = list(bytes_to_unicode().values())  # GPT-2 order: "\n" ("Ċ") lands on id 198 as in Qwen2
    vocab: dict[str, int] = {c: i for i, c in enumerate(byte_chars)}
    merges: list[tuple[str, str]] = []
    reserved = set(FIXED_WORDS.values())
    next_id = len(vocab)

    def add(token: str, fixed: int | None = None) -> None:
        nonlocal next_id
        if token in vocab:
            return
        if fixed is not None:
            vocab[token] = fixed
            return
        while next_id in reserved:
            next_id += 1
        vocab[token] = next_id
        next_id += 1

    for word in (*FIXED_WORDS, *COMMON_WORDS):
        for i in range(2, len(word) + 1):
            pair = (word[: i - 1], word[i - 1])
            if pair not in merges:
                merges.append(pair)
            add(word[:i], FIXED_WORDS.get(word) if i == len(word) else None)
    used = set(vocab.values())
    for i in range(FIRST_SPECIAL):
        if i not in used:
            vocab[f"<unused_{i}>"] = i
    out_dir.mkdir(parents=True, exist_ok=True)
    ordered = dict(sorted(vocab.items(), key=lambda kv: kv[1]))
    (out_dir / "vocab.json").write_text(json.dumps(ordered, ensure_ascii=False), encoding="utf-8")
    (out_dir / "merges.txt").write_text("#version: 0.2\n" + "\n".join(f"{a} {b}" for a, b in merges) + "\n", "utf-8")
    added = {
        str(i): {"content": tok, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                 "special": True}
        for i, tok in SPECIAL_TOKENS.items()
    }  # fmt: skip
    tok_cfg = {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "bos_token": None,
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
        "model_max_length": 131072, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }  # fmt: skip
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2), encoding="utf-8")


# -- writers --------------------------------------------------------------------------------------------------


def _write_common(out: Path, cfg_dict: dict[str, Any], dtype: torch.dtype) -> None:
    out.mkdir(parents=True, exist_ok=True)
    dtype_name = "bfloat16" if dtype == torch.bfloat16 else "float32"
    (out / "config.json").write_text(json.dumps(dict(cfg_dict, dtype=dtype_name), indent=2), encoding="utf-8")
    (out / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2), encoding="utf-8")
    preprocessor = {"padding_side": "left", "padding_value": 0.0, "processor_class": "Qwen3TTSProcessor",
                    "return_attention_mask": True}  # fmt: skip
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2), encoding="utf-8")
    write_tokenizer(out)


def _write_weights(out: Path, cfg_dict: dict[str, Any], dtype: torch.dtype, seed: int, tiny: bool) -> None:
    cfg = parse_config(cfg_dict)
    lm = build_lm(cfg, "meta")
    if tiny:
        # Large embeddings and jittered norms make the tiny model's output depend on its input (speaker,
        # language, text), so parity tests can tell prompts apart.
        init_dummy(lm, seed=seed, dtype=dtype, embedding_std=1.0, norm_jitter=0.1, bias_std=0.1)
    else:
        init_dummy(lm, seed=seed, dtype=dtype)
    state = {k: v.contiguous() for k, v in lm.state_dict().items()}
    if cfg.tts_model_type == "base":
        from omni_stream.models.qwen3_tts.codec_checkpoint import random_speaker_encoder_state

        assert cfg.speaker_encoder is not None
        spk = random_speaker_encoder_state(dict(cfg.speaker_encoder), seed)
        state.update({k: v.to(dtype).contiguous() for k, v in spk.items()})
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})


def write_tiny_checkpoint(
    out: str | Path,
    kind: str = "custom_voice",
    size: str = "0.6b",
    *,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    speech_tokenizer: bool = True,
) -> Path:
    """Write a tiny random-weight checkpoint in the hub layout; returns its directory."""
    out = Path(out)
    cfg_dict = hub_config(kind, size, tiny=True)
    _write_common(out, cfg_dict, dtype)
    _write_weights(out, cfg_dict, dtype, seed, tiny=True)
    if speech_tokenizer:
        from omni_stream.models.qwen3_tts.codec_checkpoint import write_tiny_speech_tokenizer

        write_tiny_speech_tokenizer(out, seed=seed)
    return out


def write_dummy_checkpoint(
    config_dir: str | Path, out: str | Path, *, dtype: torch.dtype, seed: int = 0, weights: bool = True
) -> Path:
    """Random weights at the sizes of ``config_dir/config.json``, plus the real speech-tokenizer config.

    The directory loads end to end with ``load_format="dummy"`` (which reads no weight file, so
    ``weights=False`` skips writing ``model.safetensors``); ``speech_tokenizer/`` holds configs only.
    """
    from omni_stream.models.qwen3_tts.codec_checkpoint import _PREPROCESSOR, real_speech_tokenizer_config

    out = Path(out)
    cfg_dict = json.loads((Path(config_dir) / "config.json").read_text(encoding="utf-8"))
    cfg_dict.pop("dtype", None)
    _write_common(out, cfg_dict, dtype)
    if weights:
        _write_weights(out, cfg_dict, dtype, seed, tiny=False)
    codec_dir = out / "speech_tokenizer"
    codec_dir.mkdir(parents=True, exist_ok=True)
    codec = dict(real_speech_tokenizer_config(), dtype="float32")
    (codec_dir / "config.json").write_text(json.dumps(codec, indent=2) + "\n", encoding="utf-8")
    (codec_dir / "preprocessor_config.json").write_text(json.dumps(_PREPROCESSOR, indent=2) + "\n", encoding="utf-8")
    return out


# -- CLI ---------------------------------------------------------------------------------------------------------


def make(args: argparse.Namespace) -> Path:
    """``make-checkpoint`` for the speech kinds (``omni_stream.make_checkpoint``)."""
    dtype = parse_dtype(args.dtype, "cpu")
    if args.tiny:
        size = args.size or "0.6b"
        if size not in SIZES:
            raise SystemExit(f"--size must be one of {', '.join(SIZES)} for {args.kind}, got {size!r}")
        return write_tiny_checkpoint(args.out, args.kind, size, dtype=dtype, seed=args.seed)
    return write_dummy_checkpoint(args.from_config, args.out, dtype=dtype, seed=args.seed)
