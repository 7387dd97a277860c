"""The text-backend contract (tests/text_backend_contract.py) on the native family, Qwen3 and Llama."""

from __future__ import annotations

import pytest
from lm_helpers import tiny_lm_checkpoint
from text_backend_contract import CHECKS, TextBackend

from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.family import ModelKind


def native_backend(engine: AsyncEngine) -> TextBackend:
    family = engine.models.text()

    async def settle() -> None:
        # two worker passes: the one in progress when we asked, then one that ran every pending release
        await engine.worker.submit(lambda: None)
        await engine.worker.submit(lambda: None)

    def live() -> int:
        return sum(family.scheduler.live().values()) + family.runner.num_active  # type: ignore[attr-defined]

    return TextBackend(engine, settle, live)


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def checkpoint(request, tmp_path_factory):
    return tiny_lm_checkpoint(tmp_path_factory, request.param)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
async def test_native_backend_meets_the_contract(checkpoint, check):
    sources = {"llm": ModelSource(checkpoint, kind=ModelKind.TEXT)}
    async with await AsyncEngine.load(sources, progress=False, max_batch_size=4) as engine:
        backend = native_backend(engine)
        await check(backend)
        await backend.settle()
        assert backend.live() == 0
