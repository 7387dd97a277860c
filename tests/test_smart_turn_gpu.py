"""GPU only: Smart Turn's graph run by torch on CUDA (``turn_model_device=cuda``) answers as it does on the CPU, a
batch as each alone, and from many threads at once (the sessions' judging threads, beside the device worker)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from omni_stream.models.smart_turn.graph import SmartTurnTorch
from omni_stream.models.smart_turn.model import available, model_path

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not available(), reason="needs Smart Turn's model file and onnxruntime"),
]


def turns() -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    t = np.arange(16000 * 2) / 16000
    return [
        (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32),
        *((0.05 * (k + 1) * rng.standard_normal(16000 * (k + 1))).astype(np.float32) for k in range(7)),
    ]


def test_the_graph_on_cuda_answers_as_on_the_cpu_alone_batched_and_from_threads():
    audio = turns()
    cpu = SmartTurnTorch(model_path(), "cpu").probabilities(audio)
    gpu = SmartTurnTorch(model_path(), "cuda")
    batched = gpu.probabilities(audio)
    np.testing.assert_allclose(batched, cpu, atol=0.02)  # float32 element-wise kernels differ by device
    alone = np.array([gpu.probability(a) for a in audio])
    np.testing.assert_allclose(alone, batched, atol=0.02)
    with ThreadPoolExecutor(8) as pool:
        threaded = np.array(list(pool.map(gpu.probability, audio * 4)))
    np.testing.assert_allclose(threaded, np.tile(alone, 4), atol=1e-5)  # the same device and shapes: the same
