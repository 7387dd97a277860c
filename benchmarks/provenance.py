"""What a benchmark result records about where it came from (shared by the benchmark scripts)."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def git_commit() -> str:
    """``$GIT_COMMIT`` (set when the tree travels without .git), else HEAD, marked ``+uncommitted`` if dirty."""
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout
        return head.stdout.strip() + ("+uncommitted" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_record(device: str) -> dict[str, Any]:
    """Where and when a result was measured: the commit, the date, the device (its GPU's name on CUDA), the CPU,
    the torch build and its threads."""
    import torch

    return {
        "git_commit": git_commit(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": device,
        "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else None,
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }
