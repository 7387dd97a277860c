"""WS /v1/audio/speech/stream: streaming text in, audio out.

One anyio task group per session: the receiver reads client messages (so ``input.cancel`` and
``session.config`` are seen while audio streams), a dispatcher starts the engine request of each queued
unit (at most two at once: the one streaming and the next), and the sender sends units in order.

Units come from the session's ``text_input_mode``: ``buffered`` cuts them by ``split_granularity`` (one per
``input.done`` by default), ``commitment`` whenever :mod:`.text_commit` finds a span safe to speak. A config
with an unknown field or value, or a field this server cannot honour (``word_timestamps``), is an ``error``
naming it: closing on the first config, keeping the previous one later.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any

import anyio
from anyio.abc import TaskGroup
from starlette.websockets import WebSocket, WebSocketState

from omni_stream.realtime.common.audio_out import output_rate
from omni_stream.realtime.common.close_codes import CloseCode
from omni_stream.realtime.common.errors import ApiError, from_exception
from omni_stream.realtime.common.stream_pacing import SessionPacer, pcm_seconds
from omni_stream.realtime.common.ws_sessions import accept, is_gone, registered, shutdown
from omni_stream.realtime.speech.build import build_request
from omni_stream.realtime.speech.params import SpeechOptions, TextInputMode, check_model, parse_options
from omni_stream.realtime.speech.stream_messages import ProtocolError, input_text, parse_message
from omni_stream.realtime.speech.stream_units import UnitJob, UnitSpec, UtteranceEnd
from omni_stream.realtime.speech.text_commit import TextCommitter
from omni_stream.realtime.state import ServerState
from omni_stream.requests import SpeechRequest
from omni_stream.speech.limits import MAX_INPUT_CHARS
from omni_stream.speech.text_split import TextSplitter

log = logging.getLogger("omni_stream.realtime.ws")

IN_FLIGHT = 2  # units with a live engine request: the one streaming and the next


class Phase(StrEnum):
    CONFIG = "config"  # waiting for the first session.config
    OPEN = "open"
    DRAINING = "draining"  # session.close received: finish queued units, then close
    CLOSED = "closed"


async def speech_stream(websocket: WebSocket) -> None:
    state: ServerState = websocket.app.state.omni
    await accept(websocket)
    session = SpeechSession(websocket, state)
    async with registered(state, session, "ws"):
        await session.run()


class SpeechSession:
    """One speech WebSocket connection (see the module doc for the task layout)."""

    def __init__(self, websocket: WebSocket, state: ServerState) -> None:
        self.ws = websocket
        self.state = state
        self.settings = state.settings
        self.phase = Phase.CONFIG
        self.opts: SpeechOptions | None = None
        self.template: SpeechRequest | None = None
        self.splitter: TextSplitter | TextCommitter = TextSplitter(max_chars=MAX_INPUT_CHARS)
        self.utterance = 0  # index of the utterance text is now added to
        self.utterances_done = 0  # session.done events sent (utterances finished or cancelled)
        self.sentence = 0  # next sentence index inside it
        self.epoch = 0  # bumped by input.cancel: queued work of older epochs is dropped
        self.outstanding = 0  # units queued or in flight
        self.last_activity = time.monotonic()
        self.jobs: set[UnitJob] = set()
        self.finished = anyio.Event()  # set once the session has ended (server shutdown waits on it)
        self._send_lock = anyio.Lock()
        self.pacer = SessionPacer(state)  # one playback clock: the session's units play back to back
        self._slots = anyio.Semaphore(IN_FLIGHT)
        self._queue_send, self._queue_recv = anyio.create_memory_object_stream[UnitSpec | UtteranceEnd](
            2 * self.settings.max_ws_queued_units  # units (bounded by outstanding) and utterance ends
        )

    # --- sending ---

    async def send_json(self, message: dict[str, Any]) -> None:
        async with self._send_lock:
            await self.ws.send_text(json.dumps(message, ensure_ascii=False))

    async def send_bytes(self, data: bytes) -> None:
        async with self._send_lock:
            await self.ws.send_bytes(data)

    async def error(self, message: str, **extra: Any) -> None:
        await self.send_json({"type": "error", "message": message, **extra})

    async def close(self, code: int, message: str | None = None) -> None:
        """Send ``message`` as an error (when given) and close with ``code``, once; quiet if the client is gone."""
        if self.phase is Phase.CLOSED:
            return
        self.phase = Phase.CLOSED
        try:
            if message is not None:
                await self.error(message)
            if self.ws.application_state is not WebSocketState.DISCONNECTED:
                await self.ws.close(code)
        except Exception as exc:
            if not is_gone(exc) and not isinstance(exc, RuntimeError):
                raise

    # --- life ---

    async def run(self) -> None:
        if not await self._handshake():
            return
        self.phase = Phase.OPEN
        outcome = {"reason": "disconnect"}
        try:
            async with anyio.create_task_group() as outer:

                async def serve() -> None:
                    outcome["reason"] = await self._serve()
                    outer.cancel_scope.cancel()

                async def until_shutdown() -> None:
                    await shutdown(self.state)
                    outcome["reason"] = "shutdown"
                    outer.cancel_scope.cancel()

                outer.start_soon(until_shutdown)
                outer.start_soon(serve)
        except Exception as exc:
            if is_gone(exc):
                reason = "disconnect"
            else:
                log.exception("speech session failed")
                await self.close(CloseCode.INTERNAL, f"Internal error: {_leaf(exc)}")
                return
        finally:
            for job in list(self.jobs):
                job.cancel()
        reason = outcome["reason"]
        if reason == "disconnect":
            if self.in_utterance:  # abandoned mid-utterance: its generation was cancelled
                self.state.metrics.disconnects.labels("ws").inc()
            self.phase = Phase.CLOSED
        elif reason == "idle":
            await self.close(CloseCode.NORMAL, "Idle timeout: no message received")
        elif reason == "shutdown":
            await self.close(CloseCode.GOING_AWAY, "Server shutting down")
        else:
            await self.close(CloseCode.NORMAL)

    async def _serve(self) -> str:
        """Receive, generate and send until the session ends; returns why (see ``_receive_loop``)."""
        async with anyio.create_task_group() as tg:
            jobs_send, jobs_recv = anyio.create_memory_object_stream[UnitJob | UtteranceEnd](IN_FLIGHT)
            tg.start_soon(self._dispatch, tg, jobs_send)
            tg.start_soon(self._sender, jobs_recv)
            reason = await self._receive_loop()
            if reason == "close":
                self._queue_send.close()  # the dispatcher ends after the queued units, then the sender
            else:
                tg.cancel_scope.cancel()
        return reason

    async def _handshake(self) -> bool:
        """Wait for the first message, a valid session.config; anything else closes with 1008."""
        message = None
        with anyio.move_on_after(self.settings.ws_config_timeout):
            message = await self.ws.receive()
        if message is None:
            await self.close(CloseCode.POLICY, "Timeout waiting for session.config")
            return False
        if message["type"] == "websocket.disconnect":
            return False
        try:
            body = parse_message(message, self.settings.max_ws_config_bytes)
            if body.get("type") != "session.config":
                raise ProtocolError(f"Expected session.config, got: {body.get('type')}")
            await self._apply_config(body)
        except ProtocolError as exc:
            await self.close(CloseCode.POLICY, str(exc))
            return False
        return True

    async def _apply_config(self, body: dict[str, Any]) -> None:
        config = {k: v for k, v in body.items() if k != "type"}
        try:
            opts = parse_options(config, self.settings, websocket=True)
            check_model(opts.model, self.state.served_models())
            # resolved by the engine now, before any text arrives; each unit's request copies it
            template = self.state.ready_engine.resolve(await build_request(self.state, opts, "-"))
        except Exception as exc:
            raise ProtocolError(f"Invalid session config: {from_exception(exc).message}") from exc
        self.opts, self.template = opts, template
        self.splitter = self._splitter(opts)

    def _splitter(self, opts: SpeechOptions) -> TextSplitter | TextCommitter:
        if opts.text_input_mode is TextInputMode.COMMITMENT:
            limit = self.settings.max_ws_uncommitted_chars
            return TextCommitter(opts.language, max_uncommitted=limit, max_chars=MAX_INPUT_CHARS)
        return TextSplitter(opts.split_granularity, max_chars=MAX_INPUT_CHARS)

    @property
    def in_utterance(self) -> bool:
        """Whether an utterance is open: text or units of one not yet ended, or one ended but not yet done.

        Read after the session's tasks are cancelled, so it counts what cancelling leaves unchanged (units in
        flight are counted down as they are cancelled).
        """
        return self.utterances_done < self.utterance or self.sentence > 0 or bool(self.splitter.pending.strip())

    # --- receiving ---

    async def _receive_loop(self) -> str:
        """Handle client messages until the session ends; returns ``close``, ``disconnect`` or ``idle``."""
        while True:
            message = await self._receive_or_idle()
            if message is None:
                return "idle"
            if message["type"] == "websocket.disconnect":
                return "disconnect"
            try:
                body = parse_message(message, self.settings.max_ws_config_bytes)
                if await self._handle(body, message.get("text") or ""):
                    self.phase = Phase.DRAINING
                    return "close"
            except ProtocolError as exc:
                await self.error(str(exc))

    async def _receive_or_idle(self) -> Mapping[str, Any] | None:
        """The next message, or None after ``ws_idle_timeout`` s without messages or generation."""
        idle = self.settings.ws_idle_timeout
        wait = idle
        while True:
            with anyio.move_on_after(wait):
                message = await self.ws.receive()
                self.last_activity = time.monotonic()
                return message
            quiet = time.monotonic() - self.last_activity
            if self.outstanding:
                wait = idle  # generating counts as activity
            elif quiet >= idle:
                return None
            else:
                wait = idle - quiet

    async def _handle(self, body: dict[str, Any], raw: str) -> bool:
        """Apply one client message; True when the client asked to close."""
        kind = body.get("type")
        if kind == "input.text":
            text = input_text(body, raw, self.settings.max_ws_text_bytes)
            limit = self.settings.max_ws_pending_chars
            if len(self.splitter.pending) + len(text) > limit:
                raise ProtocolError(f"Buffered text would exceed {limit} characters: send input.done first")
            self._queue_units(self._split(lambda: self.splitter.feed(text)))
        elif kind == "input.done":
            self._queue_units(self._split(self.splitter.flush, ends=1))
            self._queue(UtteranceEnd(self.utterance, self.epoch))
            self.utterance += 1
            self.sentence = 0
        elif kind == "input.cancel":
            self._cancel()
        elif kind == "session.config":
            if self.splitter.pending.strip() or self.sentence:
                raise ProtocolError(
                    "session.config cannot be applied while an utterance is in progress; send input.done first"
                )
            await self._apply_config(body)
        elif kind == "session.close":
            return True
        else:
            raise ProtocolError(f"Unknown message type: {kind}")
        return False

    def _split(self, split: Callable[[], list[str]], ends: int = 0) -> list[str]:
        """The units ``split`` cuts from the buffer, unless they would pass ``max_ws_queued_units``: then the
        buffer is left as it was and the message is refused (the client may resend once units finish).
        ``ends`` utterance markers follow the units; they are bounded too, through the queue's capacity."""
        before = self.splitter.pending
        units = split()
        limit = self.settings.max_ws_queued_units
        queued = self._queue_send.statistics().current_buffer_used
        if self.outstanding + len(units) > limit or queued + len(units) + ends > 2 * limit:
            self.splitter.restore(before)
            raise ProtocolError(
                f"Too many queued units: {self.outstanding} waiting and {len(units)} more would pass the limit "
                f"of {limit}; wait for audio.done before sending more"
            )
        return units

    def _queue(self, item: UnitSpec | UtteranceEnd) -> None:
        self._queue_send.send_nowait(item)

    def _queue_units(self, units: list[str]) -> None:
        assert self.opts is not None and self.template is not None
        for text in units:
            self.outstanding += 1
            self._queue(UnitSpec(self.utterance, self.sentence, text, self.epoch, self.opts, self.template))
            self.sentence += 1

    def _cancel(self) -> None:
        """input.cancel: drop queued units, stop the ones in flight, end the open utterance."""
        open_utterance = bool(self.splitter.pending.strip() or self.sentence)
        if not self.outstanding and not open_utterance:
            raise ProtocolError("No utterance in progress to cancel")
        stats = self._queue_send.statistics()
        if open_utterance and stats.current_buffer_used >= stats.max_buffer_size:
            raise ProtocolError("Too many queued messages; wait for audio.done before cancelling")
        self.epoch += 1
        self.pacer.interrupt()
        for job in list(self.jobs):
            job.cancel()
        self.splitter.clear()
        if open_utterance:
            self._queue(UtteranceEnd(self.utterance, self.epoch, cancelled=True))
            self.utterance += 1
            self.sentence = 0

    # --- generating and sending ---

    def _unit_finished(self) -> None:
        self.outstanding -= 1
        self.last_activity = time.monotonic()

    async def _dispatch(self, tg: TaskGroup, jobs_send: Any) -> None:
        rate = self.state.ready_engine.speech_info.sample_rate
        async with jobs_send:
            async for item in self._queue_recv:
                if isinstance(item, UtteranceEnd):
                    await jobs_send.send(item)
                    continue
                await self._slots.acquire()
                if item.epoch != self.epoch:  # cancelled while queued
                    self._slots.release()
                    self._unit_finished()
                    continue
                job = UnitJob(item, rate)
                self.jobs.add(job)
                job.start(tg, self.state.ready_engine)
                await jobs_send.send(job)

    async def _sender(self, jobs_recv: Any) -> None:
        started: dict[int, int] = defaultdict(int)
        async with jobs_recv:
            async for item in jobs_recv:
                if isinstance(item, UtteranceEnd):
                    done = {"type": "session.done", "utterance_index": item.utterance}
                    done["total_sentences"] = started.pop(item.utterance, 0)
                    if item.cancelled or item.epoch != self.epoch:
                        done["cancelled"] = True
                    await self.send_json(done)
                    self.utterances_done += 1
                    continue
                try:
                    if not item.cancelled:
                        started[item.spec.utterance] += 1
                        await self._send_unit(item)
                finally:
                    item.cancel()
                    self.jobs.discard(item)
                    self._slots.release()
                    self._unit_finished()

    async def _send_unit(self, job: UnitJob) -> None:
        spec, opts = job.spec, job.spec.opts
        where = {"utterance_index": spec.utterance, "sentence_index": spec.sentence}
        fmt = "pcm" if opts.stream_audio else opts.response_format
        await self.send_json(
            {
                "type": "audio.start",
                **where,
                "sentence_text": spec.text,
                "format": fmt,
                "sample_rate": output_rate(fmt, job.sample_rate, opts.sample_rate),
                "channels": 1,
            }
        )
        total, failure = 0, None
        async with job.receive:
            async for item in job.receive:
                if not isinstance(item, bytes):
                    failure = item.error
                    break
                if not job.cancelled:
                    await self.pacer.wait()
                await self.send_bytes(item)
                rate = output_rate(fmt, job.sample_rate, opts.sample_rate)
                self.pacer.sent(pcm_seconds(item, rate) if opts.stream_audio else job.seconds)
                total += len(item)
        if failure is not None:
            extra = {"partial_audio": True, "action": "discard"} if total else {}
            message = from_exception(failure).message if not isinstance(failure, ApiError) else failure.message
            await self.error(
                f"Generation failed for utterance {spec.utterance}, sentence {spec.sentence}: {message}", **extra
            )
        done = {"type": "audio.done", **where, "total_bytes": total, "error": failure is not None}
        if job.cancelled:
            done["cancelled"] = True
        await self.send_json(done)


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
