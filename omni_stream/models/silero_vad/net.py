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
from collections.abc import Sequence
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
        return self.probabilities_many([(chunks, state)])[0]

    @torch.inference_mode()
    def probabilities_many(
        self, streams: Sequence[tuple[torch.Tensor, SileroState]]
    ) -> list[tuple[torch.Tensor, SileroState]]:
        """:meth:`probabilities` of several streams (each ``[n_i, CHUNK]`` chunks and its state) in one pass.

        Every stream's chunks go through the convolutions as one batch and the LSTM steps the streams together
        (row ``j`` of step ``k`` is stream ``j``'s chunk ``k``). A realtime server's sessions append audio at the
        same moments: judged one stream at a time, each call's ~30 small torch operations held the GIL for about a
        millisecond, and 32 sessions' appends of one pass queued ~250 ms behind each other on a preparation thread
        (``voice_bench``, run 30). Results equal the one-stream call's up to float rounding of the batched products.
        """
        if not streams:
            return []
        with one_intra_op_thread():
            return self._probabilities(streams)

    def _probabilities(
        self, streams: Sequence[tuple[torch.Tensor, SileroState]]
    ) -> list[tuple[torch.Tensor, SileroState]]:
        counts = [int(chunks.shape[0]) for chunks, _ in streams]
        # Longest first: the streams still running at step k are then the first rows, a slice.
        order = sorted(range(len(streams)), key=lambda j: -counts[j])
        joined = [torch.cat((streams[j][1].context, streams[j][0].reshape(-1))) for j in order]
        longest = counts[order[0]]
        if longest == 0:
            return [(torch.zeros(0), state) for _, state in streams]
        # chunk i of each stream with the 64 samples before it; the convolutions run once for every chunk
        windows = [x.unfold(0, CONTEXT + CHUNK, CHUNK) for x, j in zip(joined, order, strict=True) if counts[j]]
        feats = self.features(torch.cat(windows) if len(windows) > 1 else windows[0])
        running = [counts[j] for j in order if counts[j]]
        steps = nn.utils.rnn.pad_sequence(list(feats.split(running)), batch_first=True)  # [streams, longest, 128]
        h = torch.cat([streams[j][1].h for j in order])
        c = torch.cat([streams[j][1].c for j in order])
        seen = torch.zeros(len(order), longest, HIDDEN)
        for k in range(longest):  # the LSTM carries each stream's memory from chunk to chunk
            m = sum(1 for n in running if n > k)
            hk, ck = self.lstm(steps[:m, k], (h[:m], c[:m]))
            h, c = torch.cat((hk, h[m:])), torch.cat((ck, c[m:]))
            seen[:m, k] = hk
        assert self.head.bias is not None
        probs = (seen.relu() @ self.head.weight[:, :, 0].T + self.head.bias).sigmoid().squeeze(-1)  # [streams, longest]
        out: list[tuple[torch.Tensor, SileroState]] = [(torch.zeros(0), state) for _, state in streams]
        for row, j in enumerate(order):
            if counts[j]:
                state = SileroState(joined[row][-CONTEXT:].clone(), h[row : row + 1], c[row : row + 1])
                out[j] = (probs[row, : counts[j]], state)
        return out


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
