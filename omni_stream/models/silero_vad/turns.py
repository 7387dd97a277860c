"""The turn rule of OpenAI's ``server_vad``, as a pure function over per-chunk speech probabilities.

A chunk is speech when its probability is at least ``threshold``. A turn starts at the first speech chunk;
its ``speech_started`` event sits ``prefix_padding_ms`` before that chunk (never before the previous turn's
end, never before the stream's start), so the turn's audio holds the lead-in. A turn stops once
``silence_duration_ms`` have passed since the end of its last speech chunk; its ``speech_stopped`` event
sits exactly there (the end of the speech plus the silence, as OpenAI's ``audio_end_ms`` includes it), so
the turn's audio is ``[started, stopped)``. Positions are samples since the stream began.

With ``quiet`` (a semantic rule's ``quiet_ms``), the turn's audio ends ``quiet`` after its last speech chunk
instead: a ``speech_quiet`` event sits there as soon as that much has passed, the stop at the same position once
``silence_duration_ms`` have, and speech in between reports ``speech_started`` again (the turn goes on).
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
    quiet: int | None = None

    @classmethod
    def of(cls, params: VadParams, sample_rate: int, chunk: int) -> TurnRule:
        def samples(ms: int) -> int:
            return round(ms * sample_rate / 1000)

        quiet = samples(params.quiet_ms) if params.quiet_ms is not None else None
        silence = samples(params.silence_duration_ms)
        return cls(params.threshold, samples(params.prefix_padding_ms), silence, chunk, quiet)


@dataclass(slots=True, frozen=True)
class TurnState:
    """Where a stream stands: ``position`` (samples judged so far), whether a turn is open, the end of its last
    speech chunk, ``floor`` (the earliest sample the next turn may claim: the previous turn's end), and whether the
    open silence has reported its quiet."""

    position: int = 0
    speaking: bool = False
    speech_end: int = 0
    floor: int = 0
    quieted: bool = False


def advance(state: TurnState, probabilities: Iterable[float], rule: TurnRule) -> tuple[TurnState, list[VadEvent]]:
    """Judge the next chunks (one probability each); the new state and the turn events they complete, in order."""
    position, speaking, speech_end, floor = state.position, state.speaking, state.speech_end, state.floor
    quieted = state.quieted
    tail = rule.silence if rule.quiet is None else rule.quiet  # the turn's audio after its last speech
    events: list[VadEvent] = []
    for p in probabilities:
        end = position + rule.chunk
        if p >= rule.threshold:
            if not speaking:
                speaking = True
                events.append(VadEvent(VadEventKind.SPEECH_STARTED, max(position - rule.prefix, floor)))
            elif quieted:  # the quiet did not hold: the turn goes on
                events.append(VadEvent(VadEventKind.SPEECH_STARTED, position))
            speech_end, quieted = end, False
        elif speaking and end - speech_end >= rule.silence:
            speaking, quieted = False, False
            floor = speech_end + tail
            events.append(VadEvent(VadEventKind.SPEECH_STOPPED, floor))
        elif speaking and rule.quiet is not None and not quieted and end - speech_end >= rule.quiet:
            quieted = True
            events.append(VadEvent(VadEventKind.SPEECH_QUIET, speech_end + tail))
        position = end
    return TurnState(position, speaking, speech_end, floor, quieted), events


def turns(probabilities: Iterable[float], rule: TurnRule) -> list[VadEvent]:
    """Every turn event of a whole stream of probabilities (a turn still open at the end has no stop)."""
    return advance(TurnState(), probabilities, rule)[1]
