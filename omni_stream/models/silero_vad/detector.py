"""``SileroVad``: a :class:`~omni_stream.turns.vad.VoiceActivityDetector` for one stream, on the wheel's Silero network.

Input at any rate is resampled to 16 kHz (the band-limited streaming resampler of ``omni_stream.codecs``,
which places output sample ``k`` exactly at input time ``k * rate / 16000``), cut into 32 ms chunks, turned
into speech probabilities by the shared network with this stream's state, and judged by the ``server_vad``
turn rule (:mod:`.turns`). Event positions are reported in input samples. ``feed`` is blocking CPU work
(about 0.5 ms per 32 ms chunk on one core): call it off the event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

from omni_stream.codecs.resample import Resampler
from omni_stream.errors import InvalidRequestError
from omni_stream.models.silero_vad.net import CHUNK, SAMPLE_RATE, SileroNet, SileroState, load_silero_net
from omni_stream.models.silero_vad.turns import TurnRule, TurnState, advance
from omni_stream.turns.vad import BatchedVad, PiecewiseVad, VadEvent, VadParams
from omni_stream.validation.audio import mono_float


class SileroVad:
    """One stream's detector: ``params`` (server_vad), input ``sample_rate`` in Hz (default 16000).

    ``net``: the shared network (default: the wheel's, loaded once per process).
    """

    def __init__(
        self, params: VadParams | None = None, sample_rate: int = SAMPLE_RATE, *, net: SileroNet | None = None
    ) -> None:
        if sample_rate <= 0:
            raise InvalidRequestError(f"sample_rate must be positive, got {sample_rate}", "sample_rate")
        self._params = params or VadParams()
        self._rate = sample_rate
        self._net = net or load_silero_net()
        self._rule = TurnRule.of(self._params, SAMPLE_RATE, CHUNK)
        self.reset()

    @property
    def sample_rate(self) -> int:
        return self._rate

    @property
    def params(self) -> VadParams:
        return self._params

    @property
    def speaking(self) -> bool:
        """Whether a turn is open (started and not yet stopped)."""
        return self._turn.speaking

    def reset(self) -> None:
        """Forget the stream so far (a cleared input buffer); positions restart at 0."""
        self._resampler = Resampler(self._rate, SAMPLE_RATE) if self._rate != SAMPLE_RATE else None
        self._held = np.zeros(0, np.float32)  # 16 kHz samples short of a whole chunk
        self._state = SileroState.initial()
        self._turn = TurnState()

    def feed(self, samples: np.ndarray) -> list[VadEvent]:
        """Take the next samples (float32 or int16, mono or (n, channels)); the turn events they complete."""
        return self.feed_pieces([samples])[0]

    def feed_pieces(self, pieces: Sequence[np.ndarray]) -> list[list[VadEvent]]:
        """The events each of consecutive ``pieces`` completes, as ``feed`` one piece after another would give them,
        from one network call over all their chunks (the chunks' features are independent; the LSTM runs in order)."""
        return SileroVad.feed_many([(self, pieces)])[0]

    @staticmethod
    def feed_many(items: Sequence[tuple[PiecewiseVad, Sequence[np.ndarray]]]) -> list[list[list[VadEvent]]]:
        """``[vad.feed_pieces(pieces) for vad, pieces in items]`` (every ``vad`` a :class:`SileroVad`), with one
        network call per shared network for all the streams' chunks (:meth:`SileroNet.probabilities_many`). A
        detector listed twice is fed in order: its second pieces go in a later call."""
        vads: list[SileroVad] = []
        for vad, _ in items:
            if not isinstance(vad, SileroVad):
                raise TypeError(f"SileroVad.feed_many feeds SileroVad detectors, not {type(vad).__name__}")
            vads.append(vad)
        out: list[list[list[VadEvent]]] = [[] for _ in items]
        rounds: list[list[int]] = []  # round r: each detector's r-th pieces
        fed: dict[int, int] = {}
        for i, vad in enumerate(vads):
            r = fed.get(id(vad), 0)
            fed[id(vad)] = r + 1
            if r == len(rounds):
                rounds.append([])
            rounds[r].append(i)
        for now in rounds:
            taken = {i: vads[i]._take(items[i][1]) for i in now}
            by_net: dict[int, list[int]] = {}  # the streams with whole chunks, by the network they share
            for i in now:
                if taken[i][1] is not None:
                    by_net.setdefault(id(vads[i]._net), []).append(i)
            values: dict[int, list[float]] = {}
            for group in by_net.values():
                streams = [(cast(torch.Tensor, taken[i][1]), vads[i]._state) for i in group]
                for i, (probs, state) in zip(group, vads[group[0]]._net.probabilities_many(streams), strict=True):
                    vads[i]._state = state
                    values[i] = probs.tolist()
            for i in now:
                out[i] = vads[i]._advance(taken[i][0], values.get(i, []))
        return out

    def _take(self, pieces: Sequence[np.ndarray]) -> tuple[list[int], torch.Tensor | None]:
        """The whole chunks' count each piece completes, and those chunks (``[n, CHUNK]`` at 16 kHz; None: none)."""
        held, counts, whole = self._held, [], []
        floats = [mono_float(samples) for samples in pieces]
        # One resampler pass over the pieces (each one's outputs as process gives them): per piece, the resampler's
        # Python was a third of a 100 ms append's cost.
        for x in self._resampler.process_pieces(floats) if self._resampler is not None else floats:
            held = np.concatenate((held, x)) if held.size else x
            n = held.size // CHUNK
            counts.append(n)
            if n:
                whole.append(held[: n * CHUNK])
                held = held[n * CHUNK :]
        self._held = held.copy()
        if not whole:
            return counts, None
        samples_16k = np.ascontiguousarray(np.concatenate(whole) if len(whole) > 1 else whole[0])
        return counts, torch.from_numpy(samples_16k).reshape(-1, CHUNK)

    def _advance(self, counts: list[int], values: list[float]) -> list[list[VadEvent]]:
        """Each piece's events from its chunks' speech probabilities (``values``, in order)."""
        events: list[list[VadEvent]] = []
        start = 0
        for n in counts:
            self._turn, judged = advance(self._turn, values[start : start + n], self._rule)
            start += n
            events.append([VadEvent(e.kind, self._to_input(e.sample)) for e in judged])
        return events

    def _to_input(self, sample: int) -> int:
        return sample if self._rate == SAMPLE_RATE else round(sample * self._rate / SAMPLE_RATE)


if TYPE_CHECKING:  # the type checker proves SileroVad satisfies the protocol a realtime session drives
    _detector: BatchedVad = SileroVad()
