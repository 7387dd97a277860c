"""Voice activity detection: the streaming detector interface a realtime session drives, and its parameters.

A detector holds one stream's state (a session owns one; never share it). ``feed`` takes the next samples
(float32 mono at ``sample_rate``, any length) and returns the turn events they complete, with positions in
samples from the start of the stream. Turn rule (OpenAI's ``server_vad``): speech starts when the speech
probability passes ``threshold``; it stops after ``silence_duration_ms`` below it; ``prefix_padding_ms`` of audio
before the start belong to the turn. ``feed`` is blocking CPU work (a small model): run it off the event loop.

``quiet_ms`` (not on the wire; a semantic turn rule sets it): the speech has been quiet that long, shorter than the
silence that stops it. A detector that honours it reports ``speech_quiet`` then, at the position its stop would
have (the turn's audio then ends ``quiet_ms`` after the speech, not ``silence_duration_ms``), and a
``speech_started`` if the speech goes on before the stop: work that needs the turn's audio (a speculative
transcript) can start ``silence_duration_ms - quiet_ms`` earlier, on exactly the audio a stop there commits. A
detector that ignores it is correct too: it reports only starts and stops (at ``silence_duration_ms``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, TypeAlias, runtime_checkable

import numpy as np

from omni_stream.errors import InvalidRequestError


class VadEventKind(StrEnum):
    SPEECH_STARTED = "speech_started"
    SPEECH_STOPPED = "speech_stopped"
    SPEECH_QUIET = "speech_quiet"  # quiet for quiet_ms: where a stop would end the turn, if the silence holds


@dataclass(slots=True, frozen=True)
class VadEvent:
    """A turn boundary at ``sample`` (samples since the stream began, at the detector's rate)."""

    kind: VadEventKind
    sample: int


@dataclass(slots=True, frozen=True)
class VadParams:
    """``threshold`` in (0, 1); durations in milliseconds."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    quiet_ms: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise InvalidRequestError(f"threshold must be in (0, 1), got {self.threshold}", "threshold")
        if not 0 <= self.prefix_padding_ms <= 10_000:
            raise InvalidRequestError("prefix_padding_ms must be 0-10000", "prefix_padding_ms")
        if not 0 <= self.silence_duration_ms <= 10_000:
            raise InvalidRequestError("silence_duration_ms must be 0-10000", "silence_duration_ms")
        if self.quiet_ms is not None and not 0 < self.quiet_ms < self.silence_duration_ms:
            raise ValueError(f"quiet_ms must be in (0, silence_duration_ms), got {self.quiet_ms}")


class VoiceActivityDetector(Protocol):
    """One stream's detector (see module docstring)."""

    @property
    def sample_rate(self) -> int: ...

    def feed(self, samples: np.ndarray) -> list[VadEvent]: ...

    def reset(self) -> None:
        """Forget the stream so far (a cleared input buffer); positions restart at 0."""
        ...


@runtime_checkable
class PiecewiseVad(VoiceActivityDetector, Protocol):
    """A detector that also judges consecutive pieces at once: ``feed_pieces(pieces)`` returns what ``[feed(p) for p
    in pieces]`` would, in one pass of its network (a turn detector cuts each append into 20 ms pieces for its pause
    timing; one network call a piece cost four times the network's work a second of audio)."""

    def feed_pieces(self, pieces: Sequence[np.ndarray]) -> list[list[VadEvent]]: ...


@runtime_checkable
class BatchedVad(PiecewiseVad, Protocol):
    """A detector whose class also judges several streams at once: ``type(vad).feed_many(items)`` returns what
    ``[vad.feed_pieces(pieces) for vad, pieces in items]`` would, for detectors of that class, in one pass of their
    network (a server's sessions append audio at the same moments; one network call per stream held the GIL once per
    session)."""

    @staticmethod
    def feed_many(items: Sequence[tuple[PiecewiseVad, Sequence[np.ndarray]]]) -> list[list[list[VadEvent]]]: ...


VadFactory: TypeAlias = Callable[[VadParams], VoiceActivityDetector]
"""Makes one stream's detector (the serving role ``"vad"``: :data:`omni_stream.family_registry.VAD`)."""
