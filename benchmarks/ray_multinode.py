"""A simulated multi-node Ray cluster on one host: a head and two worker nodes, each with one logical GPU.

Run it as root inside private network and PID namespaces, so the cluster is reachable on loopback only and
every process it starts ends with it:

    unshare -n -p -f --mount-proc bash -c 'ip link set lo up && python benchmarks/ray_multinode.py'

It starts the nodes with ``ray start``, deploys the serving app (the tests' synthetic TTS, ``tests/synthetic``,
found by every node through its entry point on ``PYTHONPATH``; 2 replicas, one GPU each, engines on CPU) through
:func:`omni_stream.realtime.ray_serve.build_application`, checks that the replicas sit on the two GPU nodes with
``CUDA_VISIBLE_DEVICES`` set by Ray, streams through the head's proxy, and prints (and writes, with ``--out``) the
figures as JSON. Inside the namespace the only interface is ``lo``, so Ray advertises 127.0.0.1; token auth is off
(nothing outside the namespace can connect).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAD_PORT = 6380
HTTP_PORT = 8123


def _node_ports(index: int) -> list[str]:
    base = 20000 + 1000 * index
    return [
        f"--node-manager-port={base}",
        f"--object-manager-port={base + 1}",
        f"--dashboard-agent-listen-port={base + 2}",
        f"--dashboard-agent-grpc-port={base + 3}",
        f"--runtime-env-agent-port={base + 4}",
        f"--metrics-export-port={base + 5}",
        f"--min-worker-port={base + 100}",
        f"--max-worker-port={base + 199}",
    ]


def _ray_start(args: list[str], temp: str) -> float:
    started = time.monotonic()
    subprocess.run(["ray", "start", "--disable-usage-stats", f"--temp-dir={temp}", *args], check=True)
    return time.monotonic() - started


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write the JSON figures here")
    args = parser.parse_args()
    os.environ.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled", OMP_NUM_THREADS="1")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from synthetic import subprocess_env

    figures: dict = {"commit": _commit()}
    total = time.monotonic()
    temp = tempfile.mkdtemp(prefix="raymn", dir="/tmp")
    os.environ.update(subprocess_env(Path(temp) / "synthetic-site"))  # every node's workers find the synthetic TTS
    figures["head_start_s"] = _ray_start(
        [
            "--head",
            f"--port={HEAD_PORT}",
            "--num-cpus=1",
            "--num-gpus=0",
            "--include-dashboard=false",
            *_node_ports(0),
        ],
        temp,
    )
    figures["worker_start_s"] = [
        _ray_start([f"--address=127.0.0.1:{HEAD_PORT}", "--num-cpus=1", "--num-gpus=1", *_node_ports(i)], temp)
        for i in (1, 2)
    ]

    import httpx
    import ray
    from ray import serve
    from serving_helpers import expected_tone, make_checkpoint, pcm16

    from omni_stream.realtime.ray_serve import APP_NAME, EngineSpec, RayOptions, build_application
    from omni_stream.realtime.replica import HEADER
    from omni_stream.realtime.settings import Settings

    started = time.monotonic()
    ray.init(address=f"127.0.0.1:{HEAD_PORT}", log_to_driver=False)
    figures["driver_connect_s"] = time.monotonic() - started
    nodes = [n for n in ray.nodes() if n["Alive"]]
    figures["nodes"] = [{"ip": n["NodeManagerAddress"], "gpus": n["Resources"].get("GPU", 0.0)} for n in nodes]
    started = time.monotonic()
    serve.start(http_options={"host": "127.0.0.1", "port": HTTP_PORT}, proxy_location="HeadOnly")
    figures["serve_start_s"] = time.monotonic() - started

    checkpoint = make_checkpoint(Path(temp) / "synthetic")
    opts = RayOptions(port=HTTP_PORT, replicas=2, gpus_per_replica=1.0, cpus_per_replica=0.25, max_ongoing_requests=4)
    settings = Settings(voices_dir=Path(temp) / "voices", pace_streams_seconds=1.0)
    started = time.monotonic()
    serve.run(build_application(EngineSpec(models=(str(checkpoint),), max_batch_size=4), settings, opts), name=APP_NAME)
    figures["deploy_s"] = time.monotonic() - started

    # Where Ray put the replicas, and the GPU it gave each (from the actor table; no dashboard needed).
    gpu_nodes = {n["NodeID"] for n in nodes if n["Resources"].get("GPU", 0.0) >= 1}
    replicas = [
        a
        for a in ray._private.state.actors().values()  # private: the public state API needs the dashboard
        if a["ActorClassName"].startswith("ServeReplica") and a["State"] == "ALIVE"
    ]
    replica_nodes = sorted(a["Address"]["NodeID"] for a in replicas)
    figures["replica_nodes_distinct"] = len(set(replica_nodes)) == 2
    figures["replicas_on_gpu_nodes"] = set(replica_nodes) <= gpu_nodes

    @ray.remote(num_gpus=1, num_cpus=0)
    def one_gpu() -> str | None:
        return os.environ.get("CUDA_VISIBLE_DEVICES")

    # Both GPUs are held by the replicas: a task asking for one cannot run until one is free.
    ready, _ = ray.wait([one_gpu.remote()], timeout=3)
    figures["gpu_task_waits_while_replicas_hold_both"] = not ready

    text = "x" * 100
    want = pcm16(expected_tone("alice", text))
    seen: dict[str, int] = {}
    started = time.monotonic()
    with httpx.Client(base_url=f"http://127.0.0.1:{HTTP_PORT}", timeout=60) as client:
        for _ in range(40):
            r = client.post("/v1/audio/speech", json={"input": "hi", "voice": "alice", "response_format": "pcm"})
            seen[r.headers[HEADER]] = seen.get(r.headers[HEADER], 0) + 1
            if len(seen) == 2:
                break
        body = {"input": text, "voice": "alice", "response_format": "pcm", "stream_format": "audio"}
        with client.stream("POST", "/v1/audio/speech", json=body) as r:
            first = None
            data = b""
            for piece in r.iter_bytes():
                first = first or time.monotonic() - started
                data += piece
    figures["replicas_answering"] = len(seen)
    figures["paced_stream_exact"] = data == want
    figures["paced_stream_wall_s"] = time.monotonic() - started
    figures["paced_stream_audio_s"] = len(want) / 2 / 24000

    started = time.monotonic()
    serve.shutdown()
    ray.shutdown()
    figures["teardown_s"] = time.monotonic() - started
    figures["total_s"] = time.monotonic() - total
    figures["ok"] = all(
        figures[k]
        for k in ("replica_nodes_distinct", "replicas_on_gpu_nodes", "gpu_task_waits_while_replicas_hold_both")
    ) and (figures["replicas_answering"] == 2 and figures["paced_stream_exact"])
    text_out = json.dumps(figures, indent=2, default=float)
    print(text_out)
    if args.out is not None:
        args.out.write_text(text_out + "\n")
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
