"""WS /v1/audio/speech/stream: the thin async shell around :class:`~.stream_protocol.SpeechStreamProtocol`.

The connection runs in the one WebSocket shell (:mod:`omni_stream.realtime.common.ws_shell`: accept, the registry of
open sessions, shutdown, close codes). Inside it, one task group per session: the receiver feeds client messages and
the protocol's timers to the protocol; a dispatcher takes the units the protocol queued and starts the engine request
of each (at most :data:`IN_FLIGHT` at once: the one streaming and the next, so the next unit's synthesis starts
while the current one streams); the sender streams units in order, paced by the session's playback clock. All three
perform the actions the protocol returns; what goes on the wire, and when the session ends, the protocol decides.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from starlette.websockets import WebSocket

from omni_stream.errors import UnknownVoiceError
from omni_stream.realtime.common.errors import ApiError, from_exception
from omni_stream.realtime.common.stream_pacing import SessionPacer, pcm_seconds
from omni_stream.realtime.common.ws_shell import Socket, is_gone, serve_websocket
from omni_stream.realtime.speech.build import build_request, refresh_voice
from omni_stream.realtime.speech.params import SpeechOptions
from omni_stream.realtime.speech.stream_protocol import (
    Action,
    CancelUnits,
    Close,
    Dispatch,
    Phase,
    ResolveConfig,
    SendBinary,
    SendText,
    SpeechStreamProtocol,
    UtteranceEnd,
)
from omni_stream.realtime.speech.stream_units import UnitJob
from omni_stream.realtime.state import ServerState
from omni_stream.validation.voices import builtin_voice

log = logging.getLogger("omni_stream.realtime.ws")

IN_FLIGHT = 2  # units with a live engine request: the one streaming and the next


async def speech_stream(websocket: WebSocket) -> None:
    await serve_websocket(websocket, "ws", _open)


async def _open(socket: Socket, state: ServerState) -> SpeechSession:
    return SpeechSession(socket, state)


class _Drained:
    """The receiver's answer once ``session.close`` came: the queued units finish, then the session closes."""


