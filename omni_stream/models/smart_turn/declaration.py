"""Smart Turn: no engine model, the end-of-turn model of ``semantic_vad`` (role ``"turn_model"``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from omni_stream.family import FamilyDeclaration

if TYPE_CHECKING:
    from omni_stream.turns.detector import TurnModelFactory


def default_turn_model() -> TurnModelFactory | None:
    """``() -> SmartTurn`` (loaded once per process) where its model file and onnxruntime are installed, else None
    (then ``semantic_vad`` is refused)."""
    from omni_stream.models.smart_turn.model import available, load_smart_turn

    return load_smart_turn if available() else None


FAMILIES = (FamilyDeclaration(name="smart_turn", label="Smart Turn", serves={"turn_model": default_turn_model}),)
