"""The device worker's ordering across models, as pure functions: work classes, deadlines, the fairness bound,
admission by capacity, and the one place their switches are read."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from image_helpers import NEEDS_DIFFUSERS

from omni_stream.device_policy import JOBS, DevicePolicy, Ready, capacity_budget, plan_round
from omni_stream.errors import ConfigError
from omni_stream.runtime.settings import Tuning

pytest_plugins = ("image_fixtures",)

NOW = 100.0
POLICY = DevicePolicy(max_wait=0.5, margin=0.05, yield_slack=1.0, lead=0.05)


def plan(realtime=(), throughput=(), demand=None, jobs=False, policy=POLICY):
    return plan_round(NOW, jobs=jobs, realtime=realtime, throughput=throughput, demand=demand, policy=policy)


def test_a_stream_near_its_deadline_runs_before_throughput_work():
    speech = Ready("talker", deadline=NOW + 0.02)  # 20 ms of audio left
    image = Ready("image", since=NOW - 0.1, cost=0.1)
    assert plan([speech], [image], demand=speech.deadline).order == ("talker",)


def test_throughput_runs_when_every_live_stream_can_spare_its_step():
    speech = Ready("talker", deadline=NOW + 0.5)
    image = Ready("image", since=NOW - 0.1, cost=0.1)
    # 0.5 s of slack covers a 0.1 s step and the margin: the stream runs first (under yield_slack), then the step
    assert plan([speech], [image], demand=NOW + 0.5).order == ("talker", "image")
    # a live stream that is not runnable right now (its next window is on the loop) still counts
    assert plan([], [image], demand=NOW + 0.12).order == ()


def test_a_stream_with_seconds_buffered_yields_to_throughput_and_to_the_stream_about_to_underrun():
    relaxed = Ready("talker", deadline=NOW + 1.8)
    urgent = Ready("lm", deadline=NOW + 0.01)
    image = Ready("image", since=NOW, cost=0.1)
    assert plan([relaxed], [image], demand=NOW + 1.8).order == ("image",)  # the buffered stream waits a step
    assert plan([relaxed, urgent], [], demand=NOW + 0.01).order == ("lm", "talker")  # earliest deadline first
    assert plan([relaxed], [], demand=NOW + 1.8).order == ("talker",)  # nothing to yield to: it runs


def test_throughput_work_is_never_starved():
    due_now = Ready("talker", deadline=None)  # a first chunk is due: as soon as possible
    waited = Ready("video", since=NOW - 0.5, cost=2.0)
    assert plan([due_now], [waited], demand=NOW, jobs=True).order == ("video", JOBS, "talker")
    fresh = Ready("video", since=NOW - 0.2, cost=2.0)
    blocked = plan([], [fresh], demand=NOW)
    assert blocked.order == () and blocked.wait == pytest.approx(0.3)  # looks again when it falls due


def test_one_overdue_source_a_round_the_longest_waiting_first():
    a = Ready("image", since=NOW - 0.9, cost=0.1)
    b = Ready("video", since=NOW - 0.7, cost=0.1)
    assert plan([], [b, a], demand=NOW).order == ("image",)


def test_without_any_live_stream_throughput_runs_and_jobs_come_first():
    image = Ready("image", since=NOW, cost=5.0)
    assert plan([], [image], demand=None, jobs=True).order == (JOBS, "image")


def test_plain_rounds_step_everything_once_whatever_its_class():
    rounds = DevicePolicy(deadlines=False)
    speech, image = Ready("talker", deadline=NOW), Ready("image", since=NOW)
    assert plan([speech], [image], demand=NOW, jobs=True, policy=rounds).order == (JOBS, "talker", "image")


def test_a_realtime_source_far_ahead_in_virtual_time_sits_the_round_out():
    """Requests no listener plays yet are all due now; their virtual time (created + steps * quantum) says which
    model is behind: 30 transcripts queued 400 ms ago against the answer text of 2 sessions whose transcripts came
    first (voice_bench run 59). The one ahead sits out, for at most ``max_skip``."""
    asr = Ready("asr", deadline=None, since=NOW - 0.003, virtual=NOW - 0.4)
    text = Ready("text", deadline=None, since=NOW - 0.01, virtual=NOW - 0.1)
    assert plan([text, asr]).order == ("asr",)
    waited = Ready("text", deadline=None, since=NOW - 0.06, virtual=NOW - 0.1)  # sat out max_skip: it runs
    assert plan([waited, asr]).order == ("asr", "text")  # the one behind first
    near = Ready("text", deadline=None, since=NOW - 0.01, virtual=NOW - 0.36)  # within lead: both run
    assert plan([near, asr]).order == ("asr", "text")
    assert plan([text, asr], policy=DevicePolicy(lead=0)).order == ("asr", "text")  # off: every source steps
    # a source whose stream plays with less than margin left never sits out; with more it does
    talker = Ready("talker", deadline=None, since=NOW - 0.01, virtual=NOW - 0.1, playback=NOW + 0.02)
    assert plan([talker, asr]).order == ("asr", "talker")
    assert plan([replace(talker, playback=NOW + 0.5), asr]).order == ("asr",)
    # one without a virtual time (every stream plays, or it does not tell) is never held back by it
    playing = Ready("speech", deadline=NOW + 0.3)
    assert plan([playing, text, asr]).order == ("asr", "speech")


def test_a_source_waiting_on_a_downstream_model_sits_out_while_another_has_work_due():
    """An answer's text whose every request handed its first spoken unit to speech (``handed``) sits the round out
    while the talker's newcomers are due now, for at most ``max_skip``; never while one of its streams plays with
    less than ``margin`` left, never when nothing else is due, and never with the switch off."""
    policy = DevicePolicy(handoff_yield=True)
    text = Ready("text", deadline=None, since=NOW - 0.01, handed=True)
    talker = Ready("talker", deadline=NOW, since=NOW - 0.01)
    assert plan([text, talker], policy=policy).order == ("talker",)
    assert plan([text, talker], policy=DevicePolicy()).order == ("text", "talker")  # off: both step
    assert plan([replace(text, since=NOW - 0.06), talker], policy=policy).order == ("text", "talker")  # max_skip
    playing = replace(talker, deadline=NOW + 0.3)  # the talker's streams play: nothing else is due
    assert plan([text, playing], policy=policy).order == ("text", "talker")
    short = replace(text, playback=NOW + 0.02)  # one of its own streams is about to run dry
    assert plan([short, talker], policy=policy).order == ("text", "talker")
    assert plan([replace(text, playback=NOW + 2.0), talker], policy=policy).order == ("talker",)
    owing = replace(text, handed=False, deadline=NOW)  # a request still owes its first unit: due, it steps
    assert plan([owing, talker], policy=policy).order == ("text", "talker")
    # two sources waiting on others do not hold each other back
    assert plan([text, replace(talker, key="other", handed=True, deadline=None)], policy=policy).order == (
        "text",
        "other",
    )


def test_capacity_admits_while_a_step_fits_in_the_realtime_slack():
    def budget(waiting, running=0, demand=None, free=8):
        return capacity_budget(
            NOW, free=free, waiting=waiting, running=running, cost_per_request=0.1, demand=demand, policy=POLICY,
            max_defer=10.0,
        )  # fmt: skip

    new = (NOW - 1.0, False)
    assert budget([new] * 3) == 3  # no live stream: all that fit
    assert budget([new] * 3, free=2) == 2
    assert budget([new] * 3, running=1, demand=NOW + 0.3) == 1  # 2 x 0.1 s fits in 0.25 s, 3 x 0.1 does not
    assert budget([new] * 3, running=1, demand=NOW) == 0  # a stream is due: they wait, in the waiting gauge
    assert budget([new] * 3, running=0, demand=NOW) == 1  # nothing of this model runs: one goes (progress)
    assert budget([(NOW - 10.0, False), new], running=1, demand=NOW) == 1  # waited max_defer: never starved
    assert budget([(NOW, True), (NOW, True), new], running=4, demand=NOW) == 2  # a session's next chunk always


def test_the_policy_follows_its_tuning_switches():
    assert DevicePolicy.from_tuning(Tuning()) == DevicePolicy()
    tuned = Tuning.from_env(
        {"OMNI_STREAM_DEVICE_POLICY": "rounds", "OMNI_STREAM_THROUGHPUT_WAIT_MS": "250",
         "OMNI_STREAM_THROUGHPUT_STREAM": "off", "OMNI_STREAM_REALTIME_STREAMS": "on",
         "OMNI_STREAM_REALTIME_PRIORITY": "on", "OMNI_STREAM_THROUGHPUT_FENCE": "on",
         "OMNI_STREAM_REALTIME_LEAD_MS": "50", "OMNI_STREAM_REALTIME_HANDOFF_YIELD": "on"}
    )  # fmt: skip
    policy = DevicePolicy.from_tuning(tuned)
    assert policy.lead == 0.05 and DevicePolicy().lead == 0
    assert policy.handoff_yield and not DevicePolicy().handoff_yield
    assert policy.reads_standing and not DevicePolicy().reads_standing
    assert (policy.deadlines, policy.max_wait, policy.throughput_stream) == (False, 0.25, False)
    assert policy.realtime_streams and not DevicePolicy().realtime_streams
    assert policy.realtime_priority and not DevicePolicy().realtime_priority
    assert policy.throughput_fence and not DevicePolicy().throughput_fence
    for env, name in [
        ({"OMNI_STREAM_DEVICE_POLICY": "fifo"}, "OMNI_STREAM_DEVICE_POLICY"),
        ({"OMNI_STREAM_THROUGHPUT_WAIT_MS": "-1"}, "OMNI_STREAM_THROUGHPUT_WAIT_MS"),
        ({"OMNI_STREAM_THROUGHPUT_STREAM": "low"}, "OMNI_STREAM_THROUGHPUT_STREAM"),
        ({"OMNI_STREAM_REALTIME_LEAD_MS": "-5"}, "OMNI_STREAM_REALTIME_LEAD_MS"),
    ]:
        with pytest.raises(ConfigError, match=name):
            Tuning.from_env(env)
    with pytest.raises(ValueError, match="max_wait"):
        DevicePolicy(max_wait=-1)


def test_realtime_priority_makes_no_stream_off_cuda():
    """Off CUDA there is no stream to make: the worker gets no init, loads run without a stream context."""
    from omni_stream.runtime.worker_streams import (
        current_on,
        loading_on,
        make_realtime_stream,
        throughput_fence,
        throughput_stream,
    )

    assert make_realtime_stream("cpu") is None and current_on(None) is None and throughput_fence("cpu") is None
    with loading_on(None)():
        pass
    assert throughput_stream("cpu") == (None, None)


async def test_the_engine_with_realtime_priority_on_cpu_serves_as_without(tmp_path):
    """The switch changes CUDA streams only: on CPU the same request gives the same audio with it on and off."""
    from omni_stream.engine import AsyncEngine
    from omni_stream.models.qwen3_tts.checkpoint import write_tiny_checkpoint
    from omni_stream.requests import SpeechRequest

    checkpoint = write_tiny_checkpoint(tmp_path, "custom_voice", "0.6b", seed=1)
    heard = []
    for on in (False, True):
        tuning = Tuning(realtime_priority=on)
        async with await AsyncEngine.from_pretrained(checkpoint, progress=False, tuning=tuning) as engine:
            assert engine.worker.policy.realtime_priority is on
            async with engine.speech(SpeechRequest("Hello there.", voice="ryan", max_new_tokens=8, seed=3)) as stream:
                heard.append(np.concatenate([a.samples async for a in stream]))
    assert heard[0].size > 0 and np.array_equal(heard[0], heard[1])


@NEEDS_DIFFUSERS
async def test_the_engine_orders_its_worker_by_the_tunings_policy(pix2pix_checkpoint):
    from omni_stream.engine import AsyncEngine

    tuning = Tuning(device_policy="rounds", throughput_wait_ms=120)
    async with await AsyncEngine.from_pretrained(pix2pix_checkpoint, progress=False, tuning=tuning) as engine:
        assert (engine.worker.policy.deadlines, engine.worker.policy.max_wait) == (False, 0.12)
