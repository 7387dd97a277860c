"""``omni-stream serve --ray``: the serving app as a Ray Serve deployment, one whole engine per replica.

Each replica builds its own engine inside the app's lifespan and serves the unchanged Starlette app
(HTTP, SSE and WebSockets pass through Ray's proxy). What the deployment adds:

- placement: one GPU per replica on CUDA (Ray sets ``CUDA_VISIBLE_DEVICES``), CPUs only otherwise;
- admission: ``max_ongoing_requests`` is the engine's batch size (Ray's default of 5 would queue most streams
  in the proxy); past ``max_queued_requests`` waiting in a proxy, requests get 429 with ``Retry-After``;
- health: Ray's replica health check calls the app's own ``/health`` in process;
- drain: on scale-down or redeploy, Ray stops routing to the replica and lets its requests finish (up to
  ``graceful_shutdown_timeout_s``) before the lifespan closes the engine;
- pacing: Ray's proxy buffers whole responses, so streams are paced by the playback clock (default 2 s ahead);
- routing is visible: each replica answers with ``x-omni-stream-replica`` and labels its ``/metrics``.

Ray is imported only when a deployment is built or run (``pip install "omni-stream[ray]"``); the options and
the replica class import without it.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from omni_stream.realtime.settings import Settings
from omni_stream.runtime.settings import Tuning

APP_NAME = "omni-stream"
DEPLOYMENT_NAME = "OmniStream"
AUTOSCALE_TARGET = 0.7  # target ongoing requests per replica, as a share of the batch size


# --- options ---


@dataclass(slots=True, frozen=True)
class EngineSpec:
    """What each replica loads (the ``serve`` engine flags). ``dtype``: float32 | bfloat16 | float16 | None."""

    models: tuple[str, ...] = ()  # local checkpoint directories (one per kind); none: the embedded tiny models
    llm: tuple[tuple[str, Any], ...] = ()  # the text model's from_pretrained keywords (serve's --llm flags)
    device: str = "cpu"
    dtype: str | None = None
    load_format: str = "auto"
    max_batch_size: int = 32
    # The head's switches (its environment and flags), so every replica runs as the head was told to.
    tuning: Tuning = field(default_factory=Tuning)

    async def load(self) -> Any:
        """Build the engine (inside a replica, from the app's lifespan)."""
        from omni_stream.engine import AsyncEngine
        from omni_stream.realtime.server import _dtype

        return await AsyncEngine.from_pretrained(
            list(self.models),
            **dict(self.llm),
            device=self.device,
            dtype=_dtype(self.dtype, self.device),
            load_format=self.load_format,
            max_batch_size=self.max_batch_size,
            progress=False,
            tuning=self.tuning,
        )


@dataclass(slots=True, frozen=True)
class RayOptions:
    """The Serve deployment. Counts per replica unless said otherwise; durations in seconds."""

    # Cluster
    address: str | None = None  # None: start a local single-node cluster; "auto": the one `ray start` made here
    host: str = "127.0.0.1"  # where Ray's HTTP proxy listens
    port: int = 8000
    # Replicas: a fixed count, or autoscaling between (min, max)
    replicas: int = 1
    autoscale: tuple[int, int] | None = None
    gpus_per_replica: float = 0.0
    cpus_per_replica: float = 1.0
    # Admission
    max_ongoing_requests: int = 32  # the engine's batch size
    max_queued_requests: int = 32  # waiting in each proxy beyond the replicas' capacity; then 429
    retry_after_s: float = 1.0
    # Health and drain
    health_check_period_s: float = 10.0
    health_check_timeout_s: float = 30.0
    graceful_shutdown_timeout_s: float = 20.0
    graceful_shutdown_wait_loop_s: float = 2.0

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError("replicas must be >= 1")
        if self.autoscale is not None and not (0 <= self.autoscale[0] <= self.autoscale[1] and self.autoscale[1] >= 1):
            raise ValueError(f"autoscale must be MIN:MAX with 0 <= MIN <= MAX and MAX >= 1, got {self.autoscale}")
        if self.max_ongoing_requests < 1 or self.max_queued_requests < 0:
            raise ValueError("max_ongoing_requests must be >= 1 and max_queued_requests >= 0")


def deployment_options(opts: RayOptions) -> dict[str, Any]:
    """Keyword arguments for ``ray.serve.deployment`` (pure; see the module doc for why each is set)."""
    options: dict[str, Any] = {
        "name": DEPLOYMENT_NAME,
        "ray_actor_options": {"num_cpus": opts.cpus_per_replica, "num_gpus": opts.gpus_per_replica},
        "max_ongoing_requests": opts.max_ongoing_requests,
        "max_queued_requests": opts.max_queued_requests,
        "backpressure_config": {"status_code": 429, "retry_after_s": opts.retry_after_s},
        "health_check_period_s": opts.health_check_period_s,
        "health_check_timeout_s": opts.health_check_timeout_s,
        "graceful_shutdown_timeout_s": opts.graceful_shutdown_timeout_s,
        "graceful_shutdown_wait_loop_s": opts.graceful_shutdown_wait_loop_s,
    }
    if opts.autoscale is None:
        options["num_replicas"] = opts.replicas
    else:
        low, high = opts.autoscale
        options["autoscaling_config"] = {
            "min_replicas": low,
            "initial_replicas": max(low, 1),
            "max_replicas": high,
            "target_ongoing_requests": max(1.0, AUTOSCALE_TARGET * opts.max_ongoing_requests),
        }
    return options


# --- the replica ---


async def probe(app: Any, path: str = "/health") -> int:
    """GET ``path`` from an ASGI ``app`` in process; returns the status code."""
    status = 0

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [],
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
    }
    await app(scope, receive, send)
    return status


