"""Tiny random-weight diffusers checkpoints (tests, CPU demos, the embedded default), written offline.

``omni-stream make-checkpoint --tiny --kind image-edit OUT`` writes InstructPix2Pix-tiny (64 px, 4 steps, a tiny
autoencoder for previews), ``--kind image-edit-qwen`` Qwen-Image-Edit-tiny (the real architecture at toy sizes;
linear previews), ``--kind image-generation`` Stable-Diffusion-tiny (text to image; edits as img2img: the embedded
default, so that the no-argument server serves both image routes). The layout is the published one
(``model_index.json``, one folder per component, safetensors), plus ``omni_stream.json`` with fast serving
defaults. ``--from-config DIR`` writes random weights at the sizes of a real pipeline directory's component configs
(e.g. ``benchmarks/configs/``). Component sizes follow diffusers' own fast tests.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from omni_stream.errors import ConfigError
from omni_stream.family import LoadOptions
from omni_stream.models.diffusers_image import text_tokenizers
from omni_stream.models.diffusers_image.components import image_only_processor, load_pipeline, save_pipeline
from omni_stream.models.diffusers_image.family import SERVING_FILE
from omni_stream.models.diffusers_image.preview import PREVIEW_DIR
from omni_stream.runtime.cache import embedded_checkpoint_dir
from omni_stream.runtime.weights import parse_dtype

log = logging.getLogger(__name__)

EMBEDDED_NAME = "stable-diffusion-tiny"  # the embedded default: text to image, and edits as img2img


def _clip_parts(unet_in: int) -> dict[str, Any]:
    from diffusers import AutoencoderKL, EulerAncestralDiscreteScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    tokenizer = text_tokenizers.clip_tokenizer()
    unet = UNet2DConditionModel(
        block_out_channels=(16, 32),
        layers_per_block=1,
        sample_size=8,
        in_channels=unet_in,
        out_channels=4,
        norm_num_groups=8,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
    )
    vae = AutoencoderKL(  # four blocks: the real 8x downsampling, at 8 channels
        block_out_channels=[8, 8, 16, 16],
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4,
        latent_channels=4,
        norm_num_groups=8,
        layers_per_block=1,
        sample_size=64,
    )
    text_config = CLIPTextConfig(
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
        hidden_size=32,
        intermediate_size=37,
        num_attention_heads=4,
        num_hidden_layers=2,
        vocab_size=len(tokenizer),
        max_position_embeddings=77,
    )
    scheduler = EulerAncestralDiscreteScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1
    )
    return {
        "vae": vae,
        "text_encoder": CLIPTextModel(text_config),
        "tokenizer": tokenizer,
        "unet": unet,
        "scheduler": scheduler,
        "safety_checker": None,
        "feature_extractor": None,
        "image_encoder": None,
        "requires_safety_checker": False,
    }


def _tiny_autoencoder() -> Any:
    from diffusers import AutoencoderTiny

    return AutoencoderTiny(
        encoder_block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8, 8),
        num_encoder_blocks=(1, 1, 1, 1),
        num_decoder_blocks=(1, 1, 1, 1),
        latent_channels=4,
        upsampling_scaling_factor=2,
    )


def _pix2pix() -> tuple[Any, Any | None, dict[str, Any]]:
    from diffusers import StableDiffusionInstructPix2PixPipeline

    pipe = StableDiffusionInstructPix2PixPipeline(**_clip_parts(unet_in=8))
    return pipe, _tiny_autoencoder(), {"model_name": "instruct-pix2pix-tiny", "default_steps": 4, "max_side": 512}


def _stable_diffusion() -> tuple[Any, Any | None, dict[str, Any]]:
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline(**_clip_parts(unet_in=4))
    return pipe, _tiny_autoencoder(), {"model_name": EMBEDDED_NAME, "default_steps": 4, "max_side": 512}


def _qwen_image_edit() -> tuple[Any, Any | None, dict[str, Any]]:
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageEditPipeline
    from diffusers import QwenImageTransformer2DModel as Transformer
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = text_tokenizers.qwen_tokenizer()
    ids = dict(
        zip(
            text_tokenizers.QWEN_SPECIALS,
            tokenizer.convert_tokens_to_ids(list(text_tokenizers.QWEN_SPECIALS)),
            strict=True,
        )
    )
    transformer = Transformer(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=3,
        joint_attention_dim=16,
        guidance_embeds=False,
        axes_dims_rope=(8, 4, 4),
    )
    z_dim = 4
    vae = AutoencoderKLQwenImage(
        base_dim=z_dim * 6,
        z_dim=z_dim,
        dim_mult=[1, 2, 4],
        num_res_blocks=1,
        temperal_downsample=[False, True],
        latents_mean=[0.0] * z_dim,
        latents_std=[1.0] * z_dim,
    )
    fields: dict[str, Any] = dict(
        text_config={
            "hidden_size": 16,
            "intermediate_size": 16,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
            "rope_theta": 1000000.0,
            "vocab_size": len(tokenizer),
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
        },
        vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 16},
        hidden_size=16,
        vocab_size=len(tokenizer),
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
    )
    config = Qwen2_5_VLConfig(**fields)
    pipe = QwenImageEditPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=Qwen2_5_VLForConditionalGeneration(config),
        tokenizer=tokenizer,
        processor=image_only_processor(Qwen2VLImageProcessorPil(), tokenizer),
        transformer=transformer,
    )
    defaults = {"model_name": "qwen-image-edit-tiny", "default_steps": 4, "default_guidance": 1.0, "max_side": 256}
    return pipe, None, defaults


TINY: dict[str, Callable[[], tuple[Any, Any | None, dict[str, Any]]]] = {
    "image-edit": _pix2pix,
    "image-edit-qwen": _qwen_image_edit,
    "image-generation": _stable_diffusion,
}


def write_tiny_checkpoint(out: str | Path, kind: str = "image-edit", *, seed: int = 0) -> Path:
    """Write a tiny random-weight pipeline of ``kind`` (see :data:`TINY`) into ``out``."""
    if kind not in TINY:
        raise ConfigError(f"kind must be one of {', '.join(TINY)}, got {kind!r}")
    torch.manual_seed(seed)
    pipe, preview, defaults = TINY[kind]()
    out = save_pipeline(pipe, Path(out))
    if preview is not None:
        preview.save_pretrained(out / PREVIEW_DIR, safe_serialization=True)
    (out / SERVING_FILE).write_text(json.dumps(defaults, indent=2) + "\n")
    return out


def write_dummy_checkpoint(config_dir: str | Path, out: str | Path, *, dtype: torch.dtype = torch.float32) -> Path:
    """Random weights at the sizes of ``config_dir``'s component configs, written in the same layout."""
    config_dir, out = Path(config_dir), Path(out)
    options = LoadOptions(load_format="dummy", progress=True)
    pipe = load_pipeline(config_dir, options, dtype)
    save_pipeline(pipe, out)
    for extra in (SERVING_FILE,):
        if (config_dir / extra).is_file():
            shutil.copy(config_dir / extra, out / extra)
    return out


def embedded_default_checkpoint(cache_dir: str | Path | None = None) -> Path:
    """The tiny Stable Diffusion served when no image model is given, built on first use (atomically): one image
    model serves both routes, text to image (``/v1/images/generations``) and edits as img2img."""
    note = "random weights: it paints noise"
    return embedded_checkpoint_dir(
        EMBEDDED_NAME, lambda out: write_tiny_checkpoint(out, "image-generation"), note, cache_dir
    )


def make(args: argparse.Namespace) -> Path:
    """``make-checkpoint`` for the image kinds (``omni_stream.make_checkpoint``)."""
    if args.tiny:
        return write_tiny_checkpoint(args.out, args.kind, seed=args.seed)
    dtype = parse_dtype(args.dtype, "cpu")
    return write_dummy_checkpoint(args.from_config, args.out, dtype=dtype)
