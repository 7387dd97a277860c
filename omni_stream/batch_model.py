"""The contract between a batch scheduler and a model: sequences, batches, per-step outputs.

A model that is batched across requests implements :class:`BatchModel`. Its methods run on the
device worker thread only, never on the event loop, and never touch asyncio objects. The scheduler
owns slot numbers (``0 .. max_batch_size - 1``); a model indexes its static per-slot state (KV cache
rows, sampler state) by ``Sequence.slot``.

The contract is generic in what crosses it: ``P``, the payload a stage prepares for the model (a tokenized
prompt, a diffusion job), and ``O``, the item one step hands back for one sequence (a ``CodecFrames``, a
``TextDelta``). A model is a ``BatchModel[P, O]``; the scheduler that batches it is a ``Scheduler[P, O]``, so a
stage's ``session(payload)`` takes a ``P`` and streams ``O`` items (:mod:`omni_stream.scheduler`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, runtime_checkable

from omni_stream.requests import RequestState

P = TypeVar("P")  # the payload a model admits
O = TypeVar("O")  # the item one step makes for one sequence
O_co = TypeVar("O_co", covariant=True)


@dataclass(slots=True, eq=False)
class Sequence(Generic[P]):
    """One request's life inside a scheduler. Mutable; owned by the scheduler.

    ``payload`` is the model's prepared input (built off the loop before admission). ``model_state`` is
    free for the model to use between steps (on the worker thread only): opaque to the scheduler, so a model
    narrows it to its own state type where it reads it.
    """

    seq_id: int
    payload: P
    slot: int = -1
    state: RequestState = RequestState.WAITING
    num_steps: int = 0
    model_state: object = None
    # Set by the scheduler under its lock; read by the worker between steps.
    abort_requested: bool = False
    request_id: str = ""


@dataclass(slots=True, frozen=True)
class Batch(Generic[P]):
    """What one step runs: newcomers to prefill (each already holds a slot) and running sequences to decode."""

    prefill: tuple[Sequence[P], ...] = ()
    decode: tuple[Sequence[P], ...] = ()

    @property
    def size(self) -> int:
        return len(self.prefill) + len(self.decode)

    def __bool__(self) -> bool:
        return self.size > 0


@dataclass(slots=True, frozen=True)
class SeqOutput(Generic[O_co]):
    """One sequence's result of one step.

    ``item``: the chunk produced for this sequence (or None when the step produced nothing for it).
    ``finished``: the model is done with this sequence (EOS, length). ``error``: this sequence alone failed.
    """

    seq_id: int
    item: O_co | None = None
    finished: bool = False
    error: BaseException | None = None


class BatchModel(Protocol[P, O]):
    """A model the scheduler batches across requests: it admits ``P`` payloads and makes ``O`` items. Every method
    runs on the device worker thread."""

    @property
    def max_batch_size(self) -> int:
        """Number of slots (the largest batch one step may run)."""
        ...

    def step(self, batch: Batch[P]) -> list[SeqOutput[O]]:
        """Prefill ``batch.prefill`` and advance ``batch.decode`` by one step; one output per sequence.

        Raising fails every sequence in this batch (and no other); report a single sequence's failure
        through ``SeqOutput.error`` instead where the model can tell which one failed.
        """
        ...

    def release(self, seq: Sequence[P]) -> None:
        """Free everything the model holds for ``seq`` (KV rows, sampler state). Called once per admitted sequence."""
        ...


@runtime_checkable
class PipelinedModel(Protocol):
    """A model whose step may leave device work running that a later call collects (the Qwen3-TTS talker stepping
    ahead). The scheduler looks for these two methods once, when it is made."""

    def settle(self) -> None:
        """Called before the scheduler picks the next batch: wait for whatever the previous step left running that
        the model wants finished first (e.g. so newcomers that arrived meanwhile join the next launch)."""
        ...

    def jobs_due(self) -> int:
        """Device-worker jobs the last step's outputs make due at once (the first audio windows its frames
        complete), which the worker may wait for before it starts the next step; 0: none."""
        ...