class SpeechSession:
    """One speech WebSocket connection (see the module doc for the task layout)."""

    def __init__(self, socket: Socket, state: ServerState, clock: Callable[[], float] = time.monotonic) -> None:
        self.socket = socket
        self.state = state
        self.clock = clock
        self.engine = state.ready_engine
        self.protocol = SpeechStreamProtocol(
            state.settings,
            models=state.served_models(),
            sample_rate=self.engine.speech_info.sample_rate,
            now=clock(),
        )
        self.jobs: set[UnitJob] = set()
        self.finished = anyio.Event()  # set once the session has ended (server shutdown waits on it)
        self.pacer = SessionPacer(state)  # one playback clock: the session's units play back to back
        self._slots = anyio.Semaphore(IN_FLIGHT)
        self._queued = anyio.Event()  # set when the protocol queued something for the dispatcher

    # --- the shell's calls ---

    async def serve(self, socket: Socket) -> int | None:
        """Receive, generate and send until the session ends (see :class:`~omni_stream.realtime.common.ws_shell.
        SocketSession`)."""
        outcome: int | _Drained | None = None
        try:
            async with anyio.create_task_group() as tg:
                jobs_send, jobs_recv = anyio.create_memory_object_stream[UnitJob | UtteranceEnd](IN_FLIGHT)
                tg.start_soon(self._dispatch, tg, jobs_send)
                tg.start_soon(self._sender, jobs_recv)
                outcome = await self._receive_loop()
                if not isinstance(outcome, _Drained):
                    tg.cancel_scope.cancel()  # else the dispatcher ends after the queued units, then the sender
        except Exception as exc:
            if not is_gone(exc):
                raise
            outcome = None
            self.protocol.disconnected()
        finally:
            self._cancel_units()
        if isinstance(outcome, _Drained):
            return await self._perform(self.protocol.drained_close())
        if outcome is None and self.protocol.in_utterance:  # abandoned mid-utterance: its generation was cancelled
            self.state.metrics.disconnects.labels("ws").inc()
        return outcome

    async def shutting_down(self, socket: Socket) -> None:
        await self._perform(self.protocol.shutdown())

    async def failed(self, socket: Socket, exc: BaseException) -> None:
        await self._perform(self.protocol.failed(exc))

    # --- actions ---

    async def _perform(self, actions: Sequence[Action]) -> int | None:
        """Carry out ``actions`` in order; the close code when one of them closes the session (the rest after it
        are not carried out)."""
        for action in actions:
            if isinstance(action, SendText):
                await self.socket.send_text(action.text)
            elif isinstance(action, SendBinary):
                await self.socket.send_bytes(action.data)
            elif isinstance(action, Dispatch):
                self._queued.set()
            elif isinstance(action, CancelUnits):
                self._cancel_units()
            elif isinstance(action, ResolveConfig):
                code = await self._perform(await self._resolve(action.opts))
                if code is not None:
                    return code
            elif isinstance(action, Close):
                return action.code
        return None

    async def _resolve(self, opts: SpeechOptions) -> list[Action]:
        """The engine's checks of a config, and its reference audio loaded, before any text arrives."""
        try:
            template = self.engine.resolve(await build_request(self.state, opts, "-"))
        except Exception as exc:
            return self.protocol.config_refused(exc)
        return self.protocol.config_resolved(opts, template)

    async def _withdrawn(self, opts: SpeechOptions) -> UnknownVoiceError | None:
        """The error for a unit whose uploaded voice was deleted after the session's config resolved it (its
        prompt is in the session's template): a deletion withdraws the voice from sessions already open too."""
        name = opts.voice
        if name is None or builtin_voice(self.engine.speech_info, name) is not None:
            return None
        await refresh_voice(self.state, name)  # deleted by another server sharing the directory too
        if self.state.voices.get(name) is not None:
            return None
        return UnknownVoiceError(f"Voice '{name}' was deleted: this session no longer speaks with it", "voice")

    def _cancel_units(self) -> None:
        self.pacer.interrupt()
        for job in list(self.jobs):
            job.cancel()

    # --- receiving ---

    async def _receive_loop(self) -> int | _Drained | None:
        """Handle client messages and timers until the session ends: its close code, drained, or None (gone)."""
        while True:
            if self.protocol.phase is Phase.DRAINING:
                return _Drained()
            deadline = self.protocol.deadline()
            message = await self.socket.receive(None if deadline is None else deadline - self.clock())
            now = self.clock()
            if message is None:
                actions = self.protocol.timeout(now)
            elif message["type"] == "websocket.disconnect":
                self.protocol.disconnected()
                return None
            elif message.get("text") is not None:
                actions = self.protocol.receive_text(message["text"], now)
            else:
                actions = self.protocol.receive_binary(now)
            code = await self._perform(actions)
            if code is not None:
                return code

    # --- generating and sending ---

    async def _dispatch(self, tg: TaskGroup, jobs_send: MemoryObjectSendStream[UnitJob | UtteranceEnd]) -> None:
        rate = self.engine.speech_info.sample_rate
        async with jobs_send:
            while True:
                item = self.protocol.take()
                if item is None:
                    if self.protocol.drained:
                        return
                    self._queued = anyio.Event()
                    await self._queued.wait()
                    continue
                if isinstance(item, UtteranceEnd):
                    await jobs_send.send(item)
                    continue
                await self._slots.acquire()
                if not self.protocol.current(item):  # cancelled while queued
                    self._slots.release()
                    self.protocol.unit_finished(self.clock())
                    continue
                job = UnitJob(item, rate, refusal=await self._withdrawn(item.opts))
                self.jobs.add(job)
                job.start(tg, self.engine)
                await jobs_send.send(job)

    async def _sender(self, jobs_recv: MemoryObjectReceiveStream[UnitJob | UtteranceEnd]) -> None:
        async with jobs_recv:
            async for item in jobs_recv:
                if isinstance(item, UtteranceEnd):
                    await self._perform(self.protocol.utterance_done(item))
                    continue
                try:
                    if not item.cancelled:
                        await self._send_unit(item)
                finally:
                    item.cancel()
                    self.jobs.discard(item)
                    self._slots.release()
                    self.protocol.unit_finished(self.clock())

    async def _send_unit(self, job: UnitJob) -> None:
        spec, opts = job.spec, job.spec.opts
        await self._perform(self.protocol.unit_started(spec))
        rate = self.protocol.unit_rate(spec)
        total, failure = 0, None
        async with job.receive:
            async for item in job.receive:
                if not isinstance(item, bytes):
                    failure = item.error
                    break
                if not job.cancelled:
                    await self.pacer.wait()
                await self._perform(self.protocol.unit_audio(item))
                self.pacer.sent(pcm_seconds(item, rate) if opts.stream_audio else job.seconds)
                total += len(item)
        await self._perform(self.protocol.unit_done(spec, total, _reason(failure), job.cancelled))


def _reason(failure: BaseException | None) -> str | None:
    """What a failed unit's ``error`` says of why: the client's words for it (the error shape's message)."""
    if failure is None:
        return None
    return failure.message if isinstance(failure, ApiError) else from_exception(failure).message
