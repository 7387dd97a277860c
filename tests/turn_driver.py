"""What the realtime session driver does with turn detection, done synchronously for protocol tests without a server.

``SyncTurns(proto, vad_factory, model)`` carries out the protocol's ``ConfigureTurns`` and ``DetectTurns`` commands
with a real :class:`~omni_stream.turns.detector.TurnDetector` (the given voice activity detector and end-of-turn
model) and feeds its events back through ``turn_event``; ``run(out)`` returns ``out`` with every event and command
that followed from it, in order (turn commands consumed, the rest kept for the test).
"""

from __future__ import annotations

from typing import Any

from omni_stream.realtime.agent.outputs import ConfigureTurns, DetectTurns, Outputs
from omni_stream.realtime.agent.protocol import RealtimeProtocol
from omni_stream.turns.detector import TurnDetector
from omni_stream.turns.rules import TurnType


class SyncTurns:
    def __init__(self, proto: RealtimeProtocol, vad_factory: Any, model: Any = None) -> None:
        self.proto = proto
        self.vad_factory = vad_factory
        self.model = model
        self.detector: TurnDetector | None = None
        self.events: list[Any] = []  # every turn event the detector gave

    def run(self, out: Outputs) -> Outputs:
        result = Outputs(list(out.events))
        queue = list(out.commands)
        while queue:
            cmd = queue.pop(0)
            if isinstance(cmd, ConfigureTurns):
                td = cmd.turn_detection
                if td is None:
                    self.detector = None
                else:
                    model = self.model if td.type is TurnType.SEMANTIC_VAD else None
                    self.detector = TurnDetector(td.rule, self.vad_factory(td.rule.vad), model)
                    self.detector.reset(cmd.position)
            elif isinstance(cmd, DetectTurns):
                if self.detector is None or cmd.epoch != self.proto.turn_epoch:
                    continue
                events = [*self.detector.feed(cmd.samples), *self.detector.judge()]
                self.events.extend(events)
                more = self.proto.turn_events(cmd.epoch, events, self.detector.fed)
                result.events.extend(more.events)
                queue[:0] = more.commands  # carried out before the commands queued behind this one
            else:
                result.commands.append(cmd)
        return result
