"""``omni-stream make-checkpoint``: write a random-weight checkpoint of any kind, in its family's real layout.

``--tiny`` writes a small random model (tests, CPU demos, the embedded defaults); ``--from-config DIR`` writes
random weights at the sizes of a real ``config.json`` (benchmarks). Each ``--kind`` belongs to one family, whose
``make(args) -> Path`` does the writing; a family adds its kinds with one line below.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

# kind -> "module:function" taking the parsed arguments and returning the written directory
WRITERS: dict[str, str] = {
    "custom_voice": "omni_stream.models.qwen3_tts.checkpoint:make",
    "voice_design": "omni_stream.models.qwen3_tts.checkpoint:make",
    "base": "omni_stream.models.qwen3_tts.checkpoint:make",
    "chat": "omni_stream.models.causal_lm.checkpoint:make",
    "chat-llama": "omni_stream.models.causal_lm.checkpoint:make",
    "asr": "omni_stream.models.whisper.checkpoint:make",
    "image-edit": "omni_stream.models.diffusers_image.checkpoint:make",
    "image-edit-qwen": "omni_stream.models.diffusers_image.checkpoint:make",
    "image-generation": "omni_stream.models.diffusers_image.checkpoint:make",
    "video": "omni_stream.models.helios.checkpoint:make",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", type=Path, help="output directory")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--tiny", action="store_true", help="tiny random model (tests, CPU demos)")
    src.add_argument("--from-config", type=Path, metavar="DIR", help="random weights at the sizes of DIR/config.json")
    parser.add_argument(
        "--kind", choices=sorted(WRITERS), default="custom_voice", help="what to write (default %(default)s)"
    )
    parser.add_argument(
        "--size", default=None, help="shape of a tiny model, where the kind has several (e.g. 0.6b, 1.7b)"
    )
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16"), default="float32", help="weight dtype (default float32)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")


def run(args: argparse.Namespace) -> int:
    module, _, name = WRITERS[args.kind].partition(":")
    make = getattr(importlib.import_module(module), name)
    path = make(args)
    print(f"wrote {path}")
    return 0
