"""Admission paced by playback deadlines: newcomers wait while a playing stream is about to run dry.

A newcomer's prefill stalls every running stream for its duration, and a burst of them (32-128 requests sent
together) can stall streams that started a moment earlier past the end of the little audio their listeners
hold. So the scheduler asks a rule, before each step, how many of the waiting newcomers to admit, given each
playing stream's *slack*: the audio its listener has not played yet, ``first_chunk + audio_seconds - now``
from the request's own timings (a player that starts at the first chunk and plays in real time, the model of
the underrun metric). While every slack is above ``guard`` all newcomers are admitted at once (they prefill
together); below it only those that have waited ``max_defer`` already are, so a stream that cannot keep its
slack never holds newcomers back for long. Pure: the scheduler supplies the numbers. The Qwen3-TTS family
uses it only when ``Tuning.admission`` is on (``OMNI_STREAM_ADMISSION=on``; its measured effect is in
``benchmarks/results/tts_bench.md``).

Apart from the rule, a burst is held together (:func:`hold_newcomers`): requests sent at once reach the
scheduler one by one as their prompts are prepared (a burst of 128 over ~50 ms), and a worker that admits
whatever is waiting would prefill it as several groups (1, then 57, then 70 newcomers on the H200). Each group
then reaches every window length at its own step, so the codec's windows, batched by length, run as more and
smaller jobs for the whole of the streams' lives. So while requests are still being prepared, newcomers wait
for them, for at most ``hold`` seconds after the first of them queued.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

# About one prefill stall plus a step: a stream with more audio ahead than this survives admitting newcomers.
DEFAULT_GUARD_S = 0.06
DEFAULT_MAX_DEFER_S = 0.3
# A burst of 128 prompts is prepared in ~50 ms (two preparation threads); a lone request never waits (nothing
# else is being prepared when it queues).
DEFAULT_HOLD_S = 0.05


def hold_newcomers(arriving: int, waiting: int, free: int, waited: float, hold: float) -> bool:
    """Whether the ``waiting`` newcomers wait for the ``arriving`` requests still being prepared: only while
    some are, a free slot is left for them, and the oldest newcomer has waited (``waited`` s) under ``hold``."""
    return arriving > 0 and waiting < free and waited < hold


class AdmissionRule(Protocol):
    def budget(self, free: int, waiting_ages: Sequence[float], slacks: Sequence[float]) -> int:
        """How many of the waiting sequences (oldest first) to admit this step."""
        ...


@dataclass(slots=True, frozen=True)
class PlaybackAdmission:
    """Admit newcomers while every playing stream keeps ``guard`` seconds of audio ahead of its listener;
    a newcomer that has waited ``max_defer`` seconds is admitted regardless."""

    guard: float = DEFAULT_GUARD_S
    max_defer: float = DEFAULT_MAX_DEFER_S

    def __post_init__(self) -> None:
        if self.guard < 0 or self.max_defer < 0:
            raise ValueError(f"guard and max_defer must be >= 0 s, got {self.guard}, {self.max_defer}")

    def budget(self, free: int, waiting_ages: Sequence[float], slacks: Sequence[float]) -> int:
        """``waiting_ages``: seconds each waiting sequence has waited, oldest first; ``slacks``: seconds of audio
        ahead of each playing stream's listener (streams not playing yet are not in it)."""
        n = max(0, min(free, len(waiting_ages)))
        if not slacks or min(slacks) >= self.guard:
            return n
        return min(n, sum(1 for age in waiting_ages if age >= self.max_defer))
