"""Whisper checkpoints in the hub layout: tiny random ones for tests and the embedded default, real-size dummies.

A checkpoint directory holds what ``openai/whisper-*`` holds: ``config.json`` (``model_type: whisper``),
``model.safetensors``, ``generation_config.json`` (special ids, languages, suppressed tokens), the tokenizer
files and ``preprocessor_config.json`` (the log-mel feature extractor). The tokenizer is a synthetic byte-level
BPE with Whisper's real layout: 50257 regular tokens (50256 for English-only models), then ``<|endoftext|>``,
``<|startoftranscript|>``, one token per language, the task and control tokens and 1501 timestamps, so the
special-token ids and the vocabulary size are the real ones (51865; 51866 with v3's extra language).

``omni-stream make-checkpoint --kind asr --tiny OUT`` writes a tiny model (2 + 2 layers, d_model 64: 0.4 M
parameters besides the 3.3 M of its real-size vocabulary); ``--from-config DIR`` random weights at the sizes of
``DIR/config.json`` (``benchmarks/configs/whisper-*``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from omni_stream.errors import ConfigError
from omni_stream.runtime.cache import embedded_checkpoint_dir
from omni_stream.runtime.weights import parse_dtype

log = logging.getLogger(__name__)

MULTILINGUAL_REGULAR = 50257  # regular (BPE) tokens of multilingual models; English-only models have 50256
N_TIMESTAMPS = 1501  # <|0.00|> .. <|30.00|>
CONTROL_TOKENS = ("<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>",
                  "<|notimestamps|>")  # fmt: skip
EMBEDDED_NAME = "whisper-tiny-random-v1"
# Words the synthetic BPE spells as single tokens (so encoding a prompt gives a few real merges).
COMMON_WORDS = ("Ġthe", "Ġand", "Ġhello", "Ġworld", "Ġthis", "Ġis", "Ġa", "Ġtest", "Ġspeech", "Ġvoice", "Hello")

TINY_SIZES = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                  decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128)  # fmt: skip


def languages() -> tuple[str, ...]:
    """Whisper's language codes in token order (v3 adds the 100th, ``yue``)."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    return tuple(LANGUAGES)


def special_layout(vocab_size: int, multilingual: bool) -> dict[str, Any]:
    """Token ids of the real layout for ``vocab_size``: regular count, eot, sot, language ids, controls."""
    n_regular = MULTILINGUAL_REGULAR if multilingual else MULTILINGUAL_REGULAR - 1
    n_lang = vocab_size - n_regular - 2 - len(CONTROL_TOKENS) - N_TIMESTAMPS
    if not 1 <= n_lang <= len(languages()):
        raise ConfigError(
            f"vocab_size {vocab_size} does not fit Whisper's token layout (expected 51864, 51865 or 51866)"
        )
    eot = n_regular
    langs = {f"<|{code}|>": eot + 2 + i for i, code in enumerate(languages()[:n_lang])}
    first_control = eot + 2 + n_lang
    controls = {name: first_control + i for i, name in enumerate(CONTROL_TOKENS)}
    return {"n_regular": n_regular, "eot": eot, "sot": eot + 1, "lang_to_id": langs, "controls": controls,
            "timestamp_begin": first_control + len(CONTROL_TOKENS)}  # fmt: skip


# -- tokenizer and processor ---------------------------------------------------------------------------------


def _pseudo_words() -> Iterator[str]:
    """``Ġba``, ``Ġbe``, ... then two and three syllables: made-up words after a space (byte-level "Ġ")."""
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    for n in (1, 2, 3):
        for parts in itertools.product(syllables, repeat=n):
            yield "Ġ" + "".join(parts)


