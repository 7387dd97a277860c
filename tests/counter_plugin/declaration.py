"""What this folder's families are (found through ``declare_family`` or a package's entry points)."""

from __future__ import annotations

from counter_plugin.kind import COUNTER
from omni_stream.family import FamilyDeclaration, ModelKind

FAMILIES = (
    FamilyDeclaration(
        name="counter",
        label="Counter",
        kind=COUNTER,
        model_types=("counter",),
        loader="counter_plugin.family:Counter",
        embedded_default="counter_plugin.family:embedded_default",
        writers={"counter": "counter_plugin.family:make"},
    ),
    FamilyDeclaration(
        name="reverse_lm",
        label="Reverser",
        kind=ModelKind.TEXT,
        model_types=("reverse_lm",),
        loader="counter_plugin.family:Reverser",
        writers={"reverse-lm": "counter_plugin.family:make"},
    ),
    FamilyDeclaration(
        name="not_counter",
        label="Not a counter",
        kind=COUNTER,
        model_types=("not_counter",),
        loader="counter_plugin.family:NotACounter",
    ),
)