class OmniReplica:
    """One replica: the app from :func:`omni_stream.realtime.app.create_app` over an engine it builds itself.

    Plain Python; :func:`build_application` wraps it as a Serve ingress deployment. ``replica_id`` is Ray's
    replica tag inside Serve (given explicitly outside it).
    """

    def __init__(self, engine: EngineSpec, settings: Settings, replica_id: str | None = None) -> None:
        if replica_id is None:
            from ray import serve

            replica_id = serve.get_replica_context().replica_tag
        self.engine = engine
        self.settings = dataclasses.replace(settings, replica_id=replica_id)
        self._omni_app: Any = None  # not `app`: Serve's ingress wrapper owns that name

    def __serve_build_asgi_app__(self) -> Any:
        from omni_stream.realtime.app import create_app

        self._omni_app = create_app(self.engine.load, self.settings)
        return self._omni_app

    async def check_health(self) -> None:
        """Ray's health check: the app's own ``/health`` must answer 200 (503 while loading or closed)."""
        if self._omni_app is None:
            raise RuntimeError("the app is not built yet")
        status = await probe(self._omni_app, "/health")
        if status != 200:
            raise RuntimeError(f"/health answered {status}")


def build_application(engine: EngineSpec, settings: Settings, opts: RayOptions) -> Any:
    """The Serve application (``ray.serve.Application``) for ``serve.run``.

    ``settings.pace_streams_seconds`` should be set (the command uses ``omni_stream.speech.pacing.DEFAULT_AHEAD``):
    Ray's proxy buffers, so unpaced streams run ahead of their listeners by as much as the engine can make.
    """
    from ray import serve

    deployment = serve.deployment(**deployment_options(opts))(serve.ingress()(OmniReplica))
    return deployment.bind(engine, settings)


