"""What a batch model records for tests: which sequences each step ran and which it released.

``live`` holds the seq ids admitted and not yet released. With ``record`` set, ``log`` gets a
``("step", prefill_ids, decode_ids)`` event per step (a model may add events of its own) and a ``("release",
seq_id)`` event per release, and ``released`` counts the releases of each sequence (exactly once, however a
request ends, is what the abort tests prove).
"""

from __future__ import annotations

from collections import Counter
from typing import Generic, TypeVar

from omni_stream.batch_model import Batch, Sequence

P = TypeVar("P")


class StepRecord(Generic[P]):
    """A base for BatchModels of ``P`` payloads: call ``record_step(batch)`` first in ``step``; ``release`` is
    complete as it is."""

    def __init__(self, *, record: bool = False) -> None:
        self.record = record
        self.log: list[tuple[object, ...]] = []  # (kind, ids and counts...)
        self.released: Counter[int] = Counter()
        self.live: set[int] = set()

    def record_step(self, batch: Batch[P]) -> None:
        if self.record:
            self.log.append(("step", tuple(s.seq_id for s in batch.prefill), tuple(s.seq_id for s in batch.decode)))

    def release(self, seq: Sequence[P]) -> None:
        self.live.discard(seq.seq_id)
        seq.model_state = None
        if self.record:
            self.released[seq.seq_id] += 1
            self.log.append(("release", seq.seq_id))