def build_tokenizer(vocab_size: int, multilingual: bool = True) -> Any:
    """A ``WhisperTokenizer`` with the real layout (see module docstring)."""
    from tokenizers import AddedToken
    from transformers import WhisperTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    layout = special_layout(vocab_size, multilingual)
    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}  # GPT-2's byte table: " " is "Ġ" = 220
    merges: list[tuple[str, str]] = []
    for word in COMMON_WORDS:
        for i in range(2, len(word) + 1):
            if word[:i] not in vocab:
                merges.append((word[: i - 1], word[i - 1]))
                vocab[word[:i]] = len(vocab)
    # Fillers up to the real size: ids a random model may emit (read as made-up words), never produced by merges.
    fillers = (w for w in _pseudo_words() if w not in vocab)
    for i in range(len(vocab), layout["n_regular"]):
        vocab[next(fillers)] = i
    vocab["<|endoftext|>"] = layout["eot"]
    tok = WhisperTokenizer(vocab=vocab, merges=merges)
    specials = ["<|startoftranscript|>", *layout["lang_to_id"], *CONTROL_TOKENS]
    tok.add_special_tokens(
        {"additional_special_tokens": [AddedToken(t, special=True, normalized=False) for t in specials]}
    )
    tok.add_tokens([AddedToken(f"<|{i * 0.02:.2f}|>", special=False, normalized=False) for i in range(N_TIMESTAMPS)])
    if len(tok) != vocab_size:
        raise ConfigError(f"synthetic Whisper tokenizer has {len(tok)} tokens, expected {vocab_size}")
    return tok


def generation_config(config: dict[str, Any], multilingual: bool = True) -> dict[str, Any]:
    """``generation_config.json`` for a config: the real layout's ids, every language, the usual suppressions."""
    layout = special_layout(int(config["vocab_size"]), multilingual)
    c = layout["controls"]
    # English-only checkpoints name no languages or tasks (generate() would otherwise detect a language).
    languages = (
        {
            "lang_to_id": layout["lang_to_id"],
            "task_to_id": {"translate": c["<|translate|>"], "transcribe": c["<|transcribe|>"]},
        }
        if multilingual
        else {}
    )
    return {
        "decoder_start_token_id": layout["sot"], "bos_token_id": layout["eot"], "eos_token_id": layout["eot"],
        "pad_token_id": layout["eot"], "is_multilingual": multilingual, **languages,
        "no_timestamps_token_id": c["<|notimestamps|>"], "prev_sot_token_id": c["<|startofprev|>"],
        "max_initial_timestamp_index": 50, "max_length": int(config["max_target_positions"]),
        "begin_suppress_tokens": [220, layout["eot"]],
        # The control tokens a transcript never holds (the real lists also name ~80 punctuation-like tokens).
        "suppress_tokens": [layout["sot"], *(c[t] for t in CONTROL_TOKENS[:5])],
        "return_timestamps": False,
    }  # fmt: skip


def tiny_config(multilingual: bool = True, vocab_size: int = 51865) -> dict[str, Any]:
    """``config.json`` of the tiny model: real vocabulary, 30 s window and positions; tiny layers."""
    layout = special_layout(vocab_size, multilingual)
    return {
        "architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper", "vocab_size": vocab_size,
        "num_mel_bins": 80, "max_source_positions": 1500, "max_target_positions": 448, **TINY_SIZES,
        "activation_function": "gelu", "scale_embedding": False, "decoder_start_token_id": layout["sot"],
        "bos_token_id": layout["eot"], "eos_token_id": layout["eot"], "pad_token_id": layout["eot"],
        "begin_suppress_tokens": [220, layout["eot"]], "dropout": 0.0, "attention_dropout": 0.0,
        "activation_dropout": 0.0, "tie_word_embeddings": True,
    }  # fmt: skip


# -- weights ---------------------------------------------------------------------------------------------------


