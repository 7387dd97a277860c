"""GPU only: Smart Turn's graph run by torch on CUDA (``turn_model_device=cuda``): features on the GPU and one
captured CUDA graph per batch bucket. It answers as its eager run on the same device, a batch as each turn alone,
from many threads at once (the sessions' judging threads, beside the device worker), and as the CPU within the
int8 graph's quantization steps."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from omni_stream.models.smart_turn.features import WINDOW, LogMelTorch, log_mel
from omni_stream.models.smart_turn.graph import MAX_BATCH, SmartTurnTorch
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


def test_features_on_the_gpu_are_numpys():
    rng = np.random.default_rng(2)
    windows = (0.1 * rng.standard_normal((4, WINDOW))).astype(np.float32)
    gpu = LogMelTorch("cuda")(torch.from_numpy(windows).cuda()).cpu().numpy()
    np.testing.assert_allclose(gpu, log_mel(windows), atol=1e-4)


def test_the_captured_graph_answers_as_its_eager_run_alone_batched_and_from_threads():
    audio = turns()
    eager = SmartTurnTorch(model_path(), "cuda", graphs=False).probabilities(audio)
    model = SmartTurnTorch(model_path(), "cuda")
    assert model.staged and model._graphs is not None and len(model._graphs) == len(model.buckets)
    # its kernels jump the device worker's queue: the highest priority the device has
    highest = torch.cuda.Stream(priority=-100).priority  # clamped to the device's range
    assert highest < torch.cuda.Stream().priority and model._stream is not None and model._stream.priority == highest
    batched = model.probabilities(audio)
    np.testing.assert_allclose(batched, eager, atol=1e-5)  # the same kernels, replayed
    alone = np.array([model.probability(a) for a in audio])
    np.testing.assert_allclose(alone, batched, atol=0.02)  # other buckets: other product kernels
    many = model.probabilities(audio * 5)  # 40 turns: a slice of MAX_BATCH and one of 8
    assert len(audio) * 5 > MAX_BATCH
    np.testing.assert_allclose(many, np.tile(batched, 5), atol=0.02)
    with ThreadPoolExecutor(8) as pool:
        threaded = np.array(list(pool.map(model.probability, audio * 4)))
    np.testing.assert_allclose(threaded, np.tile(alone, 4), atol=1e-5)  # the same device and shapes: the same
    # on the CPU (numpy's features, the plain path): the same graph, other element-wise kernels, whose float32
    # differences move some activations across a quantization step (int8 throughout; onnxruntime's own fused and
    # unfused runs differ by up to 0.17): near, not equal
    cpu = SmartTurnTorch(model_path(), "cpu").probabilities(audio)
    np.testing.assert_allclose(batched, cpu, atol=0.2)
    # a call is a copy in, a replay and a copy out: printed for the record (benchmarks measure; nothing asserted)
    start = time.perf_counter()
    for _ in range(20):
        model.probabilities(audio * 4)
    print(f"Smart Turn on CUDA: {1000 * (time.perf_counter() - start) / 20:.2f} ms for {len(audio) * 4} turns")
