"""A simulated multi-node cluster (``benchmarks/ray_multinode.py``): a head and two one-GPU worker nodes started
with ``ray start`` inside private network and PID namespaces; the two replicas land on the two GPU nodes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray.serve")

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
NAMESPACES = ["unshare", "-n", "-p", "-f", "--mount-proc"]


def _namespaces_available() -> bool:
    try:
        return subprocess.run([*NAMESPACES, "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _namespaces_available(), reason="needs root for private network and PID namespaces")
def test_replicas_are_placed_on_distinct_gpu_nodes(tmp_path):
    out = tmp_path / "figures.json"
    script = f"ip link set lo up && {sys.executable} benchmarks/ray_multinode.py --out {out}"
    run = subprocess.run([*NAMESPACES, "bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert out.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert [n["ip"] for n in figures["nodes"]] == ["127.0.0.1"] * 3  # loopback only: the namespace has no other
    assert sorted(n["gpus"] for n in figures["nodes"]) == [0.0, 1.0, 1.0]
    assert figures["replica_nodes_distinct"] and figures["replicas_on_gpu_nodes"]
    assert figures["gpu_task_waits_while_replicas_hold_both"]
    assert figures["replicas_answering"] == 2 and figures["paced_stream_exact"]
    assert run.returncode == 0
