"""Silero VAD (v6, 16 kHz) as a stateless torch module whose weights come from the ``silero-vad`` wheel.

The wheel's model objects keep a stream's state (the last 64 samples and the LSTM's h and c) inside
themselves, so one object serves one stream. This module is the same network with that state passed in and
out (:class:`SileroState`): one loaded copy serves every stream and thread, and a stream's state is 1 KB.
The weights are those of the wheel's ``silero_vad.jit`` (what its ``load_silero_vad()`` loads); nothing is
downloaded. The wheel's package is located, never imported here: importing ``silero_vad`` calls
``torch.set_num_threads(1)`` for the whole process.
"""

from __future__ import annotations

import importlib.util
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from omni_stream.errors import ConfigError
from omni_stream.runtime.intra_op import one_intra_op_thread

SAMPLE_RATE = 16000
CHUNK = 512  # samples per speech probability (32 ms)
CONTEXT = 64  # samples of the previous chunk the network sees before each chunk
HIDDEN = 128
JIT_FILE = "silero_vad.jit"

# The jit file's parameter names -> ours.
_NAMES = {
    "stft.forward_basis_buffer": "stft_basis",
    **{f"encoder.{i}.reparam_conv.{p}": f"encoder.{i}.{p}" for i in range(4) for p in ("weight", "bias")},
    **{f"decoder.rnn.{p}": f"lstm.{p}" for p in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")},
    "decoder.decoder.2.weight": "head.weight",
    "decoder.decoder.2.bias": "head.bias",
}


@dataclass(slots=True, frozen=True)
class SileroState:
    """One stream's network state: the last ``CONTEXT`` samples seen and the LSTM's ``h`` and ``c`` (1 x 128)."""

    context: torch.Tensor
    h: torch.Tensor
    c: torch.Tensor

    @classmethod
    def initial(cls) -> SileroState:
        return cls(torch.zeros(CONTEXT), torch.zeros(1, HIDDEN), torch.zeros(1, HIDDEN))


class SileroNet(nn.Module):
    """STFT magnitude -> 4 convolutions -> LSTM cell -> speech probability, one per 512-sample chunk."""

    def __init__(self) -> None:
        super().__init__()
        self.stft_basis: torch.Tensor
        self.register_buffer("stft_basis", torch.zeros(258, 1, 256))  # real and imaginary rows of a 256-point DFT
        self.encoder: list[nn.Conv1d] = nn.ModuleList(  # type: ignore[assignment]
            [
                nn.Conv1d(129, 128, 3, stride=1, padding=1),
                nn.Conv1d(128, 64, 3, stride=2, padding=1),
                nn.Conv1d(64, 64, 3, stride=2, padding=1),
                nn.Conv1d(64, 128, 3, stride=1, padding=1),
            ]
        )
        self.lstm = nn.LSTMCell(HIDDEN, HIDDEN)
        self.head = nn.Conv1d(HIDDEN, 1, 1)

    def features(self, windows: torch.Tensor) -> torch.Tensor:
        """``[n, CONTEXT + CHUNK]`` samples -> ``[n, 128]`` encoder features (chunks independent of each other).

        The convolutions run as unfold + matrix products: on these tiny shapes oneDNN's convolution spins up
        every OpenMP thread and took 11 ms a chunk on two busy cores, the products 0.2 ms (same results).
        """
        x = nn.functional.pad(windows, (0, CONTEXT), mode="reflect")
        frames = x.unfold(1, 256, 128)  # [n, 4, 256]
        spec = frames @ self.stft_basis[:, 0, :].T  # [n, 4, 258]: 129 real, 129 imaginary
        x = (spec[..., :129] ** 2 + spec[..., 129:] ** 2).sqrt().transpose(1, 2)  # [n, 129, 4]
        for conv in self.encoder:
            x = _conv3(x, conv).relu()
        return x.squeeze(-1)

    @torch.inference_mode()
    def probabilities(self, chunks: torch.Tensor, state: SileroState) -> tuple[torch.Tensor, SileroState]:
        """Speech probabilities of consecutive ``[n, CHUNK]`` chunks of one stream, and the state after them.

        Runs on one intra-op thread of the calling thread (:mod:`omni_stream.runtime.intra_op`): streams are fed
        from threads beside the device worker's."""
        n = chunks.shape[0]
        if n == 0:
            return torch.zeros(0), state
        with one_intra_op_thread():
            return self._probabilities(chunks, state)

    def _probabilities(self, chunks: torch.Tensor, state: SileroState) -> tuple[torch.Tensor, SileroState]:
        n = chunks.shape[0]
        stream = torch.cat((state.context, chunks.reshape(-1)))
        windows = stream.unfold(0, CONTEXT + CHUNK, CHUNK)  # chunk i with the 64 samples before it
        feats = self.features(windows)  # the convolutions run once for all n chunks
        h, c = state.h, state.c
        hs = []
        for i in range(n):  # the LSTM carries the stream's memory from chunk to chunk
            h, c = self.lstm(feats[i : i + 1], (h, c))
            hs.append(h)
        assert self.head.bias is not None
        out = (torch.cat(hs).relu() @ self.head.weight[:, :, 0].T + self.head.bias).sigmoid().reshape(n)
        return out, SileroState(stream[-CONTEXT:].clone(), h, c)


def _conv3(x: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """``conv(x)`` for a kernel of 3 with padding 1, as one matrix product over unfolded frames."""
    n, channels, _ = x.shape
    cols = nn.functional.pad(x, (1, 1)).unfold(2, 3, conv.stride[0])  # [n, channels, t, 3]
    cols = cols.permute(0, 2, 1, 3).reshape(n, -1, channels * 3)
    assert conv.bias is not None
    return (cols @ conv.weight.reshape(conv.out_channels, -1).T + conv.bias).transpose(1, 2)


def wheel_data_dir() -> Path:
    """The installed ``silero_vad`` package's ``data/`` folder, found without importing the package."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or spec.origin is None:
        raise ConfigError("the silero-vad package is not installed (pip install silero-vad)")
    return Path(spec.origin).parent / "data"


_LOCK = threading.Lock()
_NET: SileroNet | None = None


def load_silero_net() -> SileroNet:
    """The network with the wheel's weights, loaded once per process (then shared; it holds no stream state)."""
    global _NET
    with _LOCK:
        if _NET is None:
            path = wheel_data_dir() / JIT_FILE
            if not path.is_file():
                raise ConfigError(f"the silero-vad wheel has no {JIT_FILE} at {path}")
            with warnings.catch_warnings():  # torch 2.13 deprecates jit loading; the wheel ships this format
                warnings.simplefilter("ignore", DeprecationWarning)
                jit = torch.jit.load(str(path), map_location="cpu")
            weights = {_NAMES[k]: v for k, v in jit._model.state_dict().items() if k in _NAMES}
            net = SileroNet()
            net.load_state_dict(weights, strict=True)
            _NET = net.eval().requires_grad_(False)
        return _NET
