"""`omni-stream` command line: serve | speak | make-checkpoint.

Each subcommand's arguments and body live with the layer that owns them; this module only dispatches.
`serve` belongs to the serving layer, which sits above the engine: it is resolved by name at run time
so that importing the engine never imports the serving layer.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omni_stream.runtime.settings import Tuning


def positive_int(value: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}")
    return n


def add_tuning_arguments(parser: argparse.ArgumentParser) -> None:
    """``--threads N`` and ``--tune NAME=VALUE``: the process switches (shared by ``serve`` and ``speak``), over the
    environment's ``OMNI_STREAM_*`` variables."""
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="torch intra-op threads for model work (default: $OMNI_STREAM_THREADS, else every core but one)",
    )
    parser.add_argument(
        "--tune",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a tuning switch by its field name, e.g. step_ahead=off (may repeat; over its OMNI_STREAM_* "
        "variable; the README's environment-variable table lists them)",
    )


def tuning_from_args(args: argparse.Namespace) -> Tuning:
    """The process switches: the environment, then ``--tune``, then ``--threads``; SystemExit naming a bad one."""
    from omni_stream.errors import ConfigError
    from omni_stream.runtime.settings import Tuning

    try:
        tuning = Tuning.from_env().with_assignments(getattr(args, "tune", None) or ())
    except ConfigError as exc:
        raise SystemExit(f"omni-stream: {exc}") from None
    threads = getattr(args, "threads", None)
    return tuning if threads is None else replace(tuning, threads=threads)


def torch_threads() -> int:
    """torch's intra-op thread count as the calling thread sees it (run it on the device worker)."""
    import torch

    return torch.get_num_threads()


# subcommand -> module exposing `add_arguments(parser)` and `run(args) -> int`
_COMMANDS = {
    "serve": (
        "omni_stream.realtime.server",
        "Serve the HTTP/WebSocket API (without --model and --llm: every kind's embedded tiny model).",
    ),
    "speak": ("omni_stream.speak", "Synthesize text to an audio file."),
    "make-checkpoint": ("omni_stream.make_checkpoint", "Write a random-weight checkpoint (hub layout)."),
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="omni-stream", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    module = None
    for name, (module_name, help_text) in _COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            # Only the chosen subcommand is imported: `--help` stays fast, and a broken install fails loudly here.
            module = importlib.import_module(module_name)
            module.add_arguments(p)
    if not argv:  # a bare `omni-stream`: the commands and what each does, not only "a command is required"
        parser.print_help(sys.stderr)
        return 2
    args = parser.parse_args(argv)
    assert module is not None  # parse_args exits on an unknown command
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
