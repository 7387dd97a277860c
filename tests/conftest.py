"""Test-wide settings: one torch thread (these machines have two noisy cores), offline hub; the synthetic families of
``tests/synthetic`` declared to the engine's registry (they are no part of the installed package)."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMNI_STREAM_THREADS", "1")  # engines' Tuning.threads: their device worker sets torch's
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import synthetic
import torch

torch.set_num_threads(1)
synthetic.register()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
