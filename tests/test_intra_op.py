"""Per-request torch work on threads beside the device worker runs on one intra-op thread, and the calling thread's
own setting is put back (omni_stream.runtime.intra_op); Whisper's features use it (Silero's chunks: test_vad_silero)."""

from __future__ import annotations

import threading

import numpy as np
import torch
from asr_helpers import utterance

from omni_stream.engine import AsyncEngine
from omni_stream.family import ModelKind
from omni_stream.runtime.intra_op import one_intra_op_thread
from omni_stream.transcription.spec import TranscriptionRequest

pytest_plugins = ("asr_fixtures",)


def in_thread_with_two(fn):
    """``fn()`` on a fresh thread whose torch setting is two intra-op threads; its result and the setting after."""
    out: dict[str, object] = {}

    def run() -> None:
        torch.set_num_threads(2)
        out["result"] = fn()
        out["after"] = torch.get_num_threads()

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    return out["result"], out["after"]


def test_the_block_runs_on_one_thread_and_the_callers_setting_comes_back():
    def inside() -> int:
        with one_intra_op_thread():
            return torch.get_num_threads()

    assert in_thread_with_two(inside) == (1, 2)

    def failing() -> str:
        try:
            with one_intra_op_thread():
                raise ValueError("the setting comes back on errors too")
        except ValueError:
            return "raised"

    assert in_thread_with_two(failing) == ("raised", 2)


async def test_whispers_features_are_computed_on_one_intra_op_thread(tiny_whisper):
    async with await AsyncEngine.from_pretrained(tiny_whisper, progress=False) as engine:
        family = engine.models.get(ModelKind.TRANSCRIPTION)
        extractor = family.features  # type: ignore[attr-defined]
        seen: list[int] = []

        class Features:  # the extractor, its calls noting the thread's setting
            def __getattr__(self, name: str):
                return getattr(extractor, name)

            def __call__(self, *args, **kwargs):
                seen.append(torch.get_num_threads())
                return extractor(*args, **kwargs)

        family.features = Features()  # type: ignore[attr-defined]
        request = TranscriptionRequest(utterance("tone440", 1.0), language="en", max_tokens=4)
        prepare = family._prepare  # type: ignore[attr-defined]
        payload, after = in_thread_with_two(lambda: prepare(request.audio, request, None))
        assert seen == [1] and after == 2
        assert payload.features.shape[0] == extractor.feature_size and np.isfinite(payload.features.numpy()).all()
