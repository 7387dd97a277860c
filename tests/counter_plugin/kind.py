"""The ``counter`` kind: a :class:`CountRequest` streams the numbers 1..n as text deltas, one per model step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from omni_stream.context import RequestContext
from omni_stream.errors import InvalidRequestError
from omni_stream.family import ModelInfo
from omni_stream.pipeline_specs import Kind, ModelSet, PipelineSpec, Plan, StagePlan
from omni_stream.requests import next_request_id

COUNTER = "counter"


@dataclass(slots=True, frozen=True)
class CountRequest:
    """Count from 1 to ``n`` (1-1000)."""

    n: int
    request_id: str = field(default_factory=next_request_id)

    def __post_init__(self) -> None:
        if not 1 <= self.n <= 1000:
            raise InvalidRequestError(f"n must be within 1..1000, got {self.n}", "n")


@runtime_checkable
class CounterFamily(Protocol):
    info: ModelInfo

    def count_stage(self, request: CountRequest, ctx: RequestContext) -> Any: ...

    async def aclose(self) -> None: ...


def build_count(models: ModelSet, request: CountRequest, ctx: RequestContext) -> Plan:
    family = models.get(COUNTER)
    assert isinstance(family, CounterFamily)
    return Plan((StagePlan("count", family.count_stage(request, ctx)),))


COUNT = PipelineSpec("count", CountRequest, (COUNTER,), build_count, description="n -> 1, 2, ..., n")
KIND = Kind(COUNTER, CounterFamily, (COUNT,))
