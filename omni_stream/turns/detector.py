"""One stream's turn detector: voice activity, pauses, and the end of each turn (blocking CPU work).

``TurnDetector(rule, vad, model)`` takes the stream's audio (int16 mono at ``rate``, 24 kHz by default) in order
and returns :class:`TurnEvent` s with stream positions (samples since the stream began, at ``rate``):

- ``started``: a turn begins (the position includes the rule's prefix padding);
- ``quiet``: the speech has been quiet for the rule's ``quiet_ms`` (a semantic rule's; with a VAD that honours it):
  the position is where a pause there will put the turn's end, so work on the turn's audio can start now, before
  the pause; a ``resumed`` follows if the speech goes on first;
- ``paused``: the speech paused for the rule's ``pause_ms``; the position is where the turn's audio would end
  if the turn ended here;
- ``resumed``: speech went on after a pause (the turn goes on; whatever was started at the pause is stale);
- ``stopped``: the turn ended at its last pause's position (the model judged it complete, or the silence
  reached ``max_pause_ms``).

The voice activity detector (any :class:`~omni_stream.turns.vad.VoiceActivityDetector`, e.g. Silero) runs with
the rule's short ``pause_ms`` silence and is fed 20 ms at a time, so the time a pause was detected is known to
20 ms; ``max_pause_ms`` is counted from there in stream samples, never by a clock. The end-of-turn model (an
:class:`EndOfTurnModel`, e.g. Smart Turn) is asked once per pause, on the turn's last 8 s up to where the pause
was noticed (its silence included, as the model was trained), at its rate (where the VAD reads that rate, the
audio the VAD was given, kept as it came), by :meth:`TurnDetector.judge`, which a caller runs after handing on
``feed``'s events: whatever starts at a pause (a speculative transcript) then overlaps the model's inference.
``judge`` after every ``feed``; both are blocking CPU work: run them off the event loop (a realtime session's driver
does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, TypeAlias, cast

import numpy as np

from omni_stream.codecs.resample import Resampler, resample
from omni_stream.turns.rules import TurnRule
from omni_stream.turns.vad import BatchedVad, PiecewiseVad, VadEvent, VadEventKind, VoiceActivityDetector

RATE = 24000
SLICE_MS = 20  # the detector is fed this much at a time: the resolution of pause timing
MODEL_SECONDS = 8  # audio the end-of-turn model reads


class TurnEventKind(StrEnum):
    STARTED = "started"
    QUIET = "quiet"
    PAUSED = "paused"
    RESUMED = "resumed"
    STOPPED = "stopped"


@dataclass(slots=True, frozen=True)
class TurnEvent:
    kind: TurnEventKind
    position: int  # stream samples at the detector's rate


class EndOfTurnModel(Protocol):
    """A trained end-of-turn classifier: P(the speaker has finished) for a turn's audio at ``sample_rate``, or for
    several turns at once. ``batches``: whether sessions that pause together are best judged in one call (a model on
    the GPU) rather than in concurrent calls (onnxruntime on CPU cores: a batch of 16 took 0.86 s on two cores where
    16 concurrent calls took 0.51 s)."""

    @property
    def sample_rate(self) -> int: ...

    @property
    def batches(self) -> bool: ...

    def probability(self, turn: np.ndarray) -> float: ...

    def probabilities(self, turns: list[np.ndarray]) -> np.ndarray: ...


TurnModelFactory: TypeAlias = Callable[[], EndOfTurnModel]
"""Gives the end-of-turn model (the serving role ``"turn_model"``: :data:`omni_stream.family_registry.TURN_MODEL`)."""


class _Tail:
    """The last ``keep`` samples appended (at least), in a buffer of twice that: an append copies only itself,
    and the kept ones move to the front once per ``keep`` samples (a concatenation per append copied all of them)."""

    def __init__(self, keep: int, dtype: type) -> None:
        self._buf: np.ndarray = np.zeros(2 * keep, dtype)
        self._keep = keep
        self._n = 0  # samples held, at the front
        self.end = 0  # samples appended since the start (the index past the last one)

    def append(self, x: np.ndarray) -> None:
        if x.size >= self._keep:
            self._buf[: self._keep] = x[-self._keep :]
            self._n = self._keep
        else:
            if self._n + x.size > self._buf.size:
                self._buf[: self._keep] = self._buf[self._n - self._keep : self._n]
                self._n = self._keep
            self._buf[self._n : self._n + x.size] = x
            self._n += x.size
        self.end += x.size

    def span(self, lo: int, hi: int) -> np.ndarray:
        """Samples ``lo..hi`` (indices since the start), clipped to what is held (a copy)."""
        first = self.end - self._n
        lo, hi = max(lo, first), min(hi, self.end)
        return self._buf[lo - first : max(lo, hi) - first].copy()


class TurnDetector:
    """See the module docstring. ``model`` is needed when the rule is semantic."""

    def __init__(
        self, rule: TurnRule, vad: VoiceActivityDetector, model: EndOfTurnModel | None = None, *, rate: int = RATE
    ) -> None:
        if rule.semantic and model is None:
            raise ValueError("a semantic turn rule needs an end-of-turn model")
        self.rule = rule
        self.vad = vad
        self.model = model
        self.rate = rate
        self._slice = rate * SLICE_MS // 1000
        self._keep = rate * MODEL_SECONDS + rate  # recent audio kept for the model
        self.probabilities: list[float] = []  # the model's answers, in order (tests, benchmarks)
        self.reset(0)

    def reset(self, position: int) -> None:
        """Forget the stream; the next sample fed is at stream ``position``."""
        self.vad.reset()
        vad_rate = self.vad.sample_rate
        self._to_vad = Resampler(self.rate, vad_rate) if vad_rate != self.rate else None
        self.origin = self.fed = position
        self._recent = _Tail(self._keep, np.int16)  # the last samples fed (index 0: stream position origin)
        # The end-of-turn model's audio at its rate, where the VAD reads that rate too: the VAD's resampled stream,
        # kept as it goes (resampling a pause's 8 s at once cost ~10 ms of a core per judged pause)
        model_rate = self.model.sample_rate if self.model is not None else None
        self._model_audio = (
            _Tail(model_rate * (MODEL_SECONDS + 1), np.float32)
            if self._to_vad is not None and model_rate == vad_rate
            else None
        )
        self._turn_start: int | None = None
        self._paused_at: int | None = None  # the open pause's position
        self._quiet_at: int | None = None  # the open quiet's position (a pause there may follow)
        self._noticed = 0  # samples fed when the open pause was noticed
        self._unjudged = False  # the open pause awaits the end-of-turn model
        self._deadline = 0  # stream position at which the open pause ends the turn

    @property
    def speaking(self) -> bool:
        """Whether a turn is open (started, not stopped)."""
        return self._turn_start is not None

    def feed(self, samples: np.ndarray) -> list[TurnEvent]:
        """The next samples (int16 mono at ``rate``); the turn events they complete, in order."""
        return feed_many([(self, samples)])[0]

    def _take(self, samples: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The samples' 20 ms slices, and each one for the VAD (float32 at its rate); the audio is remembered."""
        samples = np.asarray(samples, np.int16).reshape(-1)
        self._recent.append(samples)
        slices = [samples[i : i + self._slice] for i in range(0, samples.size, self._slice)]
        floats = [piece.astype(np.float32) / 32768.0 for piece in slices]
        if self._to_vad is None:
            return slices, floats
        resampled = self._to_vad.process_pieces(floats)
        if self._model_audio is not None:
            for piece in resampled:
                self._model_audio.append(piece)
        return slices, resampled

    def _advance(self, slices: list[np.ndarray], judged: list[list[VadEvent]]) -> list[TurnEvent]:
        """The turn events of the slices, given the VAD's events for each."""
        events: list[TurnEvent] = []
        for piece, vad_events in zip(slices, judged, strict=True):
            self.fed += piece.size
            for event in vad_events:
                position = self.origin + round(event.sample * self.rate / self.vad.sample_rate)
                if event.kind is VadEventKind.SPEECH_STARTED:
                    events.extend(self._started(position))
                elif event.kind is VadEventKind.SPEECH_QUIET:
                    events.extend(self._quiet(position))
                else:
                    events.extend(self._paused(position))
            if self._paused_at is not None and self.fed >= self._deadline:
                events.append(self._stop())
        return events

    @property
    def judging(self) -> bool:
        """Whether an open pause awaits :meth:`judge`."""
        return self._unjudged and self._paused_at is not None

    def judge(self) -> list[TurnEvent]:
        """Ask the end-of-turn model about the open pause, once: ``[stopped]`` when it judges the turn complete."""
        return judge_many([self])[0]

    def _pause_audio(self) -> np.ndarray | None:
        """The open pause's audio for the model, once (None: no pause awaits it)."""
        if not self._unjudged or self._paused_at is None:
            return None
        self._unjudged = False
        assert self.model is not None and self.rule.threshold is not None
        # The model hears the silence too, up to when the pause was noticed (as it was trained: the turn's audio up
        # to the VAD's stop, whose silence it weighs); the turn's own audio still ends at the pause.
        return self._turn_audio(self._noticed)

    def _decide(self, p: float) -> list[TurnEvent]:
        assert self.rule.threshold is not None
        self.probabilities.append(p)
        return [self._stop()] if p >= self.rule.threshold else []

    def _started(self, position: int) -> list[TurnEvent]:
        if self._paused_at is not None or self._quiet_at is not None:
            self._paused_at, self._quiet_at, self._unjudged = None, None, False
            return [TurnEvent(TurnEventKind.RESUMED, position)]
        if self._turn_start is not None:
            return []
        self._turn_start = position
        return [TurnEvent(TurnEventKind.STARTED, position)]

    def _quiet(self, position: int) -> list[TurnEvent]:
        if self._turn_start is None or self._paused_at is not None:
            return []
        self._quiet_at = position = max(position, self._turn_start)
        return [TurnEvent(TurnEventKind.QUIET, position)]

    def _paused(self, position: int) -> list[TurnEvent]:
        if self._turn_start is None:
            return []
        position = max(position, self._turn_start)
        self._paused_at, self._quiet_at = position, None
        self._noticed = self.fed
        self._unjudged = self.model is not None and self.rule.threshold is not None
        # Counted from when the pause was noticed (pause_ms after the speech), so the turn ends max_pause_ms after it.
        self._deadline = self.fed + (self.rule.max_pause_ms - self.rule.pause_ms) * self.rate // 1000
        return [TurnEvent(TurnEventKind.PAUSED, position)]

    def _turn_audio(self, end: int) -> np.ndarray:
        """The turn's last seconds up to ``end``, float32 at the model's rate."""
        assert self.model is not None and self._turn_start is not None
        lo = max(self._turn_start, end - self.rate * MODEL_SECONDS)
        if self._model_audio is not None and self._to_vad is not None:
            # the VAD's resampled stream: model index k is at stream time k / rate
            model_rate, kept = self.model.sample_rate, self._model_audio
            k_lo = -(-(lo - self.origin) * model_rate // self.rate)
            k_hi = (end - self.origin) * model_rate // self.rate
            x = kept.span(k_lo, k_hi)
            missing = k_hi - max(k_lo, min(k_hi, kept.end))
            if missing > 0:  # the last ~20 ms wait for the resampler's lookahead: resampled at once, as the pause ends
                src = missing * self.rate // model_rate + 2 * self._to_vad.lookahead + 1
                recent = self._recent.span(end - self.origin - src, end - self.origin).astype(np.float32) / 32768.0
                x = np.concatenate((x, resample(recent, self.rate, model_rate)[-missing:]))
            return x
        x = self._recent.span(lo - self.origin, end - self.origin).astype(np.float32) / 32768.0
        return x if self.model.sample_rate == self.rate else resample(x, self.rate, self.model.sample_rate)

    def _stop(self) -> TurnEvent:
        assert self._paused_at is not None
        position, self._paused_at, self._turn_start, self._unjudged = self._paused_at, None, None, False
        self._quiet_at = None
        return TurnEvent(TurnEventKind.STOPPED, position)


_VAD_KINDS: dict[type, type] = {}


def _vad_kind(vad: VoiceActivityDetector) -> type:
    """Which of the VAD protocols ``vad``'s class offers (``BatchedVad``, ``PiecewiseVad`` or the plain one), checked
    once per class: a runtime protocol check walks the protocol's members on every call, and a server's feed pass
    made two per session (a sixth of a 16-session pass's CPU time on a turn-detection thread, holding the GIL)."""
    kind = _VAD_KINDS.get(type(vad))
    if kind is None:
        kind = next((p for p in (BatchedVad, PiecewiseVad) if isinstance(vad, p)), VoiceActivityDetector)
        _VAD_KINDS[type(vad)] = kind
    return kind


def feed_many(feeds: Sequence[tuple[TurnDetector, np.ndarray]]) -> list[list[TurnEvent]]:
    """``[detector.feed(samples) for detector, samples in feeds]``, the detectors' VADs judged together where their
    class can (:class:`~omni_stream.turns.vad.BatchedVad`: one network call for every stream of that class).

    A realtime server's sessions hand their appends of one event-loop pass to one call of this (on a preparation
    thread). A detector listed twice is fed in order."""
    out: list[list[TurnEvent]] = [[] for _ in feeds]
    left = list(range(len(feeds)))
    while left:  # a round feeds each detector once
        now: list[int] = []
        later: list[int] = []
        in_round: set[int] = set()
        for i in left:
            (later if id(feeds[i][0]) in in_round else now).append(i)
            in_round.add(id(feeds[i][0]))
        taken = {i: feeds[i][0]._take(feeds[i][1]) for i in now}
        judged: dict[int, list[list[VadEvent]]] = {}
        by_class: dict[type[BatchedVad], list[int]] = {}
        for i in now:
            vad = feeds[i][0].vad
            kind = _vad_kind(vad)
            if kind is BatchedVad:
                by_class.setdefault(type(cast(BatchedVad, vad)), []).append(i)
            elif kind is PiecewiseVad:
                judged[i] = cast(PiecewiseVad, vad).feed_pieces(taken[i][1])
            else:
                judged[i] = [vad.feed(piece) for piece in taken[i][1]]
        for batched, group in by_class.items():
            batch = batched.feed_many([(cast(BatchedVad, feeds[i][0].vad), taken[i][1]) for i in group])
            judged.update(zip(group, batch, strict=True))
        for i in now:
            out[i] = feeds[i][0]._advance(taken[i][0], judged[i])
        left = later
    return out


def judge_many(detectors: Sequence[TurnDetector]) -> list[list[TurnEvent]]:
    """``[detector.judge() for detector in detectors]``, the open pauses of detectors that share a model judged in one
    call of its ``probabilities`` (a realtime server hands it the pauses of one event-loop pass when the model
    :attr:`~EndOfTurnModel.batches`)."""
    out: list[list[TurnEvent]] = [[] for _ in detectors]
    audio = {i: d._pause_audio() for i, d in enumerate(detectors)}
    by_model: dict[int, list[int]] = {}
    for i, d in enumerate(detectors):
        if audio[i] is not None:
            by_model.setdefault(id(d.model), []).append(i)
    for group in by_model.values():
        model = detectors[group[0]].model
        assert model is not None
        probabilities = model.probabilities([cast(np.ndarray, audio[i]) for i in group])
        for i, p in zip(group, probabilities.tolist(), strict=True):
            out[i] = detectors[i]._decide(float(p))
    return out
