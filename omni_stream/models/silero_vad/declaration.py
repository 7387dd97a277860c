"""Silero VAD: no engine model, the realtime server's default voice activity detector (role ``"vad"``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from omni_stream.family import FamilyDeclaration

if TYPE_CHECKING:
    from omni_stream.turns.vad import VadFactory


def default_vad() -> VadFactory:
    """``VadParams -> SileroVad``, one detector per stream (the wheel ships the network: always available)."""
    from omni_stream.models.silero_vad.detector import SileroVad

    return SileroVad


FAMILIES = (FamilyDeclaration(name="silero_vad", label="Silero VAD", serves={"vad": default_vad}),)
