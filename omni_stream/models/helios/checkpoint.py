"""Helios checkpoints in the diffusers layout: loading, random weights at real sizes, tiny ones built offline.

A diffusers checkpoint is a folder with ``model_index.json`` and one subfolder per component (``transformer/``,
``vae/``, ``text_encoder/``, ``tokenizer/``, ``scheduler/``), as ``HeliosPipeline.save_pretrained`` writes it. The
engine reads ``model_index.json``'s ``_class_name`` (``HeliosPipeline``) as the model type.

- :func:`load_pipeline`: the real weights (``load_format`` auto), or random weights at the sizes of the
  components' ``config.json`` files (``dummy``: built directly on the device, in the target dtype; a missing
  ``tokenizer/`` is replaced by the byte-level tokenizer below, which fits any text encoder's vocabulary).
- :func:`write_tiny_checkpoint`: a tiny random Helios (the layout of diffusers' own Helios tests: a 2-layer
  transformer of width 24, a 3-channel Wan VAE, a 2-layer UMT5 encoder, a byte-level BPE tokenizer), about 1 MB.
- ``video_defaults.json`` (optional, ours): the request defaults and limits the checkpoint serves with
  (:class:`~omni_stream.video.spec.VideoInfo` fields); without it, Helios' published defaults apply.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from omni_stream.errors import ConfigError
from omni_stream.runtime.cache import embedded_checkpoint_dir
from omni_stream.runtime.weights import parse_dtype

log = logging.getLogger(__name__)
# mypy reads diffusers' top-level names from its __init__'s TYPE_CHECKING branch, the dummy_pt_objects classes (no
# torch.nn.Module or DiffusionPipeline methods): calls of those methods carry a narrow attr-defined ignore.

DEFAULTS_FILE = "video_defaults.json"
EMBEDDED_NAME = "helios-tiny-v1"
COMPONENTS = ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")

# What the tiny checkpoint serves by default: 2 chunks of 64x64 video in two denoising steps, no guidance.
TINY_DEFAULTS: dict[str, Any] = {
    "default_width": 64,
    "default_height": 64,
    "default_fps": 16,
    "default_num_frames": 66,
    "default_steps": 2,
    "default_guidance": 1.0,
    "max_width": 256,
    "max_height": 256,
    "max_num_frames": 33 * 32,
    "max_steps": 8,
    "max_sequence_length": 64,
}


def read_defaults(path: Path) -> dict[str, Any]:
    """``video_defaults.json`` of a checkpoint (empty when absent); ConfigError when it is not a JSON object."""
    file = path / DEFAULTS_FILE
    if not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {file}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{file} must hold a JSON object")
    return data


def info_fields() -> frozenset[str]:
    from omni_stream.video.spec import VideoInfo

    return frozenset(f.name for f in fields(VideoInfo))


# --- tokenizer ----------------------------------------------------------------------------------------------------


def byte_tokenizer(max_length: int = 512) -> Any:
    """A byte-level BPE without merges (T5 special ids: pad 0, eos 1, unk 2): every text maps to 3 + its bytes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for c in bytes_to_unicode().values():
        vocab[c] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", model_max_length=max_length
    )


@contextmanager
def _progress_bars(show: bool) -> Iterator[None]:
    """diffusers' and transformers' own progress bars on or off for the block (each a process-wide switch)."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    on = [m for m in (diffusers_logging, transformers_logging) if not show and m.is_progress_bar_enabled()]
    for module in on:
        module.disable_progress_bar()
    try:
        yield
    finally:
        for module in on:
            module.enable_progress_bar()


# --- building components --------------------------------------------------------------------------------------------


@contextmanager
def _building(device: str, dtype: torch.dtype) -> Iterator[None]:
    """Construct modules directly on ``device`` in ``dtype`` (random init there: no host copy of real sizes)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


def tiny_components(seed: int = 0) -> dict[str, Any]:
    """The components of a tiny random Helios (CPU, float32), seeded per component."""
    from diffusers import AutoencoderKLWan, HeliosScheduler, HeliosTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    tokenizer = byte_tokenizer()
    torch.manual_seed(seed)
    vae = AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
    )
    torch.manual_seed(seed + 1)
    text_encoder = UMT5EncoderModel(
        UMT5Config(
            vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
            relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
        )
    )  # fmt: skip
    torch.manual_seed(seed + 2)
    transformer = HeliosTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
        text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_dim=(4, 4, 4), has_multi_term_memory_patch=True, guidance_cross_attn=True, zero_history_timestep=True,
        is_amplify_history=False,
    )  # fmt: skip
    scheduler = HeliosScheduler(stage_range=[0, 1], stages=1, use_dynamic_shifting=True)
    return {
        "transformer": transformer.eval(),  # type: ignore[attr-defined]  # a diffusers dummy class to mypy
        "vae": vae.eval(),  # type: ignore[attr-defined]  # a diffusers dummy class to mypy
        "text_encoder": text_encoder.eval(),
        "tokenizer": tokenizer,
        "scheduler": scheduler,
    }


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return data


