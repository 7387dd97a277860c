"""The device worker's hand-off rule (``omni_stream.device_policy``, ``Tuning.realtime_handoff_yield``) on a real
two-model pipeline: an answer's text, once its first spoken unit went to the speech model, sits out while the
talker's newcomer is due, so the first audio is not held behind the text model's further steps.

Proved by the worker's log (the steps in the order they ran), not by timing: ``max_skip`` is set beyond the test's
length so only the rule decides. The synthetic families (``tests/synthetic``) emulate device time per step."""

from __future__ import annotations

import pytest
from synthetic import write_checkpoint
from synthetic.lm_family import write_lm_checkpoint

from omni_stream.chunks import Audio, TextDelta
from omni_stream.device_policy import DevicePolicy
from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.family import ModelKind
from omni_stream.requests import ChatMessage, ChatRequest, Role, SpokenReply, TextRequest


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("handoff")
    return write_checkpoint(root / "tts", step_cost_ms=2.0), write_lm_checkpoint(root / "lm", step_cost_ms=1.0)


async def first_audio_log(checkpoints, policy: DevicePolicy) -> list[tuple[str, str]]:
    """The worker's steps and batches from the start of a spoken answer to its first audio chunk at the reader."""
    tts, lm = checkpoints
    sources = {"tts": ModelSource(tts), "lm": ModelSource(lm, kind=ModelKind.TEXT)}
    async with await AsyncEngine.load(
        sources, progress=False, max_batch_size=8, device_policy=policy, record=True
    ) as engine:
        reply = "Hi there. " + " ".join(["more"] * 60) + "."  # the synthetic LM says the user's text back
        request = ChatRequest(
            TextRequest((ChatMessage(Role.USER, reply),)), speech=SpokenReply(voice="bob", first_clause=True)
        )
        async with engine.generate(request) as stream:
            async for out in stream:
                if isinstance(out.chunk, Audio):
                    break
            log = [(r.kind, r.name) for r in engine.worker.log if r.kind in ("step", "batch")]
    return log


def text_steps_before_first_window(log: list[tuple[str, str]]) -> int:
    """Text steps between the talker's first step and the first codec window."""
    names = [name for _, name in log]
    talker = next(i for i, (kind, name) in enumerate(log) if kind == "step" and name != names[0])
    window = next(i for i, (kind, _) in enumerate(log) if kind == "batch" and i > talker)
    text = names[0]  # the answer's text steps first
    return sum(1 for kind, name in log[talker:window] if kind == "step" and name == text)


async def test_the_answer_text_waits_for_the_talker_to_reach_its_first_window(checkpoints):
    on = await first_audio_log(checkpoints, DevicePolicy(handoff_yield=True, max_skip=60.0))
    off = await first_audio_log(checkpoints, DevicePolicy(max_skip=60.0))
    assert text_steps_before_first_window(on) == 0, on
    assert text_steps_before_first_window(off) > 0, off  # without the rule both models step every round


async def test_a_spoken_answer_is_the_same_with_the_rule_on(checkpoints):
    """The rule reorders steps only: the whole answer (its transcripts and audio, exact to the sample) is the same,
    and every slot is free at the end."""
    import numpy as np

    tts, lm = checkpoints
    sources = {"tts": ModelSource(tts), "lm": ModelSource(lm, kind=ModelKind.TEXT)}
    answers = []
    for policy in (DevicePolicy(handoff_yield=True), DevicePolicy()):
        async with await AsyncEngine.load(sources, progress=False, max_batch_size=8, device_policy=policy) as engine:
            reply = "Hi there. " + " ".join(["more"] * 12) + ". And the end."
            request = ChatRequest(
                TextRequest((ChatMessage(Role.USER, reply),)), speech=SpokenReply(voice="bob", first_clause=True)
            )
            async with engine.generate(request) as stream:
                outs = [out async for out in stream]
            deltas = [o for o in outs if isinstance(o.chunk, TextDelta)]  # the order across stages varies
            text = {
                stage: "".join(o.chunk.text for o in deltas if o.stage == stage) for stage in {o.stage for o in deltas}
            }
            audio = np.concatenate([o.chunk.samples for o in outs if isinstance(o.chunk, Audio)])
            answers.append((text, audio))
            for family in (engine.models.speech(), engine.models.text()):
                assert all(v == 0 for v in family.scheduler.live().values()), family.scheduler.live()
    (text_on, audio_on), (text_off, audio_off) = answers
    assert text_on == text_off and "the end" in text_on["speech"]
    assert np.array_equal(audio_on, audio_off) and audio_on.size > 0
