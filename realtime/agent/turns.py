"""Input audio and turns of the realtime protocol: the input buffer, turn detection (speech started, quiet, paused,
resumed, stopped; barge-in), commits, and the transcription of committed audio (commands out, results in).

Turn detection runs in the driver, never here: each append with turn detection on gives a ``DetectTurns`` command
(the samples and their stream position), and the driver feeds the detector's events back through
:meth:`TurnTaking.turn_event`. A detector restart (a commit, a clear, new settings) bumps :attr:`turn_epoch`
and says so in a ``ConfigureTurns`` command; events of an older epoch are ignored.
"""

from __future__ import annotations

import numpy as np

from omni_stream.realtime.agent.audio import RATE, InputDecoder
from omni_stream.realtime.agent.events import RealtimeError, SessionType
from omni_stream.realtime.agent.items import Content, ContentType, Item
from omni_stream.realtime.agent.outputs import ConfigureTurns, DetectTurns, Outputs, Transcribe
from omni_stream.realtime.agent.protocol_state import Phase, ProtocolState, Speculation, samples_ms
from omni_stream.requests import Role
from omni_stream.turns.detector import TurnEvent, TurnEventKind

MIN_COMMIT_MS = 100  # a commit needs this much audio (OpenAI's rule)


class TurnTaking(ProtocolState):
    """The input side of a session (see the module docstring)."""

    def _restart_turns(self) -> Outputs:
        """A fresh detector from the buffer's end (the turn in progress, if any, is forgotten)."""
        self.turn_epoch += 1
        self._speech_start, self._turn_item = None, None
        self._heard = self.buffer.end
        return Outputs(commands=[ConfigureTurns(self.config.turn_detection, self.turn_epoch, self.buffer.end)])

    def _append(self, data: bytes) -> Outputs:
        self.decoder.check(data)
        limit = int(self.limits.max_buffer_seconds * RATE)
        if self.buffer.length + self.decoder.samples_for(len(data)) > limit:
            raise RealtimeError(
                "input_audio_buffer_overflow",
                f"the input audio buffer would pass {self.limits.max_buffer_seconds:g} s: commit or clear it first",
            )
        position = self.buffer.end
        samples = self.decoder.decode(data)
        self.buffer.append(samples)
        td = self.config.turn_detection
        if td is None or not samples.size:
            return Outputs()
        self._trim()
        return Outputs(commands=[DetectTurns(samples, position, self.turn_epoch)])

    def _trim(self) -> None:
        """While nobody speaks, keep only what a start report may still need: the detector has not heard the audio
        past ``_heard`` yet (it may lag behind a client that sends faster than real time), and reports a start
        late by up to ``vad_lookback_ms``."""
        td = self.config.turn_detection
        if self._speech_start is None and td is not None:
            keep = td.rule.vad.prefix_padding_ms + self.limits.vad_lookback_ms
            self.buffer.drop_before(min(self.buffer.end, self._heard) - keep * RATE // 1000)

    def turn_events(self, epoch: int, events: list[TurnEvent], heard: int) -> Outputs:
        """Events of the driver's turn detector, which has now heard the stream up to position ``heard``."""
        out = Outputs()
        for event in events:
            out.extend(self.turn_event(epoch, event))
        if epoch == self.turn_epoch and self.phase is not Phase.CLOSED:
            self._heard = max(self._heard, heard)
            self._trim()
        return out

    def turn_event(self, epoch: int, event: TurnEvent) -> Outputs:
        """One event of the driver's turn detector (see the module docstring)."""
        if self.phase is Phase.CLOSED or epoch != self.turn_epoch or self.config.turn_detection is None:
            return Outputs()
        if event.kind is TurnEventKind.STARTED:
            return self._drop_speculation().extend(self._speech_started(event.position))
        if self._speech_start is None:
            return Outputs()
        if event.kind in (TurnEventKind.QUIET, TurnEventKind.PAUSED):
            return self._speech_paused(event.position)
        if event.kind is TurnEventKind.RESUMED:
            return self._drop_speculation()
        return self._speech_stopped(event.position)

    def _speech_started(self, position: int) -> Outputs:
        td = self.config.turn_detection
        assert td is not None
        self._speech_start = max(self.buffer.start, position - td.rule.vad.prefix_padding_ms * RATE // 1000)
        self.buffer.drop_before(self._speech_start)
        self._turn_item = self._id("item")
        out = Outputs(
            [
                self._event(
                    "input_audio_buffer.speech_started", audio_start_ms=samples_ms(position), item_id=self._turn_item
                )
            ]
        )
        if self.response is not None and td.interrupt_response:
            out.extend(self._cancel("turn_detected"))
        return out

    def _speech_stopped(self, position: int) -> Outputs:
        td = self.config.turn_detection
        assert td is not None and self._turn_item is not None
        item_id = self._turn_item
        out = Outputs(
            [self._event("input_audio_buffer.speech_stopped", audio_end_ms=samples_ms(position), item_id=item_id)]
        )
        spec = self._speculation_for(self.buffer.start, position)
        if spec is None:
            out.extend(self._drop_speculation())  # one that transcribed other audio, and its response
        samples = self.buffer.take(max(0, position - self.buffer.start))
        self._speech_start, self._turn_item = None, None
        out.extend(self._commit_samples(samples, item_id, spec))
        if td.create_response and self.config.type is SessionType.REALTIME and self.response is None:
            if self.caps.text:
                out.extend(self._start_response(self._id("resp"), self._response_settings(None)))
        return out.extend(self._drop_preempt())  # a preemptive response no response adopted

    def _commit(self) -> Outputs:
        # G.711 input: the resampler holds back a few milliseconds of look-ahead until later appends; a commit ends
        # the audio, so they belong to this turn (and the next turn's audio starts a fresh resampler). A refused
        # commit changes nothing: the buffer and the resampler go on as they were.
        length = self.buffer.length + self.decoder.held
        if samples_ms(length) < MIN_COMMIT_MS:
            raise RealtimeError(
                "input_audio_buffer_commit_empty",
                f"Error committing input audio buffer: buffer too small. Expected at least {MIN_COMMIT_MS}ms of "
                f"audio, but buffer only has {length * 1000 / RATE:.2f}ms of audio.",
            )
        tail = self.decoder.flush()
        self.decoder = InputDecoder(self.config.input_format)
        if tail.size:
            self.buffer.append(tail)
        item_id = self._turn_item or self._id("item")
        samples = self.buffer.take(self.buffer.length)
        out = self._drop_speculation()
        out.extend(self._restart_turns() if self.config.turn_detection is not None else Outputs())
        self._speech_start, self._turn_item = None, None
        return out.extend(self._commit_samples(samples, item_id))

    def _commit_samples(self, samples: np.ndarray, item_id: str, spec: Speculation | None = None) -> Outputs:
        """Commit ``samples`` as a user item; ``spec``: a speculation that transcribed exactly these samples."""
        previous = self.conversation.last_id()
        item = Item(item_id, Role.USER, [Content(ContentType.INPUT_AUDIO, audio_ms=samples_ms(samples.size))])
        out = Outputs([self._event("input_audio_buffer.committed", item_id=item_id, previous_item_id=previous)])
        out.extend(self._add_item(item, None))
        if spec is not None and self.caps.transcription:
            return out.extend(self._adopt(spec, item))
        out.extend(self._transcribe(item, 0, samples))
        return out

    def _clear_input(self) -> Outputs:
        self.buffer.clear()
        self.decoder = InputDecoder(self.config.input_format)  # its held-back look-ahead is cleared audio too
        out = self._drop_speculation()
        out.extend(self._restart_turns() if self.config.turn_detection is not None else Outputs())
        self._speech_start, self._turn_item = None, None
        return out

    def _transcribe(self, item: Item, index: int, samples: np.ndarray) -> Outputs:
        if not self.caps.transcription:
            error = {
                "type": "invalid_request_error",
                "code": "transcription_unavailable",
                "message": "this server has no transcription model loaded",
                "param": None,
            }
            event = self._event(
                "conversation.item.input_audio_transcription.failed", item_id=item.id, content_index=index, error=error
            )
            return Outputs([event])
        self.pending[(item.id, index)] = []
        t = self.config.transcription
        lang, prompt = (t.language, t.prompt) if t is not None else (None, None)
        return Outputs(commands=[Transcribe(item.id, index, samples, lang, prompt)])

    # --- transcription results ---

    def transcription_delta(self, item_id: str, content_index: int, text: str) -> Outputs:
        spec = self._speculative_result(item_id)
        if spec is not None:  # kept from the client until the turn is committed
            spec.parts.append(text)
            return Outputs()
        item_id = self.adopted.get(item_id, item_id)
        parts = self.pending.get((item_id, content_index))
        if parts is None or not text or self.phase is Phase.CLOSED:
            return Outputs()
        parts.append(text)
        event = self._event(
            "conversation.item.input_audio_transcription.delta",
            item_id=item_id,
            content_index=content_index,
            delta=text,
        )
        return Outputs([event])

    def transcription_done(self, item_id: str, content_index: int, audio_tokens: int, text_tokens: int) -> Outputs:
        spec = self._speculative_result(item_id)
        if spec is not None:
            spec.done, spec.usage = True, (audio_tokens, text_tokens)
            return self._preempt(spec)
        item_id = self.adopted.pop(item_id, item_id)
        parts = self.pending.pop((item_id, content_index), None)
        item = self.conversation.get(item_id)
        if parts is None or item is None or self.phase is Phase.CLOSED:
            return Outputs()
        transcript = "".join(parts).strip()
        item.content[content_index].transcript = transcript
        usage = {
            "type": "tokens",
            "input_tokens": audio_tokens,
            "output_tokens": text_tokens,
            "total_tokens": audio_tokens + text_tokens,
            "input_token_details": {"text_tokens": 0, "audio_tokens": audio_tokens},
        }
        out = Outputs(
            [
                self._event(
                    "conversation.item.input_audio_transcription.completed",
                    item_id=item_id,
                    content_index=content_index,
                    transcript=transcript,
                    usage=usage,
                )
            ]
        )
        return out.extend(self._resolve((item_id, content_index)))

    def transcription_failed(self, item_id: str, content_index: int, message: str) -> Outputs:
        spec = self._speculative_result(item_id)
        if spec is not None:
            spec.done, spec.failed = True, message
            return Outputs()
        item_id = self.adopted.pop(item_id, item_id)
        if self.pending.pop((item_id, content_index), None) is None or self.phase is Phase.CLOSED:
            return Outputs()
        error = {"type": "server_error", "code": "transcription_failed", "message": message, "param": None}
        event = self._event(
            "conversation.item.input_audio_transcription.failed",
            item_id=item_id,
            content_index=content_index,
            error=error,
        )
        return Outputs([event]).extend(self._resolve((item_id, content_index)))
