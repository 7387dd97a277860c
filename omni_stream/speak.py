"""`omni-stream speak`: synthesize text to an audio file through the streaming engine."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from omni_stream.cli import add_tuning_arguments, torch_threads, tuning_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", help="text to speak (- reads it from standard input)")
    parser.add_argument("-o", "--output", type=Path, default=Path("out.wav"), help="output file (default out.wav)")
    parser.add_argument("--model", default=None, help="checkpoint directory (default: the embedded tiny checkpoint)")
    parser.add_argument(
        "--voice", default=None, help="speaker name (CustomVoice checkpoints; default: the model's first voice)"
    )
    parser.add_argument("--language", default="Auto", help="language name or Auto (default Auto)")
    parser.add_argument("--instructions", default=None, help="style instructions (VoiceDesign requires them)")
    parser.add_argument("--task-type", default=None, choices=["CustomVoice", "VoiceDesign", "Base"])
    parser.add_argument("--ref-audio", type=Path, default=None, help="reference audio file (Base cloning)")
    parser.add_argument("--ref-text", default=None, help="transcript of --ref-audio (in-context cloning)")
    parser.add_argument(
        "--x-vector-only",
        action="store_true",
        help="clone from --ref-audio's speaker embedding alone, without its transcript",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="maximum codec frames, 80 ms each (default: 25 + 3 per character of text, at most 4096)",
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: float32 on CPU)")
    add_tuning_arguments(parser)


class ArgumentError(Exception):
    """A file argument this command cannot use (refused before the model loads)."""


# What a request's field is called on this command line (the engine names the request's field, or the wire's).
FLAGS = {"input": "the text", "text": "the text", "x_vector_only_mode": "--x-vector-only"}


def check_output(path: Path) -> None:
    """ArgumentError unless ``path`` is a file soundfile can write 16-bit PCM to (by its extension), in a directory
    that exists: checked before any synthesis, not after it."""
    import soundfile as sf

    fmt = path.suffix.lstrip(".").upper()
    if not fmt or fmt not in sf.available_formats() or not sf.check_format(fmt, "PCM_16"):
        writable = sorted(f.lower() for f in sf.available_formats() if sf.check_format(f, "PCM_16"))
        known = ", ".join(writable)
        raise ArgumentError(f"-o {path}: the file's extension names no 16-bit PCM format (one of: {known})")
    if not path.resolve().parent.is_dir():
        raise ArgumentError(f"-o {path}: the directory {path.parent} does not exist")


def read_reference(path: Path) -> tuple[np.ndarray, int]:
    """``--ref-audio`` as float32 mono samples and their rate (blocking: file I/O)."""
    import soundfile as sf

    if not path.is_file():  # libsndfile says only "System error."
        raise ArgumentError(f"--ref-audio {path}: " + ("not a file" if path.exists() else "no such file"))
    try:
        data, rate = sf.read(str(path), dtype="float32")
    except (sf.LibsndfileError, OSError) as exc:
        raise ArgumentError(f"--ref-audio {path}: cannot read it as audio ({exc})") from None
    return (data.mean(axis=1).astype(np.float32) if data.ndim == 2 else data), int(rate)


async def _speak(args: argparse.Namespace) -> int:
    from omni_stream.engine import AsyncEngine, ModelSource
    from omni_stream.family import ModelKind
    from omni_stream.requests import GREEDY, SpeechRequest, TaskType

    check_output(args.output)
    ref_audio = None
    ref_rate = 24000
    if args.ref_audio is not None:
        ref_audio, ref_rate = await anyio.to_thread.run_sync(read_reference, args.ref_audio)
    sampling = GREEDY if args.greedy else None  # None: the checkpoint's generation defaults
    request = SpeechRequest(
        text=args.text,
        voice=args.voice,
        task_type=TaskType(args.task_type) if args.task_type else None,
        language=args.language,
        instructions=args.instructions,
        ref_audio=ref_audio,
        ref_sample_rate=ref_rate,
        ref_text=args.ref_text,
        x_vector_only_mode=args.x_vector_only,
        max_new_tokens=args.max_new_tokens,
        sampling=sampling,
        seed=args.seed,
    )
    # Without --model only the embedded speech model: speaking needs no other default (a video model, ...).
    model = ModelSource(Path(args.model)) if args.model else ModelSource(kind=ModelKind.SPEECH)
    tuning = tuning_from_args(args)
    async with await AsyncEngine.load({"model": model}, device=args.device, dtype=args.dtype, tuning=tuning) as engine:
        pieces: list[np.ndarray] = []
        if sampling is not None:  # --greedy: the family's own samplers too (Qwen3-TTS: the code predictor's)
            request = dataclasses.replace(request, options=with_samplers(engine.speech_info.options, sampling))
        async with engine.speech(request) as stream:
            async for audio in stream:
                pieces.append(audio.samples)
            timings = stream.timings
        wav = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        rate = engine.speech_info.sample_rate
        threads = await engine.worker.submit(torch_threads)  # as the device worker's thread sees it

    import soundfile as sf

    await anyio.to_thread.run_sync(lambda: sf.write(str(args.output), wav, rate, subtype="PCM_16"))
    ttfa = timings.ttfa
    elapsed = (timings.finished or time.perf_counter()) - timings.created
    print(
        f"wrote {args.output}: {len(wav) / rate:.2f} s of audio at {rate} Hz"
        + (f", first audio after {ttfa * 1000:.0f} ms" if ttfa is not None else "")
        + f", {elapsed:.2f} s total, {threads} torch threads",
        file=sys.stderr,
    )
    return 0


def with_samplers(options: type | None, sampling: Any) -> object | None:
    """The family's options type (``SpeechInfo.options``) with every sampler field it has set to ``sampling``."""
    if options is None:
        return None
    samplers = {f.name: sampling for f in dataclasses.fields(options) if "SamplingParams" in str(f.type)}
    return options(**samplers) if samplers else None


def run(args: argparse.Namespace) -> int:
    from omni_stream.errors import OmniStreamError

    if args.text == "-":  # before the event loop starts: a blocking read of the whole input
        args.text = sys.stdin.read()
    try:
        return anyio.run(_speak, args)
    except OmniStreamError as exc:
        param = getattr(exc, "param", None)
        where = FLAGS.get(param, f"--{param.replace('_', '-')}") if param else None
        print(f"omni-stream speak: {exc}" + (f" ({where})" if where else ""), file=sys.stderr)
        return 2
    except ArgumentError as exc:  # the output file or the reference, refused before the model is loaded
        print(f"omni-stream speak: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"omni-stream speak: {exc}", file=sys.stderr)
        return 1
