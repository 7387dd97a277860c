"""The voice agent: a realtime session's protocol state machine driven against the engine, for any transport.

A :class:`RealtimeSession` owns one :class:`~omni_stream.realtime.agent.protocol.RealtimeProtocol` and the
engine requests its commands start: a transcription per committed user audio part (the ``transcription``
pipeline), a response per turn (``chat+speech``, or ``chat`` for text-only output). Transports feed client
events in (:meth:`client_message` for JSON text, :meth:`client_event` for typed events) and read server events
from :attr:`outgoing` in order, ending with a :class:`SessionClose` when the session closes itself.

Every protocol call runs under one lock together with carrying out its commands and queueing its events, so
transitions, aborts and sends keep one order: a response's audio can never follow its ``response.done``.
Protocol calls run on the event loop (they are pure and cheap); large appends, large JSON messages and audio
that needs resampling are handled in a worker thread.

Turn detection. The session's :class:`~omni_stream.turns.detector.TurnDetector` (voice activity from
``vad_factory``, for ``semantic_vad`` also the end-of-turn model of ``turn_model_factory``) lives here, not in
the protocol: one task takes the protocol's ``ConfigureTurns`` and ``DetectTurns`` commands in order, feeds the
detector in a worker thread (the audio queued meanwhile as one piece) and hands its events to the protocol's
``turn_event`` under the lock. The lock is not held while the detector runs.

Barge-in and run-ahead. A ``CancelResponse`` aborts the response's engine request synchronously, before any
other task runs: the text and speech models' slots are released before their next step, and the chunks the
engine still held are dropped with it. Each response's audio is paced by the client's playback clock
(:func:`audio_pacer`, ``Settings.realtime_run_ahead_seconds``, default 2 s): while it waits the engine stream is
read no further, so generation pauses at its watermarks instead of filling the socket with stale audio.

Lifetime: ``async with RealtimeSession(...)``; leaving it (any way) aborts every engine request at once, then
waits for its tasks; the protocol forgets its buffer, detector and pending work.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np
from anyio.abc import TaskGroup

from omni_stream.chunks import Audio, StageOutput, TextDelta
from omni_stream.codecs.resample import resample
from omni_stream.engine import AsyncEngine, RequestStream
from omni_stream.family import ModelKind
from omni_stream.realtime.agent.events import (
    ClientEvent,
    InputAudioAppend,
    ItemCreate,
    NewItem,
    RealtimeError,
    SessionType,
)
from omni_stream.realtime.agent.events import parse_client_event as parse
from omni_stream.realtime.agent.outputs import (
    AdoptResponse,
    CancelResponse,
    CancelTranscription,
    Capabilities,
    Close,
    Command,
    ConfigureTurns,
    DetectTurns,
    Limits,
    Outputs,
    ResponseUsage,
    ServerEvent,
    StartResponse,
    Transcribe,
    TurnModelFactory,
    VadFactory,
)
from omni_stream.realtime.agent.protocol import RealtimeProtocol
from omni_stream.realtime.agent.trace import TRACED_EVENTS, Timeline
from omni_stream.realtime.agent.truncation import ContextExceeded, fit, fits_whole, token_bound
from omni_stream.realtime.settings import Settings
from omni_stream.realtime.state import HttpMetrics
from omni_stream.requests import ChatMessage, ChatRequest, SpokenReply, TextRequest
from omni_stream.runtime.offload import Lane, run_prepare_batched
from omni_stream.speech.pacing import AnyioClock, Clock, Pacer
from omni_stream.text.tools import ToolMode
from omni_stream.transcription.spec import TranscriptionRequest, transcription_family
from omni_stream.turns.detector import EndOfTurnModel, TurnDetector, TurnEvent, feed_many, judge_many
from omni_stream.turns.rules import TurnType

log = logging.getLogger("omni_stream.realtime.session")

PARSE_OFF_LOOP_CHARS = 64 * 1024  # JSON messages longer than this are parsed in a worker thread
AUDIO_OFF_LOOP_BYTES = 64 * 1024  # appends larger than this are decoded in a worker thread
OUTGOING_EVENTS = 64  # server events queued for the transport before the session waits for it
COUNTED_TEXTS = 4096  # message texts whose token counts a session keeps for its prompts' fitting


# --- pacing by the playback clock (omni_stream.speech.pacing) -------------------------------------------------------


def audio_pacer(ahead: float, clock: Clock) -> Pacer:
    """The pacer of one response's audio: each chunk waits until the audio sent leads playback by <= ``ahead`` s."""
    return Pacer(ahead, clock)


