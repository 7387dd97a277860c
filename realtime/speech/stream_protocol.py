"""WS /v1/audio/speech/stream as a sans-I/O state machine: client messages, timers and generation events in, actions
out (PROTOCOLS.md, "WS /v1/audio/speech/stream").

:class:`SpeechStreamProtocol` holds no socket, no clock and no engine: the shell (:mod:`.stream`) feeds it what
happened, with the time (``receive_text``, ``timeout`` at :meth:`SpeechStreamProtocol.deadline`, ``unit_started``,
...), and performs the actions it returns, in order. What the protocol decides:

- The first message must be a valid ``session.config`` (within ``ws_config_timeout``); anything else, or a config
  the engine refuses, is an ``error`` and a 1008 close. Later bad messages only get an ``error``.
- A config is parsed here (:func:`~omni_stream.realtime.speech.params.parse_options`); the shell resolves it
  (:class:`ResolveConfig`: the engine's checks, the reference audio's loading) and reports back with
  :meth:`~SpeechStreamProtocol.config_resolved` or :meth:`~SpeechStreamProtocol.config_refused`. A new config is
  refused while an utterance is open.
- Text becomes units by the session's ``text_input_mode``: ``buffered`` cuts them by ``split_granularity`` (one per
  ``input.done`` by default), ``commitment`` whenever :mod:`.text_commit` finds a span safe to speak. Units and
  utterance ends wait in the protocol's queue, in order, for the shell's dispatcher
  (:meth:`~SpeechStreamProtocol.take`); at most ``max_ws_queued_units`` units may be queued or synthesizing (more
  is refused, leaving the buffer as it was).
- ``input.cancel`` drops the queued units (an ``epoch`` older than the session's), stops those in flight
  (:class:`CancelUnits`) and ends the open utterance (``session.done`` with ``cancelled``).
- What the client reads of each unit: ``audio.start``, its audio, an ``error`` if its generation failed, and
  ``audio.done``; ``session.done`` after an utterance's last unit.
- ``session.close`` drains: queued units finish, then the socket closes with 1000 (text not ended by ``input.done``
  is not spoken, and an ``error`` says so). Idle past ``ws_idle_timeout``
  (generating counts as activity), the session closes with 1000; a server shutting down closes it with 1001.
"""

from __future__ import annotations

import json
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeAlias

from omni_stream.realtime.common.audio_out import output_rate
from omni_stream.realtime.common.close_codes import CloseCode
from omni_stream.realtime.common.errors import from_exception
from omni_stream.realtime.common.socket_actions import Close, SendBinary, SendText
from omni_stream.realtime.settings import Settings
from omni_stream.realtime.speech.params import SpeechOptions, TextInputMode, check_model, parse_options
from omni_stream.realtime.speech.stream_messages import ProtocolError, input_text, parse_message
from omni_stream.realtime.speech.text_commit import TextCommitter
from omni_stream.requests import SpeechRequest
from omni_stream.speech.limits import MAX_INPUT_CHARS
from omni_stream.speech.text_split import TextSplitter

# --- what the protocol queues -----------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class UnitSpec:
    """One piece of text to synthesize, with the config that was current when it was queued."""

    utterance: int
    sentence: int
    text: str
    epoch: int
    opts: SpeechOptions
    template: SpeechRequest


@dataclass(slots=True, frozen=True)
class UtteranceEnd:
    """Marks the end of an utterance in the send order (``input.done``, or ``input.cancel`` when ``cancelled``)."""

    utterance: int
    epoch: int
    cancelled: bool = False


# --- actions ------------------------------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class ResolveConfig:
    """Resolve ``opts`` into the template request of the session's units, then report back (see the module doc)."""

    opts: SpeechOptions


@dataclass(slots=True, frozen=True)
class Dispatch:
    """Units or utterance ends wait in the queue: wake the dispatcher (:meth:`SpeechStreamProtocol.take`)."""


@dataclass(slots=True, frozen=True)
class CancelUnits:
    """Stop every unit in flight now (their engine requests are released) and interrupt the playback clock."""


Action: TypeAlias = SendText | SendBinary | ResolveConfig | Dispatch | CancelUnits | Close


class Phase(StrEnum):
    CONFIG = "config"  # waiting for the first session.config
    OPEN = "open"
    DRAINING = "draining"  # session.close received: finish queued units, then close
    CLOSED = "closed"


def _json(message: dict[str, Any]) -> SendText:
    return SendText(json.dumps(message, ensure_ascii=False))


def error(message: str, **extra: Any) -> SendText:
    """The ``error`` event (non-fatal once the session is configured)."""
    return _json({"type": "error", "message": message, **extra})


