"""Timelines of realtime sessions, for benchmarks: when each step of a turn happened on the server.

A voice turn crosses the client's appends, the turn-detection threads, the transcription, the text and speech models
and the session's event queue. The client sees only the events that leave the server; a timeline says where the time
between them went: when the audio's quiet and pause were detected, when the speculative transcript was asked for and
finished, when the held answer's prompt was submitted, when its first text and first audio came out of the engine,
when it was adopted, and when each of the turn's events was queued for the transport.

Off unless ``Settings.realtime_trace`` holds a :class:`SessionTraces` (``benchmarks/voice_bench.py`` sets one): then
each session marks named moments on ``time.monotonic()`` (the clock of ``asyncio``'s loops, shared by every process on
the host, so a client can place them against its own marks).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

KEEP = 1024  # timelines kept; the oldest go first
MARKS = 4096  # marks per timeline; a long session's later marks are not kept

# The server events whose queueing a timeline marks (every other event is left out: deltas would flood it).
TRACED_EVENTS = frozenset(
    {
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.input_audio_transcription.completed",
        "response.created",
        "response.done",
    }
)


@dataclass(slots=True)
class Timeline:
    """One session's marks: ``(name, time.monotonic())`` in the order they happened."""

    session_id: str
    marks: list[tuple[str, float]] = field(default_factory=list)

    def mark(self, name: str, at: float | None = None) -> None:
        if len(self.marks) < MARKS:
            self.marks.append((name, time.monotonic() if at is None else at))


class SessionTraces:
    """Where sessions' timelines collect (thread-safe: marks come from the loop, :meth:`take` from a route)."""

    def __init__(self, keep: int = KEEP) -> None:
        self._lock = threading.Lock()
        self._timelines: deque[Timeline] = deque(maxlen=keep)

    def open(self, session_id: str) -> Timeline:
        timeline = Timeline(session_id)
        with self._lock:
            self._timelines.append(timeline)
        return timeline

    def take(self) -> list[Timeline]:
        """Every timeline since the last call (a session still open keeps marking the one returned)."""
        with self._lock:
            taken = list(self._timelines)
            self._timelines.clear()
        return taken
