"""Smart Turn v3.2 (an end-of-turn classifier on a Whisper encoder) run by onnxruntime, from pipecat-ai's wheel.

The ``pipecat-ai`` wheel ships the trained model as ``pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx``
(BSD-2-Clause). It is found through the installed package's location and never imported (importing ``pipecat``
pulls in its logging and runtime patches); nothing is downloaded. Install it with ``pip install --no-deps
pipecat-ai==1.14.0`` and onnxruntime with the ``[turn]`` extra (pipecat-ai's own requirements are many and not
needed for the model file).

Input: the last 8 s of a turn's audio at 16 kHz (:mod:`.features`); output: the probability that the speaker has
finished their turn. ``probabilities`` takes a batch (the model's batch dimension is free), so concurrent sessions
may share one call. Blocking CPU work (about 45-85 ms a window on one core): call it off the event loop. The
session is shared by every stream and thread (onnxruntime's ``run`` is thread-safe).
"""

from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from omni_stream.errors import ConfigError
from omni_stream.models.smart_turn.features import SAMPLE_RATE, last_window, log_mel
from omni_stream.runtime.settings import Tuning

MODEL_FILE = "smart-turn-v3.2-cpu.onnx"
PACKAGE_DIR = ("audio", "turn", "smart_turn", "data")


def model_path() -> Path:
    """The wheel's model file, found without importing ``pipecat`` (ConfigError when it is not installed)."""
    spec = importlib.util.find_spec("pipecat")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in locations:
        path = Path(root).joinpath(*PACKAGE_DIR, MODEL_FILE)
        if path.is_file():
            return path
    raise ConfigError(
        f"Smart Turn needs {MODEL_FILE} from the pipecat-ai wheel: pip install --no-deps pipecat-ai==1.14.0"
    )


def available() -> bool:
    """Whether the model file and onnxruntime are both installed."""
    try:
        model_path()
    except ConfigError:
        return False
    return importlib.util.find_spec("onnxruntime") is not None


def default_threads(cores: int | None = None) -> int:
    """Intra-op threads for the model: a quarter of the cores, 1 to 4. A call took 84 ms on one core of the H200
    host (``voice_bench`` run 30), all of it on the path from the user's pause to the turn's end; split over four it
    is about a quarter of that, and concurrent calls share the session's one pool (threads that sleep when idle,
    never spin: the cores serve the device worker and the event loop too)."""
    n = cores if cores is not None else (os.cpu_count() or 1)
    return max(1, min(4, n // 4))


class SmartTurn:
    """The end-of-turn model (see the module docstring); ``threads``: onnxruntime intra-op threads (default:
    :func:`default_threads`)."""

    sample_rate = SAMPLE_RATE
    batches = False  # on CPU cores concurrent calls beat one batched call (EndOfTurnModel.batches)

    def __init__(self, path: Path | None = None, *, threads: int | None = None) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:  # pragma: no cover - the [turn] extra brings it
            raise ConfigError("Smart Turn needs onnxruntime: pip install 'omni-stream[turn]'") from exc
        options = ort.SessionOptions()
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.inter_op_num_threads = 1
        options.intra_op_num_threads = default_threads() if threads is None else threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.path = path or model_path()
        self._session: Any = ort.InferenceSession(
            str(self.path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._input = self._session.get_inputs()[0].name

    def probabilities(self, turns: list[np.ndarray]) -> np.ndarray:
        """P(the turn is complete) for each turn's audio (float32 mono at 16 kHz; its last 8 s are read)."""
        if not turns:
            return np.zeros(0, np.float32)
        features = log_mel(np.stack([last_window(t) for t in turns]))
        (out,) = self._session.run(None, {self._input: features})
        return np.asarray(out, np.float32).reshape(len(turns))

    def probability(self, turn: np.ndarray) -> float:
        """P(complete) for one turn's audio (float32 mono at 16 kHz)."""
        return float(self.probabilities([turn])[0])


_LOCK = threading.Lock()
_MODEL: EndOfTurn | None = None


class EndOfTurn(Protocol):
    """What :func:`load_smart_turn` gives: :class:`SmartTurn` or its graph by torch on the GPU."""

    sample_rate: int
    batches: bool

    def probabilities(self, turns: list[np.ndarray]) -> np.ndarray: ...

    def probability(self, turn: np.ndarray) -> float: ...


def load_smart_turn() -> EndOfTurn:
    """The model, loaded and run once per process (then shared: it holds no stream state). Where it runs is the
    ``turn_model_device`` switch (``OMNI_STREAM_TURN_MODEL_DEVICE``): ``cpu``, onnxruntime; ``cuda``, the same graph
    and weights run by torch on the GPU (:mod:`.graph`); ``auto`` (default), the GPU where there is one.

    On the H200 the GPU's CUDA graphs took a pause's judgement from 62-106 ms (onnxruntime, one session) and 220-310
    ms (sixteen sessions pausing together) to 4-8 ms and 14-36 ms of a batch call, and voice-to-voice from 435 to
    311-321 ms at one session and from 1794 to 968-1135 ms p95 at sixteen (voice_bench runs 32, 34 and 38,
    gpu_suite.md)."""
    global _MODEL
    with _LOCK:
        if _MODEL is None:
            model = make_smart_turn(Tuning.from_env().turn_model_device)
            model.probability(np.zeros(SAMPLE_RATE, np.float32))  # the first run plans it: not in a turn
            _MODEL = model
        return _MODEL


def make_smart_turn(device: str) -> EndOfTurn:
    """Smart Turn on ``device`` (``cpu``: onnxruntime; ``cuda``: torch, which needs a CUDA device; ``auto``: cuda
    where torch sees one and ``onnx`` (which reads the graph for torch) is installed, else cpu)."""
    import importlib.util

    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() and importlib.util.find_spec("onnx") is not None else "cpu"
    if device == "cpu":
        return SmartTurn()
    if not torch.cuda.is_available():
        raise ConfigError(f"turn_model_device={device} needs a CUDA device; this process has none")
    from omni_stream.models.smart_turn.graph import SmartTurnTorch

    return SmartTurnTorch(model_path(), device)
