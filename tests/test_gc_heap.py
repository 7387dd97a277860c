"""The loaded heap's freeze is counted across its holders: open engines and a running serving app."""

from __future__ import annotations

import gc

from serving_helpers import tts_checkpoint
from uvicorn.config import Config
from uvicorn.lifespan.on import LifespanOn

from omni_stream.engine import AsyncEngine
from omni_stream.realtime.app import create_app
from omni_stream.realtime.settings import Settings
from omni_stream.runtime import gc_heap


async def test_an_app_stopping_leaves_the_engine_it_was_given_frozen(monkeypatch) -> None:
    # Only this test's holders count (a session's shared live server may hold the heap in this process).
    monkeypatch.setattr(gc_heap, "_holders", 0)
    gc.unfreeze()
    async with await AsyncEngine.from_pretrained(tts_checkpoint(), progress=False) as engine:
        assert gc_heap._holders == 1 and gc.get_freeze_count() > 0
        lifespan = LifespanOn(Config(create_app(engine, Settings()), lifespan="on"))
        await lifespan.startup()
        assert gc_heap._holders == 2  # the app's hold takes in what its start-up made
        await lifespan.shutdown()
        assert gc_heap._holders == 1
        assert gc.get_freeze_count() > 0  # the engine outlives the app: its load stays out of collections
    assert gc_heap._holders == 0
    assert gc.get_freeze_count() == 0