class SpeechStreamProtocol:
    """One speech stream's protocol state (see the module docstring). Times are monotonic seconds.

    ``models``: the names ``session.config``'s ``model`` may carry; ``sample_rate``: the speech model's (Hz).
    """

    def __init__(self, settings: Settings, *, models: tuple[str, ...], sample_rate: int, now: float) -> None:
        self.settings = settings
        self.models = models
        self.sample_rate = sample_rate
        self.phase = Phase.CONFIG
        self.opts: SpeechOptions | None = None
        self.template: SpeechRequest | None = None
        self.splitter: TextSplitter | TextCommitter = TextSplitter(max_chars=MAX_INPUT_CHARS)
        self.utterance = 0  # index of the utterance text is now added to
        self.utterances_done = 0  # session.done events sent (utterances finished or cancelled)
        self.sentence = 0  # next sentence index inside it
        self.epoch = 0  # bumped by input.cancel: queued work of older epochs is dropped
        self.outstanding = 0  # units queued or in flight
        self.queue: deque[UnitSpec | UtteranceEnd] = deque()  # not yet taken by the dispatcher
        self.started: defaultdict[int, int] = defaultdict(int)  # units whose audio.start went out, per utterance
        self._config_deadline = now + settings.ws_config_timeout
        self._last_activity = now

    # --- timers and the connection ---

    def deadline(self) -> float | None:
        """When :meth:`timeout` must next be called (None: no timer runs now: draining, or closed)."""
        if self.phase is Phase.CONFIG:
            return self._config_deadline
        if self.phase is Phase.OPEN:
            return self._last_activity + self.settings.ws_idle_timeout
        return None

    def timeout(self, now: float) -> list[Action]:
        """Call at :meth:`deadline` (or later): the config or idle timeout, when it really passed; else nothing.

        Units queued or synthesizing count as activity: the idle clock starts again from ``now``.
        """
        deadline = self.deadline()
        if deadline is None or now < deadline:
            return []
        if self.phase is Phase.CONFIG:
            return self._close(CloseCode.POLICY, "Timeout waiting for session.config")
        if self.outstanding:
            self._last_activity = now
            return []
        return self._close(CloseCode.NORMAL, "Idle timeout: no message received")

    def disconnected(self) -> list[Action]:
        """The client left: stop whatever runs."""
        self.phase = Phase.CLOSED
        return [CancelUnits()]

    def shutdown(self) -> list[Action]:
        """The server is stopping: an ``error`` saying so, then close with 1001."""
        return self._close(CloseCode.GOING_AWAY, "Server shutting down")

    def failed(self, exc: BaseException) -> list[Action]:
        """The shell failed with ``exc``: an ``error`` naming it, then close with 1011."""
        return self._close(CloseCode.INTERNAL, f"Internal error: {exc}")

    @property
    def in_utterance(self) -> bool:
        """Whether an utterance is open: text or units of one not yet ended, or one ended but not yet done.

        Read once the session's units are cancelled, so it counts what cancelling leaves unchanged (units in
        flight are counted down as they are cancelled).
        """
        return self.utterances_done < self.utterance or self.sentence > 0 or bool(self.splitter.pending.strip())

    def _close(self, code: int, message: str | None = None) -> list[Action]:
        if self.phase is Phase.CLOSED:
            return []
        self.phase = Phase.CLOSED
        return [CancelUnits(), *([error(message)] if message is not None else []), Close(code)]

    # --- client messages ---

    def receive_text(self, text: str, now: float) -> list[Action]:
        """One text message from the client."""
        return self._receive({"type": "websocket.receive", "text": text}, now)

    def receive_binary(self, now: float) -> list[Action]:
        """One binary message from the client (the protocol has none)."""
        return self._receive({"type": "websocket.receive", "bytes": b""}, now)

    def _receive(self, message: dict[str, Any], now: float) -> list[Action]:
        if self.phase not in (Phase.CONFIG, Phase.OPEN):
            return []
        self._last_activity = now
        try:
            body = parse_message(message, self._message_limit)
            if self.phase is Phase.CONFIG:
                if body.get("type") != "session.config":
                    raise ProtocolError(f"Expected session.config, got: {body.get('type')}")
                return self._config(body)
            return self._handle(body, message.get("text") or "")
        except ProtocolError as exc:
            if self.phase is Phase.CONFIG:
                return self._close(CloseCode.POLICY, str(exc))
            return [error(str(exc))]

    def _handle(self, body: dict[str, Any], raw: str) -> list[Action]:
        kind = body.get("type")
        if kind == "input.text":
            text = input_text(body, raw, self.settings.max_ws_text_bytes)
            limit = self.settings.max_ws_pending_chars
            if len(self.splitter.pending) + len(text) > limit:
                raise ProtocolError(f"Buffered text would exceed {limit} characters: send input.done first")
            return self._queue_units(self._split(lambda: self.splitter.feed(text)))
        if kind == "input.done":
            self._queue_units(self._split(self.splitter.flush, ends=1))
            self.queue.append(UtteranceEnd(self.utterance, self.epoch))
            self.utterance += 1
            self.sentence = 0
            return [Dispatch()]
        if kind == "input.cancel":
            return self._cancel()
        if kind == "session.config":
            if self.splitter.pending.strip() or self.sentence:
                raise ProtocolError(
                    "session.config cannot be applied while an utterance is in progress; send input.done first"
                )
            return self._config(body)
        if kind == "session.close":
            self.phase = Phase.DRAINING
            # Text never ended by input.done is not spoken; say so, or a client that streamed an LLM's reply and
            # closed loses its last sentence (all of it, without splitting) with no sign of why.
            left = self.splitter.pending.strip()
            unspoken = f"session.close: {len(left)} characters not spoken; send input.done before session.close"
            return [*([error(unspoken)] if left else []), Dispatch()]  # the dispatcher ends after the queued units
        raise ProtocolError(f"Unknown message type: {kind}")

    @property
    def _message_limit(self) -> int:
        """The largest message read (bytes): a session.config carries the reference audio a POST
        /v1/audio/speech body may carry, so it is allowed that body's size (``input.text`` has its own bound)."""
        return max(self.settings.max_ws_config_bytes, self.settings.max_speech_body_bytes)

    # --- configuration ---

    def _config(self, body: dict[str, Any]) -> list[Action]:
        config = {k: v for k, v in body.items() if k != "type"}
        try:
            opts = parse_options(config, self.settings, websocket=True)
            check_model(opts.model, self.models)
        except Exception as exc:
            raise ProtocolError(f"Invalid session config: {from_exception(exc).message}") from exc
        return [ResolveConfig(opts)]

    def config_resolved(self, opts: SpeechOptions, template: SpeechRequest) -> list[Action]:
        """The engine accepted the config: later units are spoken with ``template`` (the first config opens)."""
        if self.phase is Phase.CLOSED:
            return []
        self.opts, self.template = opts, template
        self.splitter = self._splitter(opts)
        if self.phase is Phase.CONFIG:
            self.phase = Phase.OPEN
        return []

    def config_refused(self, exc: BaseException) -> list[Action]:
        """The engine refused the config: an ``error`` naming why (the first config: and a 1008 close)."""
        message = f"Invalid session config: {from_exception(exc).message}"
        if self.phase is Phase.CONFIG:
            return self._close(CloseCode.POLICY, message)
        return [] if self.phase is Phase.CLOSED else [error(message)]

    def _splitter(self, opts: SpeechOptions) -> TextSplitter | TextCommitter:
        if opts.text_input_mode is TextInputMode.COMMITMENT:
            limit = self.settings.max_ws_uncommitted_chars
            return TextCommitter(opts.language, max_uncommitted=limit, max_chars=MAX_INPUT_CHARS)
        return TextSplitter(opts.split_granularity, max_chars=MAX_INPUT_CHARS)

    # --- units ---

    def _split(self, split: Callable[[], list[str]], ends: int = 0) -> list[str]:
        """The units ``split`` cuts from the buffer, unless they would pass ``max_ws_queued_units``: then the
        buffer is left as it was and the message is refused (the client may resend once units finish).
        ``ends`` utterance markers follow the units; they are bounded too (twice the unit limit in the queue)."""
        before = self.splitter.pending
        units = split()
        limit = self.settings.max_ws_queued_units
        if self.outstanding + len(units) > limit or len(self.queue) + len(units) + ends > 2 * limit:
            self.splitter.restore(before)
            if len(units) > limit:  # no audio.done frees room for these: waiting would never end
                raise ProtocolError(self._too_many_at_once(len(units), limit, ends))
            raise ProtocolError(
                f"Too many queued units: {self.outstanding} waiting and {len(units)} more would pass the limit "
                f"of {limit}; wait for audio.done before sending more"
            )
        return units

    @staticmethod
    def _too_many_at_once(units: int, limit: int, ends: int) -> str:
        if not ends:  # input.text: its text was not kept
            return (
                f"Too many units at once: this input.text makes {units}, over the limit of {limit} a session may "
                "queue; send it in smaller parts"
            )
        return (  # input.done: the buffered text stays, and no input.done can ever take it
            f"Too many units at once: the buffered text makes {units}, over the limit of {limit} a session may "
            "queue; send input.cancel, then the text in smaller parts, each ended by input.done"
        )

    def _queue_units(self, units: list[str]) -> list[Action]:
        assert self.opts is not None and self.template is not None
        for text in units:
            self.outstanding += 1
            self.queue.append(UnitSpec(self.utterance, self.sentence, text, self.epoch, self.opts, self.template))
            self.sentence += 1
        return [Dispatch()] if units else []

    def _cancel(self) -> list[Action]:
        """input.cancel: drop queued units, stop the ones in flight, end the open utterance."""
        open_utterance = bool(self.splitter.pending.strip() or self.sentence)
        if not self.outstanding and not open_utterance:
            raise ProtocolError("No utterance in progress to cancel")
        if open_utterance and len(self.queue) >= 2 * self.settings.max_ws_queued_units:
            raise ProtocolError("Too many queued messages; wait for audio.done before cancelling")
        self.epoch += 1
        self.splitter.clear()
        if not open_utterance:
            return [CancelUnits()]
        self.queue.append(UtteranceEnd(self.utterance, self.epoch, cancelled=True))
        self.utterance += 1
        self.sentence = 0
        return [CancelUnits(), Dispatch()]

    def take(self) -> UnitSpec | UtteranceEnd | None:
        """The next queued item for the dispatcher, or None (wait for :class:`Dispatch`, unless :attr:`drained`).

        A unit dropped by ``input.cancel`` while it waited is still handed out: the dispatcher ends it at once
        (:meth:`current`), after waiting its turn for a slot, so the order of sends is kept.
        """
        return self.queue.popleft() if self.queue else None

    @property
    def drained(self) -> bool:
        """Whether the queue is empty and will stay so (``session.close`` received, or the session is closed)."""
        return not self.queue and self.phase in (Phase.DRAINING, Phase.CLOSED)

    def current(self, unit: UnitSpec) -> bool:
        """Whether ``unit`` is still to be spoken (no ``input.cancel`` since it was queued)."""
        return unit.epoch == self.epoch

    # --- generation events (in send order) ---

    def unit_started(self, unit: UnitSpec) -> list[Action]:
        """``unit``'s audio begins: ``audio.start``."""
        self.started[unit.utterance] += 1
        start = {
            "type": "audio.start",
            "utterance_index": unit.utterance,
            "sentence_index": unit.sentence,
            "sentence_text": unit.text,
            "format": self._format(unit.opts),
            "sample_rate": self.unit_rate(unit),
            "channels": 1,
        }
        return [_json(start)]

    def unit_rate(self, unit: UnitSpec) -> int:
        """The sample rate ``unit``'s audio goes out at (Hz): its ``sample_rate``, or the nearest its format carries."""
        return output_rate(self._format(unit.opts), self.sample_rate, unit.opts.sample_rate)

    def unit_audio(self, data: bytes) -> list[Action]:
        """A piece of the current unit's audio (one whole file, or a PCM chunk with ``stream_audio``)."""
        return [] if self.phase is Phase.CLOSED else [SendBinary(data)]

    def unit_done(self, unit: UnitSpec, total_bytes: int, failure: str | None, cancelled: bool) -> list[Action]:
        """``unit`` ended: an ``error`` when its generation failed (``failure``: why), then ``audio.done``."""
        where = {"utterance_index": unit.utterance, "sentence_index": unit.sentence}
        actions: list[Action] = []
        if failure is not None:
            extra = {"partial_audio": True, "action": "discard"} if total_bytes else {}
            message = f"Generation failed for utterance {unit.utterance}, sentence {unit.sentence}: {failure}"
            actions.append(error(message, **extra))
        done = {"type": "audio.done", **where, "total_bytes": total_bytes, "error": failure is not None}
        if cancelled:
            done["cancelled"] = True
        return [*actions, _json(done)]

    def unit_finished(self, now: float) -> None:
        """A unit left the session (spoken, failed, cancelled or dropped): the idle clock restarts."""
        self.outstanding -= 1
        self._last_activity = now

    def utterance_done(self, end: UtteranceEnd) -> list[Action]:
        """An utterance's units have all ended: ``session.done``."""
        done: dict[str, Any] = {"type": "session.done", "utterance_index": end.utterance}
        done["total_sentences"] = self.started.pop(end.utterance, 0)
        if end.cancelled or end.epoch != self.epoch:
            done["cancelled"] = True
        self.utterances_done += 1
        return [_json(done)]

    def drained_close(self) -> list[Action]:
        """``session.close`` was received and every queued unit has ended: close with 1000."""
        return self._close(CloseCode.NORMAL)

    @staticmethod
    def _format(opts: SpeechOptions) -> str:
        return "pcm" if opts.stream_audio else opts.response_format