def build_model(config: dict[str, Any], *, device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> Any:
    """An uninitialized ``WhisperForConditionalGeneration`` of ``config``'s sizes (eval mode, sdpa attention)."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    cfg = WhisperConfig(**{k: v for k, v in config.items() if k not in ("architectures", "dtype", "torch_dtype")})
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        model = WhisperForConditionalGeneration(cfg)
    if dtype is not None:
        model = model.to(dtype)  # type: ignore[arg-type]
    return model.eval().requires_grad_(False)


@torch.no_grad()
def randomize(model: Any, *, seed: int = 0, tiny: bool = False) -> None:
    """Random weights, deterministic per seed: linear weights N(0, 1/fan_in), embeddings N(0, 0.02), norms 1,
    biases 0; the encoder's sinusoidal positions stay.

    ``tiny`` widens the spread (linear weights x2, query/key x4, token embeddings N(0, 0.5), jittered norms and
    biases): at unit scale the tiny decoder repeats one token whatever it hears, and parity tests need greedy
    tokens that change from step to step and from input to input.
    """
    params = list(model.named_parameters())
    device = params[0][1].device
    gen = torch.Generator(device=device).manual_seed(seed)

    def normal(shape: tuple[int, ...], std: float) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device) * std

    for name, p in params:
        if name.endswith("encoder.embed_positions.weight"):
            continue
        shape = tuple(p.shape)
        if name.endswith("bias"):
            value = normal(shape, 0.1 if tiny else 0.0)
        elif len(shape) == 1:
            value = 1.0 + normal(shape, 0.1 if tiny else 0.0)
        elif "embed" in name:
            value = normal(shape, (0.5 if "embed_tokens" in name else 1.0) if tiny else 0.02)
        else:
            gain = (4.0 if name.endswith(("q_proj.weight", "k_proj.weight")) else 2.0) if tiny else 1.0
            value = normal(shape, gain / math.sqrt(math.prod(shape[1:])))
        p.copy_(value.to(p.dtype))


# -- writers ---------------------------------------------------------------------------------------------------


def _write(out: Path, config: dict[str, Any], multilingual: bool, dtype: torch.dtype, seed: int, *, tiny: bool,
           weights: bool = True) -> Path:  # fmt: skip
    from transformers import WhisperFeatureExtractor

    out.mkdir(parents=True, exist_ok=True)
    config = dict(config, dtype="bfloat16" if dtype == torch.bfloat16 else "float32")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    gen = generation_config(config, multilingual)
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n", encoding="utf-8")
    build_tokenizer(int(config["vocab_size"]), multilingual).save_pretrained(str(out))
    WhisperFeatureExtractor(feature_size=int(config["num_mel_bins"])).save_pretrained(str(out))
    if weights:
        from safetensors.torch import save_file

        model = build_model(config, dtype=dtype)
        randomize(model, seed=seed, tiny=tiny)
        # proj_out is tied to the token embedding: stored once, as the hub's checkpoints do.
        state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "proj_out.weight"}
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def write_tiny_checkpoint(
    out: str | Path, *, multilingual: bool = True, dtype: torch.dtype = torch.float32, seed: int = 0
) -> Path:
    """A tiny random Whisper in the hub layout (multilingual: language detection works; else English-only)."""
    return _write(Path(out), tiny_config(multilingual, 51865 if multilingual else 51864), multilingual, dtype, seed,
                  tiny=True)  # fmt: skip


def write_dummy_checkpoint(
    config_dir: str | Path, out: str | Path, *, dtype: torch.dtype = torch.bfloat16, seed: int = 0, weights: bool = True
) -> Path:
    """Random weights at the sizes of ``config_dir/config.json`` (``weights=False``: configs and tokenizer only,
    which ``load_format="dummy"`` loads without a weight file)."""
    config = json.loads((Path(config_dir) / "config.json").read_text(encoding="utf-8"))
    if config.get("model_type") != "whisper":
        raise ConfigError(f"{config_dir}/config.json is not a Whisper config (model_type {config.get('model_type')!r})")
    multilingual = int(config["vocab_size"]) != 51864
    return _write(Path(out), config, multilingual, dtype, seed, tiny=False, weights=weights)


def embedded_default_checkpoint(cache_dir: str | Path | None = None) -> Path:
    """The tiny Whisper served when no transcription model is given; built on first use (atomically)."""
    note = "random weights: it transcribes noise"
    return embedded_checkpoint_dir(EMBEDDED_NAME, write_tiny_checkpoint, note, cache_dir)


def make(args: argparse.Namespace) -> Path:
    """``make-checkpoint --kind asr`` (``omni_stream.make_checkpoint``)."""
    dtype = parse_dtype(args.dtype, "cpu")
    if args.tiny:
        if args.size not in (None, "tiny", "tiny.en"):
            raise SystemExit(f"--size must be tiny or tiny.en for --kind asr, got {args.size!r}")
        return write_tiny_checkpoint(args.out, multilingual=args.size != "tiny.en", dtype=dtype, seed=args.seed)
    return write_dummy_checkpoint(args.from_config, args.out, dtype=dtype, seed=args.seed)
