"""Turn rules: when a pause in the user's speech ends their turn (pure values and functions, no models).

Two kinds, as OpenAI's Realtime API names them:

- ``server_vad``: the turn ends once the silence after speech lasts ``silence_duration_ms``.
- ``semantic_vad``: after a short pause (:data:`PAUSE_MS`) a trained end-of-turn model judges the turn's audio;
  a probability of at least the eagerness' ``threshold`` ends the turn at the pause, otherwise it ends once the
  silence lasts the eagerness' ``max_pause_ms`` (unless speech resumes first).

Eagerness (``auto`` is ``medium``), as OpenAI documents the timeouts (8 s, 4 s, 2 s):

=========  =========  ============
eagerness  threshold  max_pause_ms
=========  =========  ============
low        0.75       8000
medium     0.5        4000
high       0.25       2000
=========  =========  ============

Every turn has a *pause* before it ends: with ``server_vad`` at ``min(PAUSE_MS, silence_duration_ms)`` of
silence. Speculative work (transcribing the turn so far, preparing the answer) starts at a pause; the turn's
audio ends at the pause, so what was computed at the pause is exactly what the end of the turn needs.

``semantic_vad`` starts it sooner: its turn's audio ends :data:`QUIET_MS` after the speech (the VAD's
``quiet_ms``), and the detector reports that position as soon as the speech has been quiet that long, a
``PAUSE_MS - QUIET_MS`` head start on the pause (where the model is asked, on the pause's full silence as it
was trained). Work started there is exactly what a pause at that position needs; speech before the pause drops
it (``resumed``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from omni_stream.turns.vad import VadParams

PAUSE_MS = 200  # silence that makes a pause (Smart Turn is trained to judge turns after ~200 ms of VAD silence)
# semantic_vad: quiet that starts speculative work, and the silence its turn's audio keeps. A 100 ms quiet inside an
# utterance (a breath, a stop consonant's closure) costs a transcript that a resumption cancels.
QUIET_MS = 100


class TurnType(StrEnum):
    SERVER_VAD = "server_vad"
    SEMANTIC_VAD = "semantic_vad"


class Eagerness(StrEnum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    AUTO = "auto"


@dataclass(slots=True, frozen=True)
class EagernessRule:
    """The end-of-turn probability that ends a turn at its pause, and the longest pause (ms) that does not."""

    threshold: float
    max_pause_ms: int


EAGERNESS: dict[Eagerness, EagernessRule] = {
    Eagerness.LOW: EagernessRule(0.75, 8000),
    Eagerness.MEDIUM: EagernessRule(0.5, 4000),
    Eagerness.HIGH: EagernessRule(0.25, 2000),
    Eagerness.AUTO: EagernessRule(0.5, 4000),
}


@dataclass(slots=True, frozen=True)
class TurnRule:
    """What a turn detector applies. ``vad``: the detector's threshold and prefix (its silence is ``pause_ms``);
    ``max_pause_ms``: the silence that ends a turn; ``threshold``: the end-of-turn probability that ends it at
    the pause (None: no model is asked)."""

    vad: VadParams
    pause_ms: int
    max_pause_ms: int
    threshold: float | None = None

    @classmethod
    def server_vad(cls, params: VadParams) -> TurnRule:
        pause = min(PAUSE_MS, params.silence_duration_ms)
        return cls(
            VadParams(params.threshold, params.prefix_padding_ms, pause), pause, params.silence_duration_ms, None
        )

    @classmethod
    def semantic_vad(cls, eagerness: Eagerness) -> TurnRule:
        rule = EAGERNESS[eagerness]
        defaults = VadParams()
        vad = VadParams(defaults.threshold, defaults.prefix_padding_ms, PAUSE_MS, quiet_ms=QUIET_MS)
        return cls(vad, PAUSE_MS, rule.max_pause_ms, rule.threshold)

    @property
    def semantic(self) -> bool:
        return self.threshold is not None
