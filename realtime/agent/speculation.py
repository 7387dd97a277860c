"""Speculative work at pauses in the user's speech: the turn so far is transcribed at each pause, before the turn
detector has decided that the turn is over.

The speculation is invisible: nothing of it reaches the client and nothing enters the conversation until the turn
is committed. A turn that goes on (``resumed``), a new turn, a clear or a manual commit drops it (its engine work
is cancelled). A turn that ends at the pause the speculation started from commits exactly the audio the
speculation transcribed, so the speculation *is* the committed item's transcription: its text so far goes out as
one delta after ``input_audio_buffer.committed``, the rest as it arrives, then ``completed``; a turn that ends
elsewhere (a later pause) is transcribed anew.
"""

from __future__ import annotations

from omni_stream.realtime.agent.items import Item
from omni_stream.realtime.agent.outputs import CancelTranscription, Outputs, Transcribe
from omni_stream.realtime.agent.protocol_state import ProtocolState, Speculation


class Speculating(ProtocolState):
    """Speculative transcription (see the module docstring); the turn and transcription parts call in here."""

    def _speech_paused(self, position: int) -> Outputs:
        out = self._drop_speculation()
        start = self.buffer.start
        if not self.caps.transcription or self._speech_start is None or position <= start:
            return out
        spec = self.speculation = Speculation(self._id("spec"), start, position)
        t = self.config.transcription
        lang, prompt = (t.language, t.prompt) if t is not None else (None, None)
        samples = self.buffer.peek(start, position)
        out.commands.append(Transcribe(spec.id, 0, samples, lang, prompt))
        return out

    def _drop_speculation(self) -> Outputs:
        spec, self.speculation = self.speculation, None
        if spec is None or spec.done:
            return Outputs()
        return Outputs(commands=[CancelTranscription(spec.id)])

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
