"""Speculative work at pauses in the user's speech: the turn so far is transcribed at each pause (with
``semantic_vad`` already when the speech went quiet, at the position the pause will have: the pause keeps that
work), before the turn detector has decided that the turn is over, and (``session.preemptive_response``, on by
default) the answer to it is started as soon as that transcript is in.

The speculation is invisible: nothing of it reaches the client and nothing enters the conversation until the turn
is committed. A turn that goes on (``resumed``), a new turn, a clear or a manual commit drops it (its engine work
is cancelled). A turn that ends at the pause the speculation started from commits exactly the audio the
speculation transcribed, so the speculation *is* the committed item's transcription: its text so far goes out as
one delta after ``input_audio_buffer.committed``, the rest as it arrives, then ``completed``; a turn that ends
elsewhere (a later pause) is transcribed anew.

A preemptive response is a ``StartResponse(preemptive=True)`` the driver runs and holds (prefill, first tokens,
first audio; nothing is sent). When the turn is committed and the response it gets would ask the models for
exactly the same work (the same messages, voice and limits), the protocol adopts the held run
(``AdoptResponse``) instead of starting anew; otherwise, and whenever the speculation is dropped, it is cancelled
(``CancelResponse``: the driver aborts it, every model slot is freed, and nothing of it was ever emitted).
"""

from __future__ import annotations

from omni_stream.realtime.agent.events import Modality, SessionType
from omni_stream.realtime.agent.items import Item
from omni_stream.realtime.agent.outputs import CancelResponse, CancelTranscription, Outputs, Transcribe
from omni_stream.realtime.agent.protocol_state import ProtocolState, Speculation
from omni_stream.requests import ChatMessage, Role


class Speculating(ProtocolState):
    """Speculative transcription (see the module docstring); the turn and transcription parts call in here."""

    def _speech_paused(self, position: int) -> Outputs:
        """A quiet or a pause at ``position``: speculate on the turn so far. A pause where the open speculation
        ends (it started at the quiet before it: the same audio) keeps it."""
        start = self.buffer.start
        spec = self.speculation
        if spec is not None and spec.failed is None and (spec.start, spec.end) == (start, position):
            return Outputs()
        out = self._drop_speculation()
        if not self.caps.transcription or self._speech_start is None or position <= start:
            return out
        spec = self.speculation = Speculation(self._id("spec"), start, position)
        t = self.config.transcription
        lang, prompt = (t.language, t.prompt) if t is not None else (None, None)
        samples = self.buffer.peek(start, position)
        out.commands.append(Transcribe(spec.id, 0, samples, lang, prompt, speculative=True))
        return out

    def _drop_speculation(self) -> Outputs:
        """Drop the open speculation and the response started on it (their engine work is cancelled)."""
        spec, self.speculation = self.speculation, None
        out = self._drop_preempt()
        if spec is not None and not spec.done:
            out.commands.append(CancelTranscription(spec.id))
        return out

    def _drop_preempt(self) -> Outputs:
        pre, self.preempt = self.preempt, None
        return Outputs(commands=[CancelResponse(pre.response_id)] if pre is not None else [])

    def _preempt(self, spec: Speculation) -> Outputs:
        """Start the answer to ``spec``'s transcript, held by the driver, if the turn's end would start one now."""
        c, td = self.config, self.config.turn_detection
        if (
            spec.failed is not None
            or not c.preemptive_response
            or td is None
            or not td.create_response
            or c.type is not SessionType.REALTIME
            or not self.caps.text
            or self.response is not None
            or self.pending  # the answer would wait for other transcripts
            or self.preempt is not None
        ):
            return Outputs()
        text = "".join(spec.parts).strip()
        settings = self._response_settings(None)
        if not text or (settings["modality"] is Modality.AUDIO and not self.caps.speech):
            return Outputs()
        messages = [*self.conversation.messages(), ChatMessage(Role.USER, text)]
        self.preempt = self._reply_command(self._id("resp"), messages, settings, preemptive=True)
        return Outputs(commands=[self.preempt])

    def _speculation_for(self, start: int, end: int) -> Speculation | None:
        """The open speculation if it transcribed exactly ``start``..``end``; else it is dropped (returns None)."""
        spec = self.speculation
        if spec is not None and (spec.start, spec.end) == (start, end):
            self.speculation = None
            return spec
        return None

    def _adopt(self, spec: Speculation, item: Item) -> Outputs:
        """The committed ``item``'s transcription is ``spec``'s (the same audio)."""
        key = (item.id, 0)
        self.pending[key] = []
        out = Outputs()
        if spec.parts:
            out.extend(self.transcription_delta(item.id, 0, "".join(spec.parts)))
        if spec.failed is not None:
            return out.extend(self.transcription_failed(item.id, 0, spec.failed))
        if spec.done:
            return out.extend(self.transcription_done(item.id, 0, *spec.usage))
        self.adopted[spec.id] = item.id
        return out

    def _speculative_result(self, item_id: str) -> Speculation | None:
        """The unadopted speculation a transcription result belongs to (results go nowhere else)."""
        spec = self.speculation
        return spec if spec is not None and spec.id == item_id else None
