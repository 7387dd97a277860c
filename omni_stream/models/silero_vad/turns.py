"""The turn rule of OpenAI's ``server_vad``, as a pure function over per-chunk speech probabilities.

A chunk is speech when its probability is at least ``threshold``. A turn starts at the first speech chunk;
its ``speech_started`` event sits ``prefix_padding_ms`` before that chunk (never before the previous turn's
end, never before the stream's start), so the turn's audio holds the lead-in. A turn stops once
``silence_duration_ms`` have passed since the end of its last speech chunk; its ``speech_stopped`` event
sits exactly there (the end of the speech plus the silence, as OpenAI's ``audio_end_ms`` includes it), so
the turn's audio is ``[started, stopped)``. Positions are samples since the stream began.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from omni_stream.turns.vad import VadEvent, VadEventKind, VadParams


@dataclass(slots=True, frozen=True)
class TurnRule:
    """``VadParams`` in samples: ``chunk`` samples per probability; ``prefix`` and ``silence`` in samples."""

    threshold: float
    prefix: int
    silence: int
    chunk: int

    @classmethod
    def of(cls, params: VadParams, sample_rate: int, chunk: int) -> TurnRule:
        def samples(ms: int) -> int:
            return round(ms * sample_rate / 1000)

        return cls(params.threshold, samples(params.prefix_padding_ms), samples(params.silence_duration_ms), chunk)


@dataclass(slots=True, frozen=True)
class TurnState:
    """Where a stream stands: ``position`` (samples judged so far), whether a turn is open, the end of its last
    speech chunk, and ``floor`` (the earliest sample the next turn may claim: the previous turn's end)."""

    position: int = 0
    speaking: bool = False
    speech_end: int = 0
    floor: int = 0


def advance(state: TurnState, probabilities: Iterable[float], rule: TurnRule) -> tuple[TurnState, list[VadEvent]]:
    """Judge the next chunks (one probability each); the new state and the turn events they complete, in order."""
    position, speaking, speech_end, floor = state.position, state.speaking, state.speech_end, state.floor
    events: list[VadEvent] = []
    for p in probabilities:
        end = position + rule.chunk
        if p >= rule.threshold:
            if not speaking:
                speaking = True
                events.append(VadEvent(VadEventKind.SPEECH_STARTED, max(position - rule.prefix, floor)))
            speech_end = end
        elif speaking and end - speech_end >= rule.silence:
            speaking = False
            floor = speech_end + rule.silence
            events.append(VadEvent(VadEventKind.SPEECH_STOPPED, floor))
        position = end
    return TurnState(position, speaking, speech_end, floor), events


def turns(probabilities: Iterable[float], rule: TurnRule) -> list[VadEvent]:
    """Every turn event of a whole stream of probabilities (a turn still open at the end has no stop)."""
    return advance(TurnState(), probabilities, rule)[1]
