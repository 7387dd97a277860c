"""The text-backend contract (tests/text_backend_contract.py) on the native family, Qwen3 and Llama; the reference
is transformers' ``generate()`` on the same checkpoint."""

from __future__ import annotations

import pytest
from lm_helpers import tiny_lm_checkpoint, transformers_reference
from text_backend_contract import CHECKS, TextBackend, check_id

from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.family import ModelKind


def native_backend(engine: AsyncEngine, checkpoint) -> TextBackend:
    family = engine.models.text()

    async def assert_idle() -> None:
        # two worker passes: the one in progress when we asked, then one that ran every pending release
        await engine.worker.submit(lambda: None)
        await engine.worker.submit(lambda: None)
        live = sum(family.scheduler.live().values()) + family.runner.num_active  # type: ignore[attr-defined]
        assert live == 0, family.scheduler.live()  # type: ignore[attr-defined]

    return TextBackend(engine, assert_idle, transformers_reference(checkpoint))


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def checkpoint(request, tmp_path_factory):
    return tiny_lm_checkpoint(tmp_path_factory, request.param)


@pytest.mark.parametrize("check", CHECKS, ids=check_id)
async def test_native_backend_meets_the_contract(checkpoint, check):
    sources = {"llm": ModelSource(checkpoint, kind=ModelKind.TEXT)}
    async with await AsyncEngine.load(sources, progress=False, max_batch_size=4) as engine:
        backend = native_backend(engine, checkpoint)
        await check(backend)
        await backend.assert_idle()