# --- the session --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Held:
    """A preemptive response's run: its outputs wait for :attr:`adopted`; then they go to response :attr:`rid`."""

    rid: str
    speak: bool
    holding: anyio.Event = field(default_factory=anyio.Event)  # it has read up to its first output and waits
    adopted: anyio.Event = field(default_factory=anyio.Event)


@dataclass(slots=True, frozen=True)
class SessionClose:
    """The last item of :attr:`RealtimeSession.outgoing`: close the transport with ``code``."""

    code: int
    reason: str


def capabilities(
    engine: AsyncEngine,
    vad_factory: VadFactory | None,
    model: str | None = None,
    turn_model_factory: TurnModelFactory | None = None,
) -> Capabilities:
    """What ``engine`` offers a realtime session; its ``model`` (None: the text model, the agent's mind) names it."""
    models = engine.models
    speech = models.speech().info if ModelKind.SPEECH in models else None
    named = models.get(ModelKind.TEXT) if ModelKind.TEXT in models else next(iter(models))
    name = model or named.info.model_name
    return Capabilities(
        model=name,
        voice=engine.voice if speech is not None else None,
        language=transcription_family(models).check_language if ModelKind.TRANSCRIPTION in models else None,
        default_voice=(speech.default_voice or (speech.voices[0] if speech.voices else None)) if speech else None,
        speech=speech is not None,
        text=ModelKind.TEXT in models,
        transcription=ModelKind.TRANSCRIPTION in models,
        vad=vad_factory is not None,
        semantic=vad_factory is not None and turn_model_factory is not None,
        output_rate=speech.sample_rate if speech is not None else 24000,
        sees=ModelKind.TEXT in models and models.text().info.sees_images,
    )


def limits(settings: Settings) -> Limits:
    return Limits(
        max_append_bytes=settings.realtime_max_append_bytes,
        max_buffer_seconds=settings.realtime_max_buffer_seconds,
        max_items=settings.realtime_max_items,
        session_seconds=settings.realtime_session_seconds,
        frames=settings.frame_limits,
    )


def _mono(samples: np.ndarray) -> np.ndarray:
    return samples if samples.ndim == 1 else samples.mean(axis=1, dtype=np.float32)


def _asr_input(samples: np.ndarray, rate: int) -> np.ndarray:
    """Int16 at 24 kHz -> float32 at the ASR model's rate (a worker-thread job)."""
    x = samples.astype(np.float32) / 32768.0
    return x if rate == 24000 else resample(x, 24000, rate)


def _judge_timed(detector: TurnDetector, queued: float) -> tuple[list[TurnEvent], float, float, float]:
    """``detector.judge()`` (in a worker thread) and its timing: seconds from ``queued`` to the start (waiting for
    a thread), wall seconds of the call, and this thread's CPU seconds in it."""
    start, cpu = time.perf_counter(), time.thread_time()
    events = detector.judge()
    return events, start - queued, time.perf_counter() - start, time.thread_time() - cpu


def _judge_many_timed(
    items: list[tuple[TurnDetector, float]],
) -> list[tuple[list[TurnEvent], float, float, float]]:
    """:func:`_judge_timed` for the pauses of one pass, in one call of their model (:func:`judge_many`): each one's
    wait from its own ``queued``, the call's wall and CPU seconds shared."""
    start, cpu = time.perf_counter(), time.thread_time()
    judged = judge_many([detector for detector, _ in items])
    run, cpu_s = time.perf_counter() - start, time.thread_time() - cpu
    return [(events, start - queued, run, cpu_s) for events, (_, queued) in zip(judged, items, strict=True)]


