"""``omni-stream serve``: load a checkpoint and serve the HTTP/WebSocket API with uvicorn."""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omni_stream.cli import add_tuning_arguments, torch_threads, tuning_from_args
from omni_stream.realtime import llm_flags, ray_serve
from omni_stream.realtime.settings import Settings, default_voices_dir
from omni_stream.runtime.settings import Tuning
from omni_stream.speech.pacing import DEFAULT_AHEAD

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger("omni_stream.realtime.server")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``serve`` options."""
    parser.add_argument(
        "--model",
        action="append",
        default=None,
        help="checkpoint directory or hub id, of any kind (speech, transcription, image, video, text); repeat it "
        "to serve several kinds together (without --model and --llm: the embedded tiny model of every kind; with "
        "either, only the models named)",
    )
    parser.add_argument(
        "--served-model-name", default=None, help="the speech model's id clients send (default: its name)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s)")
    parser.add_argument(
        "--port", type=port_number, default=8000, help="TCP port, 0: any free one (default: %(default)s)"
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help="require this key on /v1 routes and the /rtc offers (default: $OMNI_STREAM_API_KEY; unset: no auth)",
    )
    parser.add_argument(
        "--voices-dir",
        type=Path,
        default=None,
        help="where uploaded voices persist (default: voices/ in $OMNI_STREAM_CACHE, else in the user cache directory)",
    )
    parser.add_argument("--device", default="cpu", help="torch device (default: %(default)s)")
    parser.add_argument(
        "--dtype", default=None, help="float32 | bfloat16 | float16 (default: each model's choice for the device)"
    )
    parser.add_argument(
        "--load-format",
        choices=("auto", "dummy"),
        default="auto",
        help="auto: read the checkpoint's weights; dummy: random weights at the config's sizes, for "
        "benchmarks (default: %(default)s)",
    )
    parser.add_argument(
        "--max-concurrency", type=positive, default=32, help="requests batched together (default: %(default)s)"
    )
    parser.add_argument("--allowed-local-media-path", type=Path, default=None, help="ref_audio file:// root")
    parser.add_argument("--allow-remote-media", action="store_true", help="let ref_audio fetch http(s) URLs")
    parser.add_argument(
        "--enable-benchmark-fields",
        action="store_true",
        help="accept benchmark-only speech fields (ignore_eos: always generate max_new_tokens frames); "
        "without it they are a 400. Never on production servers",
    )
    parser.add_argument(
        "--legacy-stream-raw",
        action="store_true",
        help="stream=true without stream_format streams raw pcm/wav bytes, as vLLM-Omni did before SSE (its "
        "bench_tts_serve.py and fastrtc demo read those bytes as PCM); default: SSE",
    )
    add_tuning_arguments(parser)
    parser.add_argument(
        "--rtc-ice-servers",
        default="",
        help="comma-separated STUN/TURN URLs for WebRTC (/rtc), e.g. stun:host:3478,turn:user:pass@host:3478 "
        "(default: none, host candidates only)",
    )
    parser.add_argument(
        "--rtc-concurrency-limit", type=positive, default=8, help="WebRTC sessions at once (default: %(default)s)"
    )
    parser.add_argument(
        "--log-level", type=str.lower, choices=LOG_LEVELS, default="info", help="log level (default: %(default)s)"
    )
    parser.add_argument(
        "--http",
        choices=HTTP_PARSERS,
        default="auto",
        help="uvicorn's HTTP/1.1 parser: auto (httptools when installed, else h11), h11 or httptools "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--loop",
        choices=EVENT_LOOPS,
        default="auto",
        help="uvicorn's event loop: auto (uvloop when installed, else asyncio's), asyncio or uvloop "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--ws-deflate",
        action="store_true",
        help="let WebSocket clients negotiate per-message deflate (default: off; audio and video frames hardly "
        "compress and each message would be compressed on the server's event loop)",
    )
    parser.add_argument(
        "--pace-streams",
        type=_seconds_or_off,
        default=None,
        metavar="SECONDS|off",
        help="let streamed audio run ahead of real-time playback by at most SECONDS, for buffering proxies "
        "(default: 2 with --ray, else off)",
    )
    ray_serve.add_arguments(parser)
    # --- language model (--llm, --llm-backend, --llm-arg, --llm-endpoint, ...) ---
    llm_flags.add_arguments(parser)


def _seconds_or_off(text: str) -> float | str:
    if text == "off":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds or 'off', got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0 or 'off', got {text!r}")
    return value


class ModelNotFound(Exception):
    """``--model`` names neither a directory nor a hub id present in the local cache."""


def resolve_model(model: str) -> str:
    """A local directory as is; anything else is a hub id looked up in the local HF cache only (never downloaded)."""
    if Path(model).expanduser().exists():
        return str(Path(model).expanduser())
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        raise ModelNotFound(f"{model!r} is not a directory (and huggingface_hub is not installed)") from None
    if model.startswith(("/", ".", "~")) or model.count("/") != 1:  # a path, not an "org/name" hub id
        raise ModelNotFound(f"{model!r} does not exist (a checkpoint directory, or an org/name hub id)")
    try:
        return snapshot_download(model, local_files_only=True)
    except Exception as exc:  # not cached, malformed id, incomplete snapshot
        raise ModelNotFound(
            f"{model!r} is not a directory and is not in the local Hugging Face cache ({HF_HUB_CACHE}); "
            f"omni-stream never downloads models: fetch it beforehand (e.g. `hf download {model}`) "
            f"or pass a checkpoint directory ({type(exc).__name__})"
        ) from exc


def _dtype(name: str | None, device: str) -> Any:
    """``--dtype`` as a torch dtype; None stays None (each family's own choice for the device)."""
    if name is None:
        return None
    from omni_stream.errors import ConfigError
    from omni_stream.runtime.weights import parse_dtype

    try:
        return parse_dtype(name, device)
    except ConfigError as exc:
        raise SystemExit(f"omni-stream serve: --{exc}") from None


def settings_from_args(args: argparse.Namespace, tuning: Tuning | None = None) -> Settings:
    """The serving settings of ``serve``'s flags; ``tuning`` (None: the defaults) gives the API key and cache
    directory the flags leave unset."""
    tuning = Tuning() if tuning is None else tuning
    return Settings(
        model_name=args.served_model_name,
        api_key=args.api_key or tuning.api_key or None,
        voices_dir=args.voices_dir or default_voices_dir(tuning.cache_dir),
        allowed_local_media_path=args.allowed_local_media_path,
        allow_remote_media=args.allow_remote_media,
        enable_benchmark_fields=args.enable_benchmark_fields,
        pace_streams_seconds=_pace(args),
        legacy_stream_raw=args.legacy_stream_raw,
        rtc_ice_servers=tuple(url.strip() for url in args.rtc_ice_servers.split(",") if url.strip()),
        rtc_concurrency_limit=args.rtc_concurrency_limit,
    )


def _pace(args: argparse.Namespace) -> float | None:
    """``--pace-streams``: off, explicit seconds, or by default 2 s behind Ray's buffering proxy and off otherwise."""
    if args.pace_streams == "off":
        return None
    if args.pace_streams is None:
        return DEFAULT_AHEAD if args.ray else None
    return float(args.pace_streams)


def banner_notes(settings: Settings) -> list[str]:
    """What the serve banner says about access and wire modes (pure, for tests)."""
    notes = []
    if settings.api_key:
        notes.append(
            "API key required on /v1 routes and /rtc offers (Authorization: Bearer, or the WebSocket subprotocol)"
        )
    else:
        notes.append("no API key: /v1 routes are open (set --api-key or OMNI_STREAM_API_KEY)")
    if settings.legacy_stream_raw:
        notes.append("stream=true streams raw audio bytes (--legacy-stream-raw), not SSE")
    return notes


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's


def port_number(text: str) -> int:
    """``--port``: a TCP port, 0 for any free one (argparse's type: refused before anything loads)."""
    try:
        port = int(text)
    except ValueError:  # argparse would name this function ("invalid port_number value")
        raise argparse.ArgumentTypeError(f"a port is a whole number 0-65535, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0-65535, got {port}")
    return port


def positive(text: str) -> int:
    """A whole number >= 1 (argparse's type)."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before any model loads: a port in use or an address this machine does not have
    is refused in a moment, not after minutes of loading. uvicorn serves on it (as it would bind it itself)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family=family, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


# Libraries whose INFO lines are their own bookkeeping, not the server's: aioice writes ~8 a WebRTC connection
# (candidate pairs, consent); shown at DEBUG
CHATTY_LIBRARIES = ("aioice", "aiortc")


def quiet_libraries(level: str) -> None:
    """Above DEBUG, :data:`CHATTY_LIBRARIES` log warnings and errors only."""
    if logging.getLevelName(level) != logging.DEBUG:
        for name in CHATTY_LIBRARIES:
            logging.getLogger(name).setLevel(logging.WARNING)


def run(args: argparse.Namespace) -> int:
    """Load the model (with a progress bar), then serve until SIGINT/SIGTERM (graceful shutdown)."""
    from omni_stream.engine import AsyncEngine
    from omni_stream.realtime.app import StartupStopped, create_app
    from omni_stream.realtime.graceful import GracefulServer

    level = "DEBUG" if args.log_level == "trace" else args.log_level.upper()  # trace: uvicorn's, below DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    quiet_libraries(level)
    tuning = tuning_from_args(args)
    settings = settings_from_args(args, tuning)
    dtype = _dtype(args.dtype, args.device)
    llm = llm_flags.engine_options(args)  # language model: --llm / --llm-endpoint and their backend
    try:
        models = [resolve_model(m) for m in args.model or ()]
        if llm.get("llm") is not None:  # as --model: a directory, or a hub id in the local cache
            llm["llm"] = resolve_model(str(llm["llm"]))
    except ModelNotFound as exc:
        print(f"omni-stream serve: cannot find model: {exc}", file=sys.stderr)
        return 2
    if missing := missing_server_packages(args.http, args.loop):
        print(f"omni-stream serve: {missing}", file=sys.stderr)
        return 2
    if not models and not llm:
        print("omni-stream serve: no --model given: serving the embedded tiny model of every kind (random weights)")
    if args.load_format == "dummy":
        print("omni-stream serve: --load-format dummy: random weights, the audio is noise (benchmarks only)")
    if settings.enable_benchmark_fields:
        print("omni-stream serve: benchmark fields enabled (ignore_eos): not for production", flush=True)
    for note in banner_notes(settings):
        print(f"omni-stream serve: {note}", flush=True)
    print(f"omni-stream serve: tuning {tuning.describe()}", flush=True)
    if args.ray:
        return ray_serve.run(args, settings, models, llm, tuning)
    if args.replicas is not None or args.autoscale is not None or args.ray_address is not None:
        print("omni-stream serve: --replicas, --autoscale and --ray-address need --ray", file=sys.stderr)
        return 2

    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        where = url(args.host, args.port)
        print(f"omni-stream serve: cannot listen on {where}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    listening = url(args.host, sock.getsockname()[1])  # --port 0: the port the system gave

    async def load() -> Any:
        what = ", ".join([*models, *([str(llm.get("llm") or llm.get("llm_endpoint"))] if llm else [])])
        print(f"omni-stream serve: loading {what or 'the embedded tiny models'} on {args.device} ...", flush=True)
        engine = await AsyncEngine.from_pretrained(
            models,
            device=args.device,
            dtype=dtype,
            load_format=args.load_format,
            max_batch_size=args.max_concurrency,
            progress=True,
            tuning=tuning,
            **llm,
        )
        loaded = ", ".join(f"{f.info.model_name} ({f.info.kind}, {f.info.model_type})" for f in engine.models)
        threads = await engine.worker.submit(torch_threads)  # as the device worker's thread sees it
        auth = "API key required" if settings.api_key else "no API key"
        print(
            f"omni-stream serve: loaded {loaded}; voices dir {settings.voices_dir}; {threads} torch threads; {auth}; "
            f"listening on {listening}",
            flush=True,
        )
        print(  # what a new user opens first
            f"omni-stream serve: pages {listening}/ (speech), {listening}/realtime (voice agent), "
            f"{listening}/transcribe, {listening}/video; the API under {listening}/v1 (OpenAI's routes), "
            f"health at {listening}/health",
            flush=True,
        )
        return engine

    app = create_app(load, settings)
    config = uvicorn_config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        ws_deflate=args.ws_deflate,
        http=args.http,
        loop=args.loop,
    )
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal: end with status 0 instead.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        GracefulServer(config, app.state.omni).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    except SystemExit:  # uvicorn's start-up failure (status 3), unless the start-up was stopped by a signal
        if not isinstance(app.state.omni.startup_error, StartupStopped):
            raise
    return 0


HTTP_PARSERS = ("auto", "h11", "httptools")
EVENT_LOOPS = ("auto", "asyncio", "uvloop")


def missing_server_packages(http: str, loop: str) -> str | None:
    """What ``--http`` / ``--loop`` name that is not installed (uvicorn would fail with a traceback at start-up,
    after the models loaded), or None. ``auto`` never misses: uvicorn falls back to h11 and asyncio's loop."""
    import importlib.util

    named = [(flag, value) for flag, value in (("--http", http), ("--loop", loop)) if value in ("httptools", "uvloop")]
    missing = [(flag, value) for flag, value in named if importlib.util.find_spec(value) is None]
    if not missing:
        return None
    return "; ".join(f"{flag} {value} needs the {value} package, which is not installed (pip install {value}, "
                     f"or {flag} auto)" for flag, value in missing)  # fmt: skip


def uvicorn_config(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    ws_deflate: bool = False,
    timeout_graceful_shutdown: int = 10,
    http: str = "auto",
    loop: str = "auto",
) -> uvicorn.Config:
    """uvicorn's settings for an app of :func:`omni_stream.realtime.app.create_app` (``serve`` and the tests).

    Per-message deflate (uvicorn's default, and what browsers and ``websockets`` clients offer) stays off unless
    ``ws_deflate``: PCM, Opus, fMP4 and base64 audio hardly compress, and every message would be compressed on
    the event loop thread that also serves every other stream (``benchmarks/ws_deflate.py``). ``http``: the HTTP/1.1
    parser (``auto``: httptools, a C parser, when it is installed, else the pure-Python h11, which parses every
    request on the event loop that also serves the streams; ``benchmarks/tts_load.py --arm`` compares them).
    ``loop``: ``auto`` runs uvloop where it is installed; ``asyncio`` keeps the standard loop, whose callbacks a
    benchmark's loop meter can time (``benchmarks/loop_meter.py``; uvloop's run in C, out of its sight).
    """
    import uvicorn

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",  # the app loads its models at startup: a failure there stops the server
        timeout_graceful_shutdown=timeout_graceful_shutdown,
        ws_max_size=32 * 1024 * 1024,  # a 15 MiB realtime audio append is 20 MiB of base64 in one message
        ws_per_message_deflate=ws_deflate,
        http=http,
        loop=loop,
    )


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