# --- the command ---


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``serve --ray`` options."""
    group = parser.add_argument_group("Ray Serve (pip install 'omni-stream[ray]')")
    group.add_argument("--ray", action="store_true", help="serve replicas of the app on a Ray cluster")
    group.add_argument(
        "--ray-address",
        default=None,
        help="cluster to join (auto: the one `ray start` made on this machine; default: start a local one)",
    )
    scale = group.add_mutually_exclusive_group()
    scale.add_argument("--replicas", type=int, default=None, help="fixed number of replicas (default: 1)")
    scale.add_argument("--autoscale", type=_min_max, default=None, metavar="MIN:MAX", help="autoscale replicas")
    group.add_argument(
        "--max-queued-requests",
        type=int,
        default=None,
        help="requests waiting in each proxy before 429 + Retry-After (default: --max-concurrency)",
    )
    group.add_argument(
        "--ray-cpus-per-replica", type=float, default=1.0, help="CPUs each replica reserves (default: %(default)s)"
    )


def _min_max(text: str) -> tuple[int, int]:
    try:
        low, high = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN:MAX (two integers), got {text!r}") from None
    if not 0 <= low <= high or high < 1:
        raise argparse.ArgumentTypeError(f"expected 0 <= MIN <= MAX and MAX >= 1, got {text!r}")
    return low, high


def options_from_args(args: argparse.Namespace) -> RayOptions:
    on_gpu = str(args.device).startswith("cuda")
    return RayOptions(
        address=args.ray_address,
        host=args.host,
        port=args.port,
        replicas=args.replicas or 1,
        autoscale=args.autoscale,
        gpus_per_replica=1.0 if on_gpu else 0.0,
        cpus_per_replica=args.ray_cpus_per_replica,
        max_ongoing_requests=args.max_concurrency,
        max_queued_requests=args.max_concurrency if args.max_queued_requests is None else args.max_queued_requests,
    )


def engine_from_args(
    args: argparse.Namespace, models: list[str], llm: dict[str, Any], tuning: Tuning | None = None
) -> EngineSpec:
    return EngineSpec(
        models=tuple(models),
        llm=tuple(llm.items()),
        device=args.device,
        dtype=args.dtype,
        load_format=args.load_format,
        max_batch_size=args.max_concurrency,
        tuning=Tuning() if tuning is None else tuning,
    )


def start(opts: RayOptions) -> bool:
    """Join or start the cluster and start Serve's proxies; True when this call started the cluster."""
    import ray
    from ray import serve

    local = opts.address is None
    if local:
        # A new single-node cluster: never attach to one left behind by `ray start` (use --ray-address for that).
        ray.init(address="local", include_dashboard=False)
    else:
        ray.init(address=opts.address)
    serve.start(http_options={"host": opts.host, "port": opts.port})
    return local


def shortfall(opts: RayOptions, resources: dict[str, float]) -> str | None:
    """Why a cluster with ``resources`` cannot place the initial replicas (None when it can)."""
    count = max(1, opts.autoscale[0]) if opts.autoscale is not None else opts.replicas
    for name, each in (("CPU", opts.cpus_per_replica), ("GPU", opts.gpus_per_replica)):
        need, have = count * each, resources.get(name, 0.0)
        if need > have + 1e-9:
            return f"{count} replica(s) need {need:g} {name}, the cluster has {have:g}"
    return None


def run(
    args: argparse.Namespace, settings: Settings, models: list[str], llm: dict[str, Any], tuning: Tuning | None = None
) -> int:
    """Deploy, then serve until SIGINT/SIGTERM; the app is deleted (and a local cluster stopped) at the end."""
    try:
        from ray import serve
    except ImportError:
        print("omni-stream serve --ray: Ray is not installed: pip install 'omni-stream[ray]'", file=sys.stderr)
        return 2
    opts = options_from_args(args)
    local = start(opts)
    try:
        import ray

        # Serve waits forever for replicas it cannot place: refuse on a local cluster, warn on a joined one
        # (an autoscaling cluster may still add nodes).
        problem = shortfall(opts, ray.cluster_resources())
        if problem is not None and local:
            print(f"omni-stream serve --ray: cannot place replicas: {problem}", file=sys.stderr)
            return 2
        if problem is not None:
            print(f"omni-stream serve --ray: waiting for the cluster to grow: {problem}", flush=True)
        if opts.address is not None and settings.voices_dir is not None:
            print(f"omni-stream serve --ray: voices dir {settings.voices_dir} must be shared by every node")
        app = build_application(engine_from_args(args, models, llm, tuning), settings, opts)
        serve.run(app, name=APP_NAME, route_prefix="/")
        scale = f"{opts.autoscale[0]}-{opts.autoscale[1]}" if opts.autoscale else str(opts.replicas)
        print(f"omni-stream serve --ray: {scale} replica(s) listening on http://{opts.host}:{opts.port}", flush=True)
        _wait_for_signal()
    finally:
        _teardown(local)
    return 0


def _teardown(local: bool) -> None:
    import ray
    from ray import serve

    try:
        if local:
            serve.shutdown()
        else:
            serve.delete(APP_NAME)
    finally:
        ray.shutdown()


def _wait_for_signal() -> None:
    stop = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    stop.wait()