def random_components(path: Path, device: str, dtype: torch.dtype, seed: int = 0) -> dict[str, Any]:
    """Components at the sizes of ``path``'s config files, random weights, built on ``device`` in ``dtype``."""
    from diffusers import AutoencoderKLWan, HeliosScheduler, HeliosTransformer3DModel
    from transformers import AutoConfig, AutoTokenizer, UMT5EncoderModel

    for name in ("transformer", "vae", "text_encoder", "scheduler"):
        if not (path / name).is_dir():
            raise ConfigError(f"{path} has no {name}/ folder (a diffusers Helios checkpoint needs one)")
    torch.manual_seed(seed)
    with _building(device, dtype):
        transformer = HeliosTransformer3DModel.from_config(_read_json(path / "transformer" / "config.json"))
        vae = AutoencoderKLWan.from_config(_read_json(path / "vae" / "config.json"))
        text_encoder = UMT5EncoderModel(AutoConfig.from_pretrained(path / "text_encoder"))
    scheduler = HeliosScheduler.from_config(_read_json(path / "scheduler" / "scheduler_config.json"))
    if (path / "tokenizer").is_dir():
        tokenizer = AutoTokenizer.from_pretrained(path / "tokenizer")
    else:
        log.warning("%s has no tokenizer/: using a byte-level tokenizer (random weights read no text anyway)", path)
        tokenizer = byte_tokenizer()
    return {
        "transformer": transformer.eval(),
        "vae": vae.eval(),
        "text_encoder": text_encoder.eval(),
        "tokenizer": tokenizer,
        "scheduler": scheduler,
    }


def load_pipeline(path: Path, device: str, dtype: torch.dtype, load_format: str = "auto", progress: bool = True) -> Any:
    """A ``HeliosPipeline`` on ``device``: the checkpoint's weights, or (``dummy``) random ones at its sizes."""
    from diffusers import HeliosPipeline

    if load_format == "dummy":
        pipe = HeliosPipeline(**random_components(path, device, dtype))
    elif load_format in ("auto", "safetensors"):
        try:
            with _progress_bars(progress):
                pipe = HeliosPipeline.from_pretrained(path, dtype=dtype, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot load the Helios checkpoint {path}: {exc}") from exc
        pipe.to(device)
    else:
        raise ConfigError(f"load_format: must be auto, safetensors or dummy, got {load_format!r}")
    pipe.set_progress_bar_config(disable=True)  # type: ignore[attr-defined]  # a diffusers dummy class to mypy
    return pipe


# --- writing --------------------------------------------------------------------------------------------------------


def _save(components: dict[str, Any], out: Path, defaults: dict[str, Any] | None) -> Path:
    from diffusers import HeliosPipeline

    out.mkdir(parents=True, exist_ok=True)
    with _progress_bars(False):
        HeliosPipeline(**components).save_pretrained(out)  # type: ignore[attr-defined]  # a diffusers dummy class to mypy
    if defaults:
        (out / DEFAULTS_FILE).write_text(json.dumps(defaults, indent=2) + "\n")
    return out


def write_tiny_checkpoint(out: Path, seed: int = 0) -> Path:
    """A tiny random Helios in the diffusers layout, with :data:`TINY_DEFAULTS` (CPU-sized requests)."""
    return _save(tiny_components(seed), Path(out), TINY_DEFAULTS)


def write_random_checkpoint(config_dir: Path, out: Path, dtype: torch.dtype, seed: int = 0) -> Path:
    """Random weights at the sizes of ``config_dir``'s configs (CPU; real Helios sizes need ~80 GB of memory)."""
    defaults = read_defaults(config_dir) or None
    return _save(random_components(Path(config_dir), "cpu", dtype, seed), Path(out), defaults)


def make(args: argparse.Namespace) -> Path:
    """``make-checkpoint --kind video`` (:mod:`omni_stream.make_checkpoint`)."""
    if args.tiny:
        return write_tiny_checkpoint(args.out, seed=args.seed)
    dtype = parse_dtype(args.dtype, "cpu")
    return write_random_checkpoint(args.from_config, args.out, dtype, seed=args.seed)


def embedded_default_checkpoint(cache_dir: str | Path | None = None) -> Path:
    """The tiny Helios served when no video model is given; built on first use, atomically, in the user cache."""
    return embedded_checkpoint_dir(
        EMBEDDED_NAME, lambda out: write_tiny_checkpoint(out, seed=0), "random weights: it draws noise", cache_dir
    )