def _message(exc: BaseException) -> str:
    return getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"


class RealtimeSession:
    """One realtime session (see the module docstring); ``vad_factory`` and ``turn_model_factory`` None: the
    settings' ones."""

    def __init__(
        self,
        engine: AsyncEngine,
        settings: Settings,
        *,
        vad_factory: VadFactory | None = None,
        turn_model_factory: TurnModelFactory | None = None,
        clock: Clock | None = None,
        session_type: SessionType = SessionType.REALTIME,
        model: str | None = None,
        metrics: HttpMetrics | None = None,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.clock: Clock = clock or AnyioClock()
        self.vad_factory: VadFactory | None = vad_factory or settings.vad_factory
        self.turn_model_factory: TurnModelFactory | None = turn_model_factory or settings.turn_model_factory
        self.protocol = RealtimeProtocol(
            capabilities(engine, self.vad_factory, model, self.turn_model_factory),
            limits(settings),
            created_at=time.time(),
            session_type=session_type,
        )
        self.detector: TurnDetector | None = None
        # Turn detection commands, in order; unbounded: the protocol's input buffer limit bounds the audio in them
        self._turn_send, self._turn_inbox = anyio.create_memory_object_stream[ConfigureTurns | DetectTurns](math.inf)
        self._send, self.outgoing = anyio.create_memory_object_stream[ServerEvent | SessionClose](OUTGOING_EVENTS)
        self._lock = anyio.Lock()
        self._tg: TaskGroup | None = None
        self._stack = contextlib.AsyncExitStack()
        self._responses: dict[str, anyio.CancelScope] = {}
        self._held: dict[str, Held] = {}  # preemptive responses not adopted yet, by their own id
        self._streams: dict[str, RequestStream[TextDelta | Audio]] = {}  # response id -> its engine request
        self._asr_streams: dict[
            tuple[str, int], RequestStream[TextDelta]
        ] = {}  # (item id, content index) -> its request
        self._transcriptions: dict[str, list[anyio.CancelScope]] = {}
        # Each response's prompt is fitted to the context from every message's token count: counted once per text,
        # a conversation's messages are not tokenized again for each of its responses
        self._token_counts: dict[str, int] = {}
        self.finished = anyio.Event()  # set once the session has ended (server shutdown waits on it)
        self.goodbye = Outputs()  # set as the session ends: RealtimeProtocol.goodbye
        self.closed = False
        traces = settings.realtime_trace  # benchmarks: when each step of a turn happened (realtime.agent.trace)
        self.timeline: Timeline | None = traces.open(self.protocol.session_id) if traces is not None else None

    # --- lifetime ---

    async def __aenter__(self) -> RealtimeSession:
        self._tg = await self._stack.enter_async_context(anyio.create_task_group())
        self._tg.start_soon(self._expire_later)
        self._tg.start_soon(self._detect_turns)
        await self._apply(self.protocol.start)
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        self._abort_all()  # synchronous, first: every model slot is free before its next step
        self.goodbye = self.protocol.goodbye()  # what the socket says if the server, not the client, ended this
        self.protocol.close()
        self._turn_send.close()
        self.detector = None
        self.outgoing.close()  # wakes a sender blocked on a transport that is gone
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        try:
            return await self._stack.__aexit__(*exc_info)
        finally:
            self._send.close()
            self.finished.set()

    def _abort_all(self) -> None:
        for stream in [*self._streams.values(), *self._asr_streams.values()]:
            stream.abort()
        self._streams.clear()
        self._asr_streams.clear()
        for scope in self._responses.values():
            scope.cancel()
        for scopes in self._transcriptions.values():
            for scope in scopes:
                scope.cancel()

    def live(self) -> dict[str, int]:
        """Per-session state still held (all zero once the session has ended)."""
        p = self.protocol
        return {
            "engine_requests": len(self._streams) + len(self._asr_streams),
            "responses": len(self._responses),
            "held_responses": len(self._held),
            "transcriptions": sum(len(s) for s in self._transcriptions.values()),
            "buffered_samples": p.buffer.length,
            "pending_transcripts": len(p.pending),
            "detector": int(self.detector is not None),
        }

    # --- input ---

    async def client_message(self, text: str | bytes | None) -> None:
        """One WebSocket message (JSON text); a bad one gets an ``error`` event."""
        try:
            if isinstance(text, str) and len(text) > PARSE_OFF_LOOP_CHARS:
                event = await anyio.to_thread.run_sync(self._parse, text)
            else:
                event = self._parse(text)
        except RealtimeError as exc:
            await self._apply(self.protocol.refuse, exc)
            return
        await self.client_event(event)

    def _parse(self, text: str | bytes | None) -> ClientEvent:
        return parse(
            text,
            max_append_bytes=self.settings.realtime_max_append_bytes,
            max_instructions=self.protocol.limits.max_instructions,
            max_text_chars=self.settings.realtime_max_text_chars,
        )

    async def client_event(self, event: ClientEvent) -> None:
        # Off the loop: large appends and items with audio or images (decoding grows with the audio; pictures are
        # decoded there).
        heavy = (isinstance(event, InputAudioAppend) and len(event.audio) > AUDIO_OFF_LOOP_BYTES) or (
            isinstance(event, ItemCreate)
            and isinstance(event.item, NewItem)
            and any(p.audio or p.image for p in event.item.content)
        )
        await self._apply(self.protocol.receive, event, heavy=heavy)

    # --- the one path every transition takes ---

    async def _apply(self, transition: Callable[..., Outputs], *args: Any, heavy: bool = False) -> None:
        async with self._lock:
            if heavy:
                out = await anyio.to_thread.run_sync(transition, *args)
            else:
                out = transition(*args)
            if self.timeline is not None:
                self._trace(out)
            close = self._execute(out.commands)
            # Shielded: a transition that cancels the calling task (its own response) still sends its events.
            with anyio.CancelScope(shield=True):
                try:
                    for event in out.events:
                        await self._send.send(event)
                    if close is not None:
                        await self._send.send(close)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    pass  # the transport is gone: the session is ending

    def _mark(self, name: str) -> None:
        if self.timeline is not None:
            self.timeline.mark(name)

    def _trace(self, out: Outputs) -> None:
        """Mark the turn's events queued and the engine work commanded (benchmarks)."""
        for event in out.events:
            if event.type in TRACED_EVENTS:
                self._mark(f"event:{event.type}")
        for cmd in out.commands:
            if isinstance(cmd, Transcribe):
                self._mark("transcribe:" + ("spec" if cmd.speculative else "item"))
            elif isinstance(cmd, StartResponse):
                self._mark("respond:" + ("held" if cmd.preemptive else "now"))
            elif isinstance(cmd, AdoptResponse | CancelResponse | CancelTranscription):
                self._mark(f"cmd:{type(cmd).__name__}")

    def _execute(self, commands: list[Command]) -> SessionClose | None:
        """Carry out commands; synchronous, so aborts happen before any other task runs."""
        close = None
        for cmd in commands:
            if isinstance(cmd, CancelResponse):
                self._held.pop(cmd.response_id, None)
                stream = self._streams.pop(cmd.response_id, None)
                if stream is not None:
                    stream.abort()
                scope = self._responses.pop(cmd.response_id, None)
                if scope is not None:
                    scope.cancel()
            elif isinstance(cmd, StartResponse):
                scope = self._responses[cmd.response_id] = anyio.CancelScope()
                held = None
                if cmd.preemptive:
                    held = self._held[cmd.response_id] = Held(cmd.response_id, cmd.speak)
                self._spawn(self._respond, cmd, scope, held)
            elif isinstance(cmd, AdoptResponse):
                self._adopt(cmd)
            elif isinstance(cmd, Transcribe):
                scope = anyio.CancelScope()
                self._transcriptions.setdefault(cmd.item_id, []).append(scope)
                self._spawn(self._transcribe, cmd, scope)
            elif isinstance(cmd, CancelTranscription):
                for key in [k for k in self._asr_streams if k[0] == cmd.item_id]:
                    self._asr_streams.pop(key).abort()
                for scope in self._transcriptions.pop(cmd.item_id, []):
                    scope.cancel()
            elif isinstance(cmd, ConfigureTurns | DetectTurns):
                with contextlib.suppress(anyio.ClosedResourceError):
                    self._turn_send.send_nowait(cmd)
            elif isinstance(cmd, Close):
                self.closed = True
                close = SessionClose(cmd.code, cmd.reason)
        return close

    def _adopt(self, cmd: AdoptResponse) -> None:
        """The held preemptive run becomes ``cmd.response_id``: its stream and scope move, its outputs go out."""
        held = self._held.pop(cmd.preemptive_id, None)
        assert held is not None, f"no held response {cmd.preemptive_id}"  # the protocol adopts only live ones
        held.rid = cmd.response_id
        if cmd.preemptive_id in self._streams:
            self._streams[cmd.response_id] = self._streams.pop(cmd.preemptive_id)
        if cmd.preemptive_id in self._responses:
            self._responses[cmd.response_id] = self._responses.pop(cmd.preemptive_id)
        held.adopted.set()

    def _spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        assert self._tg is not None
        self._tg.start_soon(fn, *args)

    # --- engine work ---

    async def _respond(self, cmd: StartResponse, scope: anyio.CancelScope, held: Held | None = None) -> None:
        """One response's engine request; ``held`` (a preemptive one): nothing goes out until it is adopted."""
        rid = cmd.response_id
        with scope:
            try:
                messages = self._fit_unread(cmd)
                if messages is None:  # the exact counts decide: the texts not counted yet are tokenized on a thread
                    messages = await anyio.to_thread.run_sync(self._fit, cmd)
            except ContextExceeded as exc:
                await self._apply(self.protocol.response_failed, rid, str(exc), "context_length_exceeded")
                return
            try:
                speech = None
                if cmd.speak:  # first audio from the first clause, in a small first codec window
                    first = self.settings.realtime_first_codec_frames
                    bench = self.settings.enable_benchmark_fields
                    speech = SpokenReply(
                        voice=cmd.voice,
                        with_text=bool(cmd.tools),  # a reply's tool calls ride on the text model's deltas
                        first_clause=True,
                        initial_codec_chunk_frames=first,
                        first_unit_tokens=self.settings.realtime_bench_first_unit_tokens if bench else None,
                    )
                # Benchmarks only: random-weight LMs must not stop early, so a bounded reply ignores EOS.
                ignore_eos = self.settings.enable_benchmark_fields and cmd.max_tokens is not None
                prompt = TextRequest(
                    messages,
                    max_tokens=cmd.max_tokens,
                    ignore_eos=ignore_eos,
                    tools=cmd.tools,
                    tool_choice=cmd.tool_choice,
                )
                stream = self.engine.generate(ChatRequest(prompt, speech))
            except Exception as exc:
                await self._apply(self.protocol.response_failed, rid, _message(exc))
                return
            self._streams[rid] = stream
            self._mark("lm:submitted")
            try:
                async with stream:
                    outputs: AsyncIterator[StageOutput] = aiter(stream)
                    if self.timeline is not None:
                        outputs = self._traced(outputs)
                    if held is not None:
                        outputs = await self._hold(held, outputs)
                        rid = held.rid
                        self._mark("held:adopted")
                    pacer = audio_pacer(self.settings.realtime_run_ahead_seconds, self.clock)
                    sent = False
                    async for out in outputs:
                        chunk = out.chunk
                        if isinstance(chunk, Audio):
                            if chunk.n_samples:
                                await pacer.wait()
                                heavy = chunk.n_samples > 12000 or self._resamples_output()
                                await self._apply(self.protocol.response_audio, rid, _mono(chunk.samples), heavy=heavy)
                                pacer.sent(chunk.duration)
                                if not sent:
                                    sent = True
                                    self._mark("audio:queued")
                        elif isinstance(chunk, TextDelta):
                            if chunk.tool_calls:
                                await self._apply(self.protocol.response_tool_call, rid, chunk.tool_calls)
                            if out.stage == "speech":
                                await self._apply(self.protocol.response_transcript, rid, chunk.text)
                            elif not cmd.speak:  # a spoken reply's text arrives as its transcripts
                                await self._apply(self.protocol.response_text, rid, chunk.text)
            except Exception as exc:
                rid = held.rid if held is not None else rid
                if self._streams.pop(rid, None) is not None:  # not cancelled: it failed
                    log.warning("realtime response %s failed: %s", rid, _message(exc))
                    await self._apply(self.protocol.response_failed, rid, _message(exc))
                return
            finally:
                rid = held.rid if held is not None else rid
                self._responses.pop(rid, None)
                if held is not None:
                    self._held.pop(cmd.response_id, None)
            if self._streams.pop(rid, None) is None:
                return  # cancelled while the stream was ending
            text, speech_usage = stream.usage.get(ModelKind.TEXT), stream.usage.get(ModelKind.SPEECH)
            usage = ResponseUsage(
                input_text_tokens=text.input_tokens if text else 0,
                output_text_tokens=text.output_tokens if text else 0,
                output_audio_tokens=speech_usage.output_tokens if speech_usage else 0,
            )
            await self._apply(self.protocol.response_done, rid, usage)

    def _fit(self, cmd: StartResponse) -> tuple[ChatMessage, ...]:
        """The messages the prompt keeps under ``cmd.truncation`` (blocking: tokenizes every message)."""
        family = self.engine.models.get(ModelKind.TEXT)
        context = getattr(family.info, "max_context", None)
        if context is None:
            return cmd.messages
        said = [m.content + "".join(c.name + c.arguments for c in m.tool_calls) for m in cmd.messages]  # calls too
        tokens = [self._count_tokens(text) for text in said]
        count_image = getattr(family, "count_image_tokens", None)  # a model that sees: its messages' images too
        if count_image is not None:
            images = [sum(count_image(image) for image in m.images) for m in cmd.messages]
            tokens = [n + k for n, k in zip(tokens, images, strict=True)]
        count_tools = getattr(family, "count_tool_tokens", None)  # the tools' part of the prompt, where it is known
        tools = 0
        if cmd.tools and cmd.tool_choice.mode is not ToolMode.NONE and count_tools is not None:
            tools = min(context - 1, int(count_tools(cmd.tools)))
        return tuple(fit(list(cmd.messages), tokens, context, cmd.max_tokens, cmd.truncation, tools))

    def _fit_unread(self, cmd: StartResponse) -> tuple[ChatMessage, ...] | None:
        """``cmd.messages`` when they all fit even with each text not counted yet at its bound
        (:func:`~omni_stream.realtime.agent.truncation.token_bound`): what :meth:`_fit` would keep, decided on the
        loop without tokenizing, so the answer to a new turn does not wait for a thread (12-19 ms at 16-32 voice
        sessions, voice_bench run 61); None: :meth:`_fit` must count (images, tools, or too close to the context)."""
        family = self.engine.models.get(ModelKind.TEXT)
        context = getattr(family.info, "max_context", None)
        if context is None:
            return cmd.messages
        if cmd.tools or any(m.images or m.tool_calls for m in cmd.messages):
            return None
        counted = self._token_counts
        tokens = [counted.get(m.content) or token_bound(m.content) for m in cmd.messages]
        return cmd.messages if fits_whole(tokens, context, cmd.max_tokens) else None

    def _count_tokens(self, text: str) -> int:
        """``text``'s tokens under the text model's tokenizer, counted once per session (blocking: a worker thread)."""
        n = self._token_counts.get(text)
        if n is None:
            n = self.engine.count_text_tokens(text, ModelKind.TEXT)
            if len(self._token_counts) >= COUNTED_TEXTS:  # a bound, not a policy: the next prompts count them again
                self._token_counts.clear()
            self._token_counts[text] = n
        return n

    async def _traced(self, outputs: AsyncIterator[StageOutput]) -> AsyncIterator[StageOutput]:
        """``outputs``, marking the first text of each stage and the first audio as they come out of the engine."""
        seen: set[str] = set()
        async for out in outputs:
            chunk = out.chunk
            name = None
            if isinstance(chunk, Audio) and chunk.n_samples:
                name = "engine:audio"
            elif isinstance(chunk, TextDelta) and chunk.text:
                name = f"engine:{out.stage}_text"
            if name is not None and name not in seen:
                seen.add(name)
                self._mark(name)
            yield out

    async def _hold(self, held: Held, outputs: AsyncIterator[StageOutput]) -> AsyncIterator[StageOutput]:
        """Read a preemptive response up to its first audio (text-only: its first text) and wait to be adopted; the
        outputs from there on, those read included. Reading stops while it waits, so the models pause at their
        watermarks instead of running on."""
        early: list[StageOutput] = []
        async for out in outputs:
            early.append(out)
            if isinstance(out.chunk, Audio) and out.chunk.n_samples:
                break
            if isinstance(out.chunk, TextDelta) and out.stage == "text" and out.chunk.text and not held.speak:
                break
        held.holding.set()
        self._mark("held:ready")
        await held.adopted.wait()

        async def rest() -> AsyncIterator[StageOutput]:
            for out in early:
                yield out
            async for out in outputs:
                yield out

        return rest()

    def _resamples_output(self) -> bool:
        r = self.protocol.response
        return r is not None and r.encoder is not None and r.encoder.needs_resampling()

    async def _transcribe(self, cmd: Transcribe, scope: anyio.CancelScope) -> None:
        item, index = cmd.item_id, cmd.content_index
        with scope:
            try:
                if not cmd.samples.size:
                    await self._apply(self.protocol.transcription_done, item, index, 0, 0)
                    return
                rate = transcription_family(self.engine.models).info.sample_rate
                audio = await anyio.to_thread.run_sync(_asr_input, cmd.samples, rate)
                request = TranscriptionRequest(audio, rate, language=cmd.language, prompt=cmd.prompt,
                                               max_tokens=self.settings.realtime_transcription_max_tokens)  # fmt: skip
                stream = self.engine.generate(request)
                self._asr_streams[(item, index)] = stream
                kind = "spec" if cmd.speculative else "item"
                self._mark(f"asr:{kind}:submitted")
                async with stream:
                    async for out in stream:
                        if isinstance(out.chunk, TextDelta):
                            if self.timeline is not None and out.chunk.text:
                                self._mark(f"asr:{kind}:delta")
                            await self._apply(self.protocol.transcription_delta, item, index, out.chunk.text)
                self._mark(f"asr:{kind}:done")
                usage = stream.usage.get(ModelKind.TRANSCRIPTION)
                audio_tokens, text_tokens = (usage.input_tokens, usage.output_tokens) if usage else (0, 0)
                await self._apply(self.protocol.transcription_done, item, index, audio_tokens, text_tokens)
            except Exception as exc:
                log.warning("transcription of %s failed: %s", item, _message(exc))
                await self._apply(self.protocol.transcription_failed, item, index, _message(exc))
            finally:
                self._asr_streams.pop((item, index), None)
                scopes = self._transcriptions.get(item, [])
                if scope in scopes:
                    scopes.remove(scope)
                if not scopes:
                    self._transcriptions.pop(item, None)

    # --- turn detection ---

    async def _detect_turns(self) -> None:
        """Carry out the protocol's turn-detection commands in order (see the module docstring)."""
        async with self._turn_inbox:
            async for cmd in self._turn_inbox:
                if isinstance(cmd, ConfigureTurns):
                    await self._configure_turns(cmd)
                    continue
                samples, position = cmd.samples, cmd.position
                pieces = [samples]
                while True:  # the audio queued meanwhile, contiguous and of this epoch, in one thread job
                    try:
                        nxt = self._turn_inbox.receive_nowait()
                    except anyio.WouldBlock:
                        nxt = None
                    if not isinstance(nxt, DetectTurns) or nxt.epoch != cmd.epoch:
                        break
                    pieces.append(nxt.samples)
                await self._feed_turns(cmd.epoch, position, np.concatenate(pieces) if len(pieces) > 1 else samples)
                if nxt is not None:
                    if isinstance(nxt, ConfigureTurns):
                        await self._configure_turns(nxt)
                    else:
                        await self._feed_turns(nxt.epoch, nxt.position, nxt.samples)

    async def _configure_turns(self, cmd: ConfigureTurns) -> None:
        td = cmd.turn_detection
        current = self.detector
        if td is None or self.vad_factory is None:
            self.detector = None
        elif current is not None and current.rule == td.rule:
            current.reset(cmd.position)
        else:
            self.detector = await anyio.to_thread.run_sync(self._new_detector, td.rule, td.type, cmd.position)

    def _new_detector(self, rule: Any, kind: TurnType, position: int) -> TurnDetector:
        """A detector for ``rule`` (blocking: the first one loads the models)."""
        assert self.vad_factory is not None
        model: EndOfTurnModel | None = None
        if kind is TurnType.SEMANTIC_VAD and self.turn_model_factory is not None:
            model = self.turn_model_factory()
        detector = TurnDetector(rule, self.vad_factory(rule.vad), model)
        detector.reset(position)
        return detector

    async def _feed_turns(self, epoch: int, position: int, samples: np.ndarray) -> None:
        detector = self.detector
        if detector is None or epoch != self.protocol.turn_epoch:
            return
        if position != detector.fed:  # a gap (never expected): the detector restarts where the audio is
            detector.reset(position)
        # On the loop's few turn-detection threads (their own: never behind a burst of prompts), never a thread per
        # session: sixteen sessions' feeds on sixteen threads took turns at the GIL with the event loop and the
        # device worker (the prompt-preparation finding of omni_stream.runtime.offload, for the same reason). The
        # appends of one pass are fed together, their VADs in one network call: fed one after another, 32 sessions'
        # appends of one pass waited up to 0.8 s on the H200 host (voice_bench run 30: 7.7 ms a feed under load).
        events = await run_prepare_batched(feed_many, (detector, samples), Lane.TURNS)
        for event in events if self.timeline is not None else ():
            self._mark(f"vad:{event.kind}")
        await self._apply(self.protocol.turn_events, epoch, events, detector.fed)
        if detector.judging:  # the end-of-turn model after the pause's event went out: work started there overlaps it
            queued = time.perf_counter()
            if detector.model is not None and detector.model.batches:  # the pass's pauses in one call (on the GPU),
                # on a thread of their own: never queued behind the feeds (this session's next feed waits for it)
                events, wait_s, run_s, cpu_s = await run_prepare_batched(
                    _judge_many_timed, (detector, queued), Lane.JUDGE
                )
            else:  # a thread each: concurrent calls on CPU cores
                events, wait_s, run_s, cpu_s = await anyio.to_thread.run_sync(_judge_timed, detector, queued)
            if self.metrics is not None:
                self.metrics.observe_turn_model(wait_s, run_s, cpu_s)
            if self.timeline is not None:
                self.timeline.mark("judge:queued", at=time.monotonic() - (time.perf_counter() - queued))
                self._mark("judge:" + ",".join(e.kind for e in events))
            await self._apply(self.protocol.turn_events, epoch, events, detector.fed)

    async def _expire_later(self) -> None:
        await self.clock.sleep(self.protocol.limits.session_seconds)
        await self._apply(self.protocol.expire)
