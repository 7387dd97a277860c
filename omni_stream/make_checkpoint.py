"""``omni-stream make-checkpoint``: write a random-weight checkpoint of any kind, in its family's real layout.

``--tiny`` writes a small random model (tests, CPU demos, the embedded defaults); ``--from-config DIR`` writes
random weights at the sizes of a real ``config.json`` (benchmarks). Each ``--kind`` belongs to one family, whose
declaration names the writer (``writer(args) -> Path``; :func:`omni_stream.family_registry.checkpoint_writers`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from omni_stream.family_registry import checkpoint_writer, checkpoint_writers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", type=Path, help="output directory")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--tiny", action="store_true", help="tiny random model (tests, CPU demos)")
    src.add_argument("--from-config", type=Path, metavar="DIR", help="random weights at the sizes of DIR/config.json")
    parser.add_argument(
        "--kind",
        choices=sorted(checkpoint_writers()),
        default="custom_voice",
        help="what to write (default %(default)s)",
    )
    parser.add_argument(
        "--size", default=None, help="shape of a tiny model, where the kind has several (e.g. 0.6b, 1.7b)"
    )
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16"), default="float32", help="weight dtype (default float32)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")


def run(args: argparse.Namespace) -> int:
    """Write the checkpoint into a fresh directory beside ``out``, then move it into place: a writer that fails
    (a config of another family, a full disk) leaves nothing behind, and ``out`` is never a mix of two checkpoints
    (an ``out`` that exists must be empty)."""
    import shutil
    import sys
    import tempfile

    from omni_stream.errors import ConfigError

    out: Path = args.out.expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        what = "a file" if not out.is_dir() else "a directory that is not empty"
        print(f"omni-stream make-checkpoint: {out} is {what}: give a new directory", file=sys.stderr)
        return 2
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    except OSError as exc:
        print(f"omni-stream make-checkpoint: cannot write in {out.parent}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    try:
        written = Path(checkpoint_writer(args.kind)(argparse.Namespace(**{**vars(args), "out": work})))
        if out.exists():
            out.rmdir()  # empty, checked above
        work.rename(out)
    except (ConfigError, OSError, ValueError) as exc:
        shutil.rmtree(work, ignore_errors=True)
        print(f"omni-stream make-checkpoint: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError | ValueError) else 1
    path = out / written.relative_to(work) if written.is_relative_to(work) else written
    print(f"wrote {path}")
    return 0
