"""The ``serve`` options that choose the language model and its backend, and what they mean for the engine.

```
omni-stream serve --llm DIR [--llm-backend native|vllm] [--llm-arg KEY=VALUE ...]
omni-stream serve --llm-endpoint URL [--llm-api-key KEY] [--llm-model NAME] [--llm-arg KEY=VALUE ...]
```

``--llm-arg`` values are typed: ``2`` is an int, ``0.5`` a float, ``true``/``false`` bools, ``none``/``null`` None,
JSON lists and objects as such, anything else a string; dashes in keys become underscores
(``tensor-parallel-size=2`` is ``tensor_parallel_size=2``). With ``--llm-backend vllm`` they are vLLM engine
arguments (``AsyncEngineArgs``), passed unchanged; with ``--llm-endpoint`` options of the remote backend.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

BACKENDS = ("native", "vllm")


def parse_value(text: str) -> Any:
    """``--llm-arg`` value typing (see module docstring)."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if text.lstrip().startswith(("[", "{")):
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def parse_backend_arg(item: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> (key, typed value); argparse's type for ``--llm-arg``."""
    key, sep, value = item.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. tensor_parallel_size=2), got {item!r}")
    return key, parse_value(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The language-model options of ``serve``."""
    group = parser.add_argument_group("language model")
    group.add_argument("--llm", default=None, metavar="DIR", help="a text model's checkpoint directory")
    group.add_argument(
        "--llm-backend",
        choices=BACKENDS,
        default="native",
        help="what runs --llm: native (our scheduler) or vllm (vLLM's AsyncLLM in process; the [vllm] extra) "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--llm-arg",
        action="append",
        type=parse_backend_arg,
        default=[],
        metavar="KEY=VALUE",
        help="a backend argument, repeatable: vLLM engine arguments with --llm-backend vllm "
        "(e.g. tensor_parallel_size=2), remote options with --llm-endpoint",
    )
    group.add_argument(
        "--llm-endpoint", default=None, metavar="URL", help="an OpenAI-compatible server (vllm serve, SGLang, ...)"
    )
    group.add_argument("--llm-api-key", default=None, metavar="KEY", help="the --llm-endpoint server's API key")
    group.add_argument("--llm-model", default=None, metavar="NAME", help="the model id at --llm-endpoint")


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """Keywords of ``AsyncEngine.from_pretrained`` for the language model (empty without one)."""
    backend_args = dict(args.llm_arg)
    if args.llm_endpoint is not None:
        if args.llm is not None:
            raise SystemExit("omni-stream serve: give --llm or --llm-endpoint, not both")
        if args.llm_backend != "native":
            raise SystemExit("omni-stream serve: --llm-backend applies to --llm, not to --llm-endpoint")
        for key, value in (("model", args.llm_model), ("api_key", args.llm_api_key)):
            if value is not None:
                backend_args[key] = value
        return {"llm_endpoint": args.llm_endpoint, "backend_args": backend_args}
    if args.llm_model is not None or args.llm_api_key is not None:
        raise SystemExit("omni-stream serve: --llm-model and --llm-api-key apply to --llm-endpoint")
    if args.llm is None:
        if backend_args or args.llm_backend != "native":
            raise SystemExit("omni-stream serve: --llm-backend and --llm-arg need --llm or --llm-endpoint")
        return {}
    family = "vllm" if args.llm_backend == "vllm" else None  # native: the checkpoint's own model_type
    return {"llm": args.llm, "llm_family": family, "backend_args": backend_args}
