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

# subcommand -> module exposing `add_arguments(parser)` and `run(args) -> int`
_COMMANDS = {
    "serve": (
        "omni_stream.realtime.server",
        "Serve the HTTP/WebSocket API (embedded tiny checkpoint without --model).",
    ),
    "speak": ("omni_stream.speak", "Synthesize text to an audio file."),
    "make-checkpoint": ("omni_stream.models.qwen3_tts.checkpoint", "Write a random-weight checkpoint (hub layout)."),
}


def _load(module: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            return None
        raise


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omni-stream", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, (module, help_text) in _COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod = _load(module)
        if mod is not None:
            mod.add_arguments(p)
        modules[name] = mod
    args = parser.parse_args(argv)
    mod = modules[args.command]
    if mod is None:
        print(f"omni-stream {args.command}: not available in this installation", file=sys.stderr)
        return 2
    return int(mod.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
