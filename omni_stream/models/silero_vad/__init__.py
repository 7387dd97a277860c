"""Voice activity detection on Silero VAD, from the ``silero-vad`` wheel (it ships the model; nothing downloads).

- :class:`SileroVad` (``SileroVad(VadParams(...), sample_rate=24000)``): a
  :class:`~omni_stream.turns.vad.VoiceActivityDetector` for one stream, with OpenAI ``server_vad`` turns.
- :class:`SileroPauseDetector`: the same network as fastrtc's ``PauseDetectionModel`` (``ReplyOnPause(model=...)``).
- :func:`advance` / :func:`turns`: the turn rule, a pure function over per-chunk speech probabilities.
"""

from __future__ import annotations

from omni_stream.models.silero_vad.detector import SileroVad
from omni_stream.models.silero_vad.net import CHUNK, SAMPLE_RATE, SileroNet, SileroState, load_silero_net
from omni_stream.models.silero_vad.pause import PauseOptions, SileroPauseDetector
from omni_stream.models.silero_vad.turns import TurnRule, TurnState, advance, turns

__all__ = [
    "CHUNK",
    "SAMPLE_RATE",
    "PauseOptions",
    "SileroNet",
    "SileroPauseDetector",
    "SileroState",
    "SileroVad",
    "TurnRule",
    "TurnState",
    "advance",
    "load_silero_net",
    "turns",
]
