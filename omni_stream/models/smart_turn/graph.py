"""Smart Turn's ONNX graph run node by node with torch, on any device (the GPU beside the serving models).

onnxruntime runs the model on the CPU only here (the GPU image has no CUDA build of it), and there a call costs
60-90 ms of a core: sixteen voice sessions that pause together judged their turns in 220-310 ms each on the H200
host, most of their turn decision's growth with the load (``benchmarks/results/gpu_suite.md``, runs 30-32). The
graph is small (Whisper-tiny's encoder and a pooling head, int8 weights and activations in QDQ form: 406 nodes of 20
operator kinds), so it is interpreted here with torch operators, reading the same file and weights:

- every node whose inputs are all constants (the weights' ``DequantizeLinear``, the shape constants) runs once at
  load; the rest run per call, in the graph's order;
- ``QuantizeLinear`` / ``DequantizeLinear`` are computed as the ONNX operators define them (round half to even,
  saturate to the zero point's type), so activations are quantized where the graph quantizes them;
- the products (``MatMul``, ``Conv``, ``Gemm``) of dequantized values run in float64, exact as onnxruntime's fused
  int8 kernels' integer sums are. In float32 their summation order decided which side of a rounding boundary the next
  quantization fell on, and those steps compound over four layers: against onnxruntime's probabilities float32 was
  up to 0.07 off, float64 0.04 (onnxruntime's own unfused run of the same graph differs from its fused one by up to
  0.17 on the tests' clips; the tests bound the difference and require the same decisions);
- shapes (``Shape``, ``Gather``, ``Slice``, ``Concat`` of integers) stay CPU integer tensors; values live on
  ``device``, and so do the constants a node on the device reads (quantization zero points and scales): placed at
  load, never per call. A per-call host-to-device copy of pageable memory waits for the stream's work before it, so
  the first GPU runs, which copied each quantization's zero point per call, spent 125-230 ms of wall time per call
  under load on the H200 host (voice_bench run 33) where the kernels take a few milliseconds.

:class:`SmartTurnTorch` on CUDA computes the features on the GPU too (:class:`~.features.LogMelTorch`: the same
arithmetic in float64), and runs features and graph as one CUDA graph per batch bucket (1, 2, 4, ...
:data:`MAX_BATCH`, captured at load): a call is a copy in, a replay and a copy out, well under a millisecond of host
time instead of the interpreter's tens of milliseconds of Python beside the device worker's (run 33: 40-70 ms of CPU
a call).

Parsing needs the ``onnx`` package (the ``[turn]`` extra).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from omni_stream.errors import ConfigError
from omni_stream.models.smart_turn.features import SAMPLE_RATE, WINDOW, LogMelTorch, last_window, log_mel
from omni_stream.runtime.cuda_graphs import GraphSet, batch_buckets, pick

Attr = int | float | bytes | list[int] | list[float]

# ONNX TensorProto data types of the zero points this graph uses -> the integer range they saturate to
_RANGES = {2: (0, 255), 3: (-128, 127), 6: (-(2**31), 2**31 - 1)}


@dataclass(frozen=True, slots=True)
class _Node:
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Attr]

    def int_attr(self, name: str, default: int) -> int:
        value = self.attrs.get(name, default)
        assert isinstance(value, int), f"{self.op}.{name} is not an integer"
        return value

    def float_attr(self, name: str, default: float) -> float:
        value = self.attrs.get(name, default)
        assert isinstance(value, int | float), f"{self.op}.{name} is not a number"
        return float(value)

    def ints_attr(self, name: str, default: list[int]) -> list[int]:
        value = self.attrs.get(name, default)
        assert isinstance(value, list), f"{self.op}.{name} is not a list"
        return [int(v) for v in value]


class TorchGraph:
    """An ONNX file's graph (one input, one output) run with torch on ``device``."""

    def __init__(self, path: Path, device: str | torch.device = "cpu") -> None:
        try:
            import onnx
            from onnx import helper, numpy_helper
        except ImportError as exc:  # pragma: no cover - the [turn] extra brings it
            raise ConfigError("running Smart Turn with torch needs onnx: pip install 'omni-stream[turn]'") from exc
        model = onnx.load(str(path))
        graph = model.graph
        self.device = torch.device(device)
        self.input = graph.input[0].name
        self.output = graph.output[0].name
        self._ranges: dict[str, tuple[int, int]] = {}
        values: dict[str, torch.Tensor] = {}
        for init in graph.initializer:
            if init.data_type in _RANGES:
                self._ranges[init.name] = _RANGES[init.data_type]
            values[init.name] = self._place(torch.from_numpy(np.array(numpy_helper.to_array(init))))
        self._nodes: list[_Node] = []
        for proto in graph.node:
            if proto.domain not in ("", "ai.onnx"):
                raise ConfigError(f"{path.name}: operator domain {proto.domain!r} is not supported")
            attrs = {a.name: helper.get_attribute_value(a) for a in proto.attribute}
            node = _Node(proto.op_type, tuple(proto.input), tuple(proto.output), attrs)
            if node.op not in _OPS:
                raise ConfigError(f"{path.name}: operator {node.op} is not supported")
            if node.op != "Shape" and all(not name or name in values for name in node.inputs):
                values.update(zip(node.outputs, self._run(node, values), strict=True))  # constant: once, now
            else:
                self._nodes.append(node)
        # The weights the products read, in float64 once here rather than converted on every call
        exact = {name for node in self._nodes if node.op in _EXACT_OPS for name in node.inputs if name in values}
        self._constants = {name: t.double() if name in exact else t for name, t in values.items()}  # read-only
        # Constants a node reads beside device values (quantization zero points and scales): on the device once, here
        for node in self._nodes:
            if node.op in _DEVICE_OPERANDS:
                for k in _DEVICE_OPERANDS[node.op]:
                    name = node.inputs[k] if k < len(node.inputs) else ""
                    if name in self._constants:
                        self._constants[name] = self._constants[name].to(self.device)
        self.zero = torch.zeros((), dtype=torch.float64, device=self.device)  # an absent zero point

    def _place(self, t: torch.Tensor) -> torch.Tensor:
        """Floats on the device; integers (shapes, indices, quantized weights before folding) on the CPU."""
        if t.dtype in (torch.uint8, torch.int8, torch.int32):
            return t.to(
                torch.float64
            )  # quantized values as floats (int32 biases exactly): DequantizeLinear scales them
        return t.to(self.device) if t.is_floating_point() else t

    def _run(self, node: _Node, values: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        args = [values[name] if name else None for name in node.inputs]
        return _OPS[node.op](self, node, args)

    @torch.inference_mode()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        values = dict(self._constants)
        values[self.input] = x.to(self.device, torch.float32)
        for node in self._nodes:
            values.update(zip(node.outputs, self._run(node, values), strict=True))
        return values[self.output]

    def quant_range(self, zero_point_name: str) -> tuple[int, int]:
        return self._ranges.get(zero_point_name, (0, 255))


Op = Callable[[TorchGraph, _Node, list[torch.Tensor | None]], list[torch.Tensor]]


def _req(t: torch.Tensor | None) -> torch.Tensor:
    assert t is not None, "a required input is missing"
    return t


def _ints(t: torch.Tensor | None) -> list[int]:
    return [int(v) for v in _req(t).reshape(-1).tolist()]


def _axis_view(scale: torch.Tensor, x: torch.Tensor, axis: int) -> torch.Tensor:
    """A per-axis parameter shaped to broadcast along ``axis`` of ``x`` (a scalar as it is)."""
    if scale.dim() == 0 or scale.numel() == 1:
        return scale.reshape(())
    shape = [1] * x.dim()
    shape[axis % x.dim()] = scale.numel()
    return scale.reshape(shape)


def _quantize(g: TorchGraph, n: _Node, a: list[torch.Tensor | None]) -> list[torch.Tensor]:
    x, scale = _req(a[0]), _req(a[1])
    zero = a[2] if len(a) > 2 and a[2] is not None else g.zero
    lo, hi = g.quant_range(n.inputs[2]) if len(n.inputs) > 2 else (0, 255)
    axis = n.int_attr("axis", 1)
    s, z = _axis_view(scale, x, axis), _axis_view(zero.to(x.device), x, axis)
    return [torch.clamp(torch.round(x / s) + z, lo, hi)]


def _dequantize(g: TorchGraph, n: _Node, a: list[torch.Tensor | None]) -> list[torch.Tensor]:
    x, scale = _req(a[0]).to(_req(a[1]).device), _req(a[1])
    zero = a[2] if len(a) > 2 and a[2] is not None else g.zero
    axis = n.int_attr("axis", 1)
    # Stored integers (the weights, folded at load) in float64, exact for int32 biases; activations in float32
    z, s = _axis_view(zero.to(x.device, x.dtype), x, axis), _axis_view(scale.to(x.dtype), x, axis)
    return [((x - z) * s).to(torch.float32)]


_EXACT_OPS = frozenset({"MatMul", "Conv", "Gemm"})  # products of dequantized values, computed in float64
# Operands (by input index) that are read beside device values: placed on the device at load when constant. A Gather
# of a shape (CPU integers) does not occur with a constant index here: this graph's shape gathers index computed
# shapes; its device gathers read constant indices.
_DEVICE_OPERANDS: dict[str, tuple[int, ...]] = {"QuantizeLinear": (1, 2), "DequantizeLinear": (1, 2)}


def _exact(t: torch.Tensor | None) -> torch.Tensor:
    return _req(t).to(torch.float64)


def _conv(g: TorchGraph, n: _Node, a: list[torch.Tensor | None]) -> list[torch.Tensor]:
    pads, (stride,), (dilation,) = (
        n.ints_attr("pads", [0, 0]),
        n.ints_attr("strides", [1]),
        n.ints_attr("dilations", [1]),
    )
    if len(pads) != 2 or pads[0] != pads[1] or n.attrs.get("auto_pad", b"NOTSET") != b"NOTSET":
        raise ConfigError(f"Conv with pads {pads} is not supported")
    group = n.int_attr("group", 1)
    bias = _exact(a[2]) if len(a) > 2 and a[2] is not None else None
    x = F.conv1d(_exact(a[0]), _exact(a[1]), bias, stride=stride, padding=pads[0], dilation=dilation, groups=group)
    return [x.to(torch.float32)]


def _matmul(g: TorchGraph, n: _Node, a: list[torch.Tensor | None]) -> list[torch.Tensor]:
    return [torch.matmul(_exact(a[0]), _exact(a[1])).to(torch.float32)]


def _shape(g: TorchGraph, n: _Node, a: list[torch.Tensor | None]) -> list[torch.Tensor]:
    dims = list(_req(a[0]).shape)
    end = n.int_attr("end", len(dims)) if "end" in n.attrs else len(dims)
    return [torch.tensor(dims[n.int_attr("start", 0) : end], dtype=torch.int64)]


def _reshape(g: TorchGraph, n: _Node, a: list[torch.Tensor | None]) -> list[torch.Tensor]:
    x, shape = _req(a[0]), _ints(a[1])
    if not n.int_attr("allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [x.reshape(shape)]


def _gather(g: TorchGraph, n: _Node, a: list[torch.Tensor | None]) -> list[torch.Tensor]:
    data, idx = _req(a[0]), _req(a[1]).to(torch.int64)
    axis = n.int_attr("axis", 0) % data.dim()
    picked = data.index_select(axis, idx.reshape(-1).to(data.device) % data.shape[axis])
    return [picked.reshape(*data.shape[:axis], *idx.shape, *data.shape[axis + 1 :])]


def _slice(g: TorchGraph, n: _Node, a: list[torch.Tensor | None]) -> list[torch.Tensor]:
    data, starts, ends = _req(a[0]), _ints(a[1]), _ints(a[2])
    axes = _ints(a[3]) if len(a) > 3 and a[3] is not None else list(range(len(starts)))
    steps = _ints(a[4]) if len(a) > 4 and a[4] is not None else [1] * len(starts)
    index: list[slice] = [slice(None)] * data.dim()
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        if step != 1:
            raise ConfigError(f"Slice with step {step} is not supported")
        size = data.shape[axis]
        index[axis % data.dim()] = slice(max(-size, min(start, size)), max(-size, min(end, size)))
    return [data[tuple(index)]]


def _concat(g: TorchGraph, n: _Node, a: list[torch.Tensor | None]) -> list[torch.Tensor]:
    return [torch.cat([_req(t) for t in a], dim=n.int_attr("axis", 0))]


def _layer_norm(g: TorchGraph, n: _Node, a: list[torch.Tensor | None]) -> list[torch.Tensor]:
    x = _req(a[0])
    axis = n.int_attr("axis", -1) % x.dim()
    return [F.layer_norm(x, x.shape[axis:], _req(a[1]), a[2] if len(a) > 2 else None, n.float_attr("epsilon", 1e-5))]


def _gemm(g: TorchGraph, n: _Node, a: list[torch.Tensor | None]) -> list[torch.Tensor]:
    x, w = _exact(a[0]), _exact(a[1])
    x = x.T if n.int_attr("transA", 0) else x
    w = w.T if n.int_attr("transB", 0) else w
    y = n.float_attr("alpha", 1.0) * (x @ w)
    if len(a) > 2 and a[2] is not None:
        y = y + n.float_attr("beta", 1.0) * _exact(a[2])
    return [y.to(torch.float32)]


def _reduce_sum(g: TorchGraph, n: _Node, a: list[torch.Tensor | None]) -> list[torch.Tensor]:
    x = _req(a[0])
    axes = _ints(a[1]) if len(a) > 1 and a[1] is not None else []
    keep = bool(n.int_attr("keepdims", 1))
    if not axes:
        return [x if n.int_attr("noop_with_empty_axes", 0) else x.sum().reshape([1] * x.dim() if keep else [])]
    return [x.sum(dim=tuple(axes), keepdim=keep)]


def _binary(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Op:
    return lambda g, n, a: [fn(_req(a[0]), _req(a[1]))]


def _unary(fn: Callable[[torch.Tensor], torch.Tensor]) -> Op:
    return lambda g, n, a: [fn(_req(a[0]))]


_OPS: dict[str, Op] = {
    "QuantizeLinear": _quantize,
    "DequantizeLinear": _dequantize,
    "Conv": _conv,
    "Shape": _shape,
    "Reshape": _reshape,
    "Gather": _gather,
    "Slice": _slice,
    "Concat": _concat,
    "LayerNormalization": _layer_norm,
    "Gemm": _gemm,
    "ReduceSum": _reduce_sum,
    "Transpose": lambda g, n, a: [_req(a[0]).permute(*n.ints_attr("perm", []))],
    "Softmax": lambda g, n, a: [torch.softmax(_req(a[0]), dim=n.int_attr("axis", -1))],
    "MatMul": _matmul,
    "Add": _binary(torch.add),
    "Mul": _binary(torch.mul),
    "Div": _binary(torch.div),
    "Erf": _unary(torch.erf),
    "Tanh": _unary(torch.tanh),
    "Sigmoid": _unary(torch.sigmoid),
}


MAX_BATCH = 32  # turns judged in one replay; a larger call runs in slices of this many
HIGH_PRIORITY = -100  # CUDA clamps a stream's priority to the device's range: this is its highest


class SmartTurnTorch:
    """:class:`~omni_stream.models.smart_turn.model.SmartTurn`'s interface with its graph run by torch on
    ``device``. On CUDA (see the module docstring) the features are computed there too and a call replays one
    captured CUDA graph per :data:`MAX_BATCH` turns (``graphs=False``: the same work run eagerly, for comparison)."""

    sample_rate = SAMPLE_RATE
    # Sessions that pause together are judged in one call: one replay for one turn or thirty-two
    batches = True

    def __init__(
        self, path: Path, device: str | torch.device = "cpu", *, graphs: bool = True, staged: bool | None = None
    ) -> None:
        self.path = path
        self.graph = TorchGraph(path, device)
        cuda = self.graph.device.type == "cuda"
        # ``staged`` (default: on CUDA): features by torch and static buffers filled per bucket, the path a CUDA graph
        # replays (on the CPU only for tests of its buckets and slices); else numpy's features and exact shapes
        self.staged = cuda if staged is None else staged
        # On CUDA its kernels go to a stream of their own: the calls come from the sessions' threads, beside the
        # device worker's (whose graph captures are thread-local, so a call here never breaks one). The stream has
        # the highest priority: a judgement is on every turn's critical path, and on a stream of normal priority its
        # kernels queued behind the worker's already launched ones (a Whisper encoder pass of 16-32 utterances, the
        # newcomers' prefills): voice_bench run 43 saw calls of 19-79 ms of wall time (5-15 ms of host) at 16-32
        # sessions, where the kernels take a few milliseconds.
        self._stream = torch.cuda.Stream(self.graph.device, priority=HIGH_PRIORITY) if cuda else None
        # One call at a time on the device: the static buffers (and the stream) are shared
        self._lock = threading.Lock()
        self._graphs: GraphSet | None = None
        self.buckets = batch_buckets(MAX_BATCH)
        if self.staged:
            self._mel = LogMelTorch(self.graph.device)
            host = torch.zeros((MAX_BATCH, WINDOW), dtype=torch.float32)
            self._host = host.pin_memory() if cuda else host
            self._in = torch.zeros((MAX_BATCH, WINDOW), dtype=torch.float32, device=self.graph.device)
            self._out = torch.zeros(MAX_BATCH, dtype=torch.float32, device=self.graph.device)
            if graphs and cuda:
                self._graphs = GraphSet(self._step, self.graph.device)
                with self._lock:
                    self._graphs.capture_all([(b,) for b in self.buckets], desc="capturing Smart Turn")

    def _step(self, rows: int) -> None:
        """Features and graph for the first ``rows`` windows of the static input, into the static output."""
        self._out[:rows].copy_(self.graph(self._mel(self._in[:rows])).reshape(rows))

    def probabilities(self, turns: Sequence[np.ndarray]) -> np.ndarray:
        """P(the turn is complete) for each turn's audio (float32 mono at 16 kHz; its last 8 s are read)."""
        if not turns:
            return np.zeros(0, np.float32)
        if not self.staged:
            windows = np.stack([last_window(t) for t in turns])
            out = self.graph(torch.from_numpy(log_mel(windows))).cpu()
            return np.asarray(out.float().numpy(), np.float32).reshape(len(turns))
        parts = [self._on_device(turns[i : i + MAX_BATCH]) for i in range(0, len(turns), MAX_BATCH)]
        return np.concatenate(parts).astype(np.float32)

    def _on_device(self, turns: Sequence[np.ndarray]) -> np.ndarray:
        n = len(turns)
        rows = pick(self.buckets, n)
        assert rows is not None
        on_stream = torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext()
        with self._lock, on_stream:  # copies, kernels and the copy back in order on the model's stream
            host = self._host.numpy()
            for i, turn in enumerate(turns):  # each turn's last window straight into its row (as last_window)
                x = np.asarray(turn, np.float32).reshape(-1)[-WINDOW:]
                host[i, : WINDOW - x.size] = 0.0
                host[i, WINDOW - x.size :] = x
            self._in[:n].copy_(self._host[:n], non_blocking=self._stream is not None)
            if rows > n:
                self._in[n:rows].zero_()  # silent rows fill the bucket (their answers are dropped)
            if self._graphs is None or not self._graphs.replay((rows,)):
                self._step(rows)
            return self._out[:n].cpu().numpy().copy()

    def probability(self, turn: np.ndarray) -> float:
        """P(complete) for one turn's audio (float32 mono at 16 kHz)."""
        return float(self.probabilities([turn])[0])
