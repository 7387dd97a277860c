"""The voice agent over WebRTC: a fastrtc ``AsyncStreamHandler`` bridging one peer connection to a realtime session.

Needs the ``[webrtc]`` extra (fastrtc). Each connection gets its own handler (``copy()``) and, in ``start_up``, its
own :class:`~omni_stream.realtime.agent.session.RealtimeSession` with ``semantic_vad`` where Smart Turn is installed
(``server_vad`` otherwise): the session's turn detector is the pause detector, so turn ends, barge-in and pacing
are the same as on ``WS /v1/realtime``.

Audio in: fastrtc resamples the browser's 48 kHz Opus to 24 kHz mono PCM16 (``input_sample_rate``); frames go
through a bounded queue into ``input_audio_buffer.append`` events (up to 100 ms at a time). Audio out: the
session's audio deltas (24 kHz PCM16) go through a bounded queue to ``emit``; the session paces them by the
playback clock, so fastrtc's own (unbounded) frame queue holds at most the run-ahead. On ``speech_started`` both
queues of agent audio are dropped at once. Data-channel logs: ``started_talking``, ``pause_detected``,
``response_starting`` (once per response). Disconnect: fastrtc calls ``shutdown``, which ends the session; the
session's exit releases every model slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import numpy as np
from fastrtc import AsyncStreamHandler
from fastrtc.utils import create_message

from omni_stream.realtime.agent.events import (
    AudioFormat,
    InputAudioAppend,
    SessionPatch,
    SessionType,
    SessionUpdate,
    TurnDetection,
)
from omni_stream.realtime.agent.session import RealtimeSession, SessionClose
from omni_stream.realtime.state import ServerState
from omni_stream.turns.rules import TurnType

log = logging.getLogger("omni_stream.realtime.rtc")

RATE = 24000
INPUT_FRAMES = 50  # 20 ms frames waiting for the session (1 s); the track reader waits when it is full
OUTPUT_CHUNKS = 16  # agent audio chunks waiting for fastrtc's player
APPEND_FRAMES = 5  # frames joined into one append (100 ms)


class VoiceAgentHandler(AsyncStreamHandler):
    """One WebRTC peer's voice-agent session (see the module docstring); ``state`` is the server's ServerState."""

    def __init__(self, state: ServerState) -> None:
        super().__init__(expected_layout="mono", output_sample_rate=RATE, input_sample_rate=RATE)
        self.state = state
        self.inq: asyncio.Queue[np.ndarray] = asyncio.Queue(INPUT_FRAMES)
        self.outq: asyncio.Queue[tuple[int, np.ndarray] | None] = asyncio.Queue(OUTPUT_CHUNKS)
        self.session: RealtimeSession | None = None
        self._task: asyncio.Task[Any] | None = None
        self.ended = asyncio.Event()

    def copy(self) -> VoiceAgentHandler:
        return VoiceAgentHandler(self.state)

    async def receive(self, frame: tuple[int, np.ndarray]) -> None:
        _, samples = frame
        await self.inq.put(np.asarray(samples, dtype=np.int16).reshape(-1))

    async def emit(self) -> Any:
        return await self.outq.get()  # None: nothing (the session ended)

    async def start_up(self) -> None:
        """Runs for the whole connection (fastrtc runs it as a task once the data channel is up)."""
        self._task = asyncio.current_task()
        engine = self.state.ready_engine
        gauge = self.state.metrics.streams.labels("webrtc")  # open sessions by transport, as the sockets count theirs
        gauge.inc()
        try:
            async with RealtimeSession(engine, self.state.settings, metrics=self.state.metrics) as session:
                self.session = session
                self.state.sessions.add(session)
                try:
                    await self._serve(session)
                finally:
                    self.state.sessions.discard(session)
        except asyncio.CancelledError:
            pass
        finally:
            gauge.dec()
            self.session = None
            self._drop_output()
            with contextlib.suppress(asyncio.QueueFull):
                self.outq.put_nowait(None)
            self.ended.set()

    async def _serve(self, session: RealtimeSession) -> None:
        caps = session.protocol.caps  # semantic_vad where the end-of-turn model is installed, else server_vad
        vad = TurnDetection(type=TurnType.SEMANTIC_VAD) if caps.semantic else TurnDetection() if caps.vad else None
        patch = SessionPatch(
            type=SessionType.REALTIME,
            input_format=AudioFormat.PCM,
            output_format=AudioFormat.PCM,
            turn_detection=vad,
        )
        await session.client_event(SessionUpdate(None, patch))
        pump = asyncio.ensure_future(self._pump_input(session))
        try:
            async for event in session.outgoing:
                if isinstance(event, SessionClose):
                    break
                if event.type == "response.output_audio.delta" and event.audio:
                    samples = np.frombuffer(event.audio, dtype="<i2").reshape(1, -1)
                    await self.outq.put((RATE, samples))
                elif event.type == "input_audio_buffer.speech_started":
                    self._drop_output()
                    await self.send_message(create_message("log", "started_talking"))
                    await self.turn_started(session)
                elif event.type == "input_audio_buffer.speech_stopped":
                    await self.send_message(create_message("log", "pause_detected"))
                    self.turn_ended()
                elif event.type == "response.created":
                    await self.send_message(create_message("log", "response_starting"))
                elif event.type == "error":
                    log.warning("webrtc session error: %s", event.body.get("error"))
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump

    async def turn_started(self, session: RealtimeSession) -> None:
        """The user began a turn (the session's ``speech_started``); the camera variant shows its picture here."""

    def turn_ended(self) -> None:
        """The user's turn paused (the session's ``speech_stopped``)."""

    async def _pump_input(self, session: RealtimeSession) -> None:
        while True:
            frames = [await self.inq.get()]
            while len(frames) < APPEND_FRAMES and not self.inq.empty():
                frames.append(self.inq.get_nowait())
            await session.client_event(InputAudioAppend(None, np.concatenate(frames).astype("<i2").tobytes()))

    def _drop_output(self) -> None:
        """Barge-in: the agent audio not yet played goes, ours and fastrtc's."""
        while not self.outq.empty():
            self.outq.get_nowait()
        if self._clear_queue is not None:
            self._clear_queue()

    async def shutdown(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
