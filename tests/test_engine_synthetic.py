"""AsyncEngine end to end on the synthetic family: loading, streaming, validation, errors, loop health.

Why the synthetic TTS (``tests/synthetic``): faults at a chosen step, audio exact to the sample and the event loop's
health at zero step cost; the engine on the tiny Qwen3-TTS is in ``test_qwen3_engine.py``."""

from __future__ import annotations

import asyncio
import json
import threading

import anyio
import numpy as np
import pytest
from prometheus_client import generate_latest
from synthetic import SyntheticConfig, SyntheticFault, tone_samples, write_checkpoint

from omni_stream.chunks import Audio
from omni_stream.engine import AsyncEngine
from omni_stream.errors import (
    ConfigError,
    DeadlineExceeded,
    EngineClosed,
    InvalidRequestError,
    RequestCancelled,
    UnknownVoiceError,
    UnsupportedTaskError,
)
from omni_stream.family import SpeechInfo
from omni_stream.family_registry import register_family, resolve_family
from omni_stream.requests import SpeechRequest, TaskType

CONFIG = SyntheticConfig()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("synthetic"))


@pytest.fixture
async def engine(checkpoint):
    async with await AsyncEngine.from_pretrained(checkpoint, progress=False, max_batch_size=8) as engine:
        yield engine


def joined(chunks: list[Audio]) -> np.ndarray:
    return np.concatenate([c.samples for c in chunks])


async def collect(stream) -> list[Audio]:
    async with stream:
        return [audio async for audio in stream]


async def test_from_pretrained_reads_model_type_and_describes_the_checkpoint(engine):
    info = engine.speech_info
    assert isinstance(info, SpeechInfo)
    assert info.model_type == "synthetic_tts" and info.sample_rate == 24000
    assert info.voices == CONFIG.voices
    assert info.default_task is TaskType.CUSTOM_VOICE
    assert set(info.task_types) == {TaskType.CUSTOM_VOICE, TaskType.VOICE_DESIGN, TaskType.BASE}


async def test_a_model_source_takes_its_path_as_a_string(checkpoint):
    """``ModelSource("dir")`` as the README's server example writes it (a string, not a ``Path``) loads the model."""
    from omni_stream.engine import ModelSource

    source = ModelSource(str(checkpoint))
    assert source.path == checkpoint
    with pytest.raises(TypeError, match=r"ModelSource\.path must be a path or a string, got int"):
        ModelSource(7)  # type: ignore[arg-type]
    async with await AsyncEngine.load({"tts": source}, progress=False) as engine:
        audio = await collect(engine.speech("Hi.", voice="bob"))
    assert sum(chunk.n_samples for chunk in audio) > 0


async def test_speech_streams_the_voice_tone_with_usage_and_timings(engine):
    stream = engine.speech("Hello there, world.", voice="bob")  # 19 chars * 0.5 -> 10 frames
    chunks = await collect(stream)
    assert [c.n_samples // 1920 for c in chunks] == [1, 2, 4, 3]  # the codec window ramp
    assert [c.start_sample for c in chunks] == [0, 1920, 3 * 1920, 7 * 1920]
    assert [c.final for c in chunks] == [False, False, False, True]
    assert np.array_equal(joined(chunks), tone_samples(CONFIG, 2, 0, 10))
    assert stream.usage.input_tokens == 19 and stream.usage.output_tokens == 10
    t = stream.timings
    assert len(t.chunk_times) == 4 and t.first_chunk is not None and t.finished is not None
    assert t.audio_seconds == pytest.approx(0.8)


async def test_initial_codec_chunk_frames_sets_the_first_window(engine):
    chunks = await collect(engine.speech("Hello there, world.", voice="bob", initial_codec_chunk_frames=3))
    assert [c.n_samples // 1920 for c in chunks] == [3, 2, 4, 1]


async def test_speech_accepts_a_request_object_and_max_new_tokens(engine):
    request = SpeechRequest(text="x" * 100, voice="alice", max_new_tokens=3)
    chunks = await collect(engine.speech(request))
    assert sum(c.n_samples for c in chunks) == 3 * 1920
    chunks = await collect(engine.speech("hi", voice="alice", max_new_tokens=7, ignore_eos=True))
    assert sum(c.n_samples for c in chunks) == 7 * 1920


async def test_invalid_requests_fail_before_streaming(engine):
    with pytest.raises(UnknownVoiceError) as info:
        engine.speech("hi", voice="nobody")
    assert info.value.param == "voice"
    with pytest.raises(InvalidRequestError) as info:
        engine.speech("hi", language="Klingon")
    assert info.value.param == "language"
    with pytest.raises(InvalidRequestError) as info:
        engine.speech("hi", task_type=TaskType.VOICE_DESIGN)
    assert info.value.param == "instructions"
    with pytest.raises(InvalidRequestError) as info:
        engine.speech("hi", task_type=TaskType.BASE)
    assert info.value.param == "ref_audio"


async def test_unsupported_task_is_reported(tmp_path):
    path = write_checkpoint(tmp_path, task_types=["CustomVoice"])
    async with await AsyncEngine.from_pretrained(path, progress=False) as engine:
        with pytest.raises(UnsupportedTaskError):
            engine.speech("hi", task_type=TaskType.BASE)
        with pytest.raises(UnsupportedTaskError):
            await engine.create_voice_prompt(np.zeros(24000, np.float32), 24000)


async def test_voice_design_and_cloning_speak_stable_tones(engine):
    a = joined(await collect(engine.speech("abcd", task_type=TaskType.VOICE_DESIGN, instructions="warm")))
    b = joined(await collect(engine.speech("abcd", task_type=TaskType.VOICE_DESIGN, instructions="warm")))
    assert np.array_equal(a, b)
    ref = np.sin(np.arange(24000) / 10).astype(np.float32)
    prompt = await engine.create_voice_prompt(ref, 24000, ref_text="a reference")
    assert prompt.x_vector.dtype == np.float32 and prompt.ref_codes is not None
    from_prompt = joined(await collect(engine.speech("abcd", task_type=TaskType.BASE, voice_prompt=prompt)))
    from_audio = joined(
        await collect(engine.speech("abcd", task_type=TaskType.BASE, ref_audio=ref, ref_text="a reference"))
    )
    assert np.array_equal(from_prompt, from_audio)


async def test_concurrent_requests_share_batches_and_each_gets_its_own_tone(engine):
    voices = ["alice", "bob", "carol", "dave"] * 2

    async def one(voice: str) -> np.ndarray:
        return joined(await collect(engine.speech("y" * 40, voice=voice)))

    results = await asyncio.gather(*(one(v) for v in voices))
    for voice, wav in zip(voices, results, strict=True):
        assert np.array_equal(wav, tone_samples(CONFIG, 1 + CONFIG.voices.index(voice), 0, 20))
    assert engine.models.speech().scheduler.stats.max_batch > 1
    assert engine.models.speech().scheduler.live() == dict.fromkeys(engine.models.speech().scheduler.live(), 0)


async def test_stage_error_fails_only_its_request_with_the_original_type(engine):
    async def run(text: str):
        try:
            return joined(await collect(engine.speech(text, voice="alice")))
        except Exception as exc:
            return exc

    results = await asyncio.gather(run("[[fail:stage@1]]" + "z" * 30), run("z" * 30), run("w" * 30))
    bad, *good = results
    assert isinstance(bad, SyntheticFault) and bad.stage == "codec"
    assert all(isinstance(g, np.ndarray) and g.size == 15 * 1920 for g in good)


async def test_sequence_error_fails_only_its_request(engine):
    async def run(text: str):
        try:
            return joined(await collect(engine.speech(text, voice="alice")))
        except Exception as exc:
            return exc

    bad, good = await asyncio.gather(run("[[fail:seq@4]]" + "z" * 30), run("z" * 30))
    assert isinstance(bad, SyntheticFault) and bad.stage == "talker"
    assert isinstance(good, np.ndarray) and good.size == 15 * 1920


async def test_model_step_error_reaches_the_consumer_as_its_type(engine):
    with pytest.raises(SyntheticFault):
        await collect(engine.speech("[[fail:step@2]]" + "q" * 20, voice="dave"))
    assert (await collect(engine.speech("after", voice="dave")))[-1].final  # the engine keeps serving


async def test_deadline_exceeded_reaches_the_consumer(tmp_path):
    path = write_checkpoint(tmp_path, step_cost_ms=5.0)
    async with await AsyncEngine.from_pretrained(path, progress=False) as engine:
        with pytest.raises(DeadlineExceeded):
            await collect(engine.speech("hi", voice="alice", max_new_tokens=400, ignore_eos=True, timeout=0.05))
        await engine.worker.submit(lambda: None)
        await engine.worker.submit(lambda: None)
        assert engine.models.speech().scheduler.live()["slots_in_use"] == 0


async def test_aclose_of_the_stream_frees_the_slot_at_once(engine):
    sched = engine.models.speech().scheduler
    stream = engine.speech("m" * 400, voice="carol")
    async with stream:
        await stream.__anext__()
        assert sched.live()["slots_in_use"] == 1
    assert sched.live()["sessions"] == 0  # released synchronously on exit; the worker frees the slot next
    await engine.worker.submit(lambda: None)
    await engine.worker.submit(lambda: None)  # one full worker iteration later
    assert sched.live() == dict.fromkeys(sched.live(), 0)


async def test_abort_releases_the_sequence_synchronously(engine):
    """What a cancelled ``finally`` can still do: no await needed for the slot to go back."""
    sched, talker = engine.models.speech().scheduler, engine.models.speech().talker
    talker.record = True
    stream = engine.speech("m" * 400, voice="carol")
    await stream.__anext__()
    (seq,) = sched.running.values()
    stream.abort()
    assert sched.live()["sessions"] == 0 and seq.abort_requested  # before any await
    await engine.worker.submit(lambda: None)
    await engine.worker.submit(lambda: None)
    released_at = talker.log.index(("release", seq.seq_id))
    assert all(seq.seq_id not in e[2] for e in talker.log[released_at:] if e[0] == "step")
    assert sched.live() == dict.fromkeys(sched.live(), 0)
    await stream.aclose()


async def test_model_work_never_runs_on_the_event_loop_thread(checkpoint):
    """The step blocks until the loop has ticked: on the loop thread it would deadlock and fail."""
    async with await AsyncEngine.from_pretrained(checkpoint, progress=False) as engine:
        loop_thread = threading.get_ident()
        ticks = 0
        ticked = threading.Event()
        step_threads, codec_threads = set(), set()

        def before_step(batch):
            step_threads.add(threading.get_ident())
            start = ticks
            while ticks < start + 3:  # three loop ticks happen while this step runs
                if not ticked.wait(5):
                    raise AssertionError("the event loop did not run while the worker was stepping")
                ticked.clear()

        decode = engine.models.speech().codec.decode

        def traced_decode(windows):
            codec_threads.add(threading.get_ident())
            return decode(windows)

        engine.models.speech().codec.decode = traced_decode
        engine.models.speech().talker.before_step = before_step
        done = anyio.Event()

        async def ticker():
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                ticked.set()
                await anyio.sleep(0.001)

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            chunks = await collect(engine.speech("n" * 12, voice="alice"))
            done.set()
        assert sum(c.n_samples for c in chunks) == 6 * 1920
        assert step_threads == codec_threads == {engine.worker.thread_id}
        assert loop_thread not in step_threads


async def test_metrics_live_in_the_engines_registry(engine):
    await collect(engine.speech("metrics please", voice="alice"))
    text = generate_latest(engine.metrics.registry).decode()
    assert 'omni_stream_requests_total{outcome="ok"} 1.0' in text
    assert 'omni_stream_batch_size_count{scheduler="talker"}' in text
    assert "omni_stream_ttfa_seconds_count 1.0" in text
    for name in ("requests_running", "requests_waiting", "requests_paused", "step_seconds", "chunk_gap_seconds"):
        assert f"omni_stream_{name}" in text


async def test_engine_aclose_fails_open_streams_and_refuses_new_ones(checkpoint):
    engine = await AsyncEngine.from_pretrained(checkpoint, progress=False)
    stream = engine.speech("k" * 400, voice="bob")
    await stream.__anext__()
    await engine.aclose()
    with pytest.raises(EngineClosed):
        await stream.__anext__()
    with pytest.raises(EngineClosed):
        engine.speech("again")


async def test_checkpoint_errors_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"config\.json"):
        await AsyncEngine.from_pretrained(tmp_path, progress=False)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no_such_family"}))
    with pytest.raises(ConfigError, match="no_such_family"):
        await AsyncEngine.from_pretrained(tmp_path, progress=False)
    with pytest.raises(ConfigError, match="unknown synthetic_tts config keys"):
        write_checkpoint(tmp_path / "x", no_such_option=1)


async def test_no_default_model_is_a_clear_error(monkeypatch):
    import importlib

    real_import = importlib.import_module

    def fake_import(name, *args):
        if name == "omni_stream.models.qwen3_tts.family":
            raise ModuleNotFoundError(name)
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", fake_import)
    with pytest.raises(ConfigError, match=r"no default \w+ model"):
        await AsyncEngine.from_pretrained(None, progress=False)


async def test_register_family_accepts_a_callable(tmp_path):
    from synthetic import load_family

    seen = []

    def loader(load):
        seen.append(load.config["model_type"])
        return load_family(load)

    register_family("synthetic_tts_alias", loader)
    assert resolve_family("synthetic_tts_alias") is loader
    path = write_checkpoint(tmp_path)
    config = json.loads((path / "config.json").read_text())
    config["model_type"] = "synthetic_tts_alias"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError):  # the synthetic config itself insists on its own model_type
        await AsyncEngine.from_pretrained(path, progress=False)
    assert seen == ["synthetic_tts_alias"]


async def test_a_stream_aborted_before_it_started_raises_without_running(engine):
    stream = engine.speech("never runs", voice="alice")
    stream.abort(EngineClosed("shutting down"))
    with pytest.raises(EngineClosed, match="shutting down"):
        await stream.__anext__()
    assert engine.models.speech().talker.steps == 0


async def test_ctx_cancel_mid_stream_raises_request_cancelled_and_frees_the_slot(engine):
    sched = engine.models.speech().scheduler
    async with engine.speech("p" * 400, voice="dave") as stream:
        await stream.__anext__()
        stream.ctx.cancel()
        assert sched.live()["sessions"] == 0
        with pytest.raises(RequestCancelled):
            async for _ in stream:
                pass
    await engine.worker.submit(lambda: None)
    await engine.worker.submit(lambda: None)
    assert sched.live() == dict.fromkeys(sched.live(), 0)


async def test_create_voice_prompt_is_bounded_by_wait_timeout(checkpoint):
    async with await AsyncEngine.from_pretrained(checkpoint, progress=False, wait_timeout=0.01) as engine:
        started, release = threading.Event(), threading.Event()
        busy = engine.worker.submit(lambda: (started.set(), release.wait(10)))
        await anyio.to_thread.run_sync(started.wait)  # the device is busy: the extraction cannot start
        with pytest.raises(DeadlineExceeded, match="voice prompt"):
            await engine.create_voice_prompt(np.zeros(24000, np.float32), 24000)
        release.set()
        await busy


async def test_the_synthetic_family_runs_the_shared_talker_stage(engine):
    from omni_stream.context import RequestContext
    from omni_stream.pipeline import stage_name
    from omni_stream.speech.stages import talker_stage

    talker, codec = engine.models.speech().speech_stages(SpeechRequest(text="hi", voice="alice"), RequestContext())
    assert [stage_name(talker), stage_name(codec)] == ["talker", "codec"]
    assert talker.__code__ is talker_stage(engine.models.speech().scheduler, None).__code__


async def test_a_running_request_id_is_refused_and_an_aborted_request_counts_as_cancelled(engine):
    stream = engine.speech("m" * 400, voice="carol", request_id="same")
    await stream.__anext__()
    with pytest.raises(InvalidRequestError) as refused:
        engine.speech("again", voice="carol", request_id="same")  # abort("same") could not tell the two apart
    assert refused.value.param == "request_id"
    assert engine.abort("same")
    with pytest.raises(RequestCancelled):
        await stream.__anext__()
    assert stream.outcome == "cancelled"
    assert 'omni_stream_requests_total{outcome="cancelled"} 1.0' in generate_latest(engine.metrics.registry).decode()
    assert await collect(engine.speech("again", voice="carol", request_id="same"))  # free once its request ended


async def test_an_aborted_request_id_is_free_at_once_whether_or_not_it_had_started(engine):
    running = engine.speech("m" * 400, voice="carol", request_id="r")
    await running.__anext__()
    idle = engine.speech("never read", voice="carol", request_id="i")
    assert engine.abort("r") and engine.abort("i")
    assert not engine.abort("r") and not engine.abort("i")  # not running any more: nothing to abort
    assert await collect(engine.speech("again", voice="carol", request_id="r"))  # before the first ends its task
    assert await collect(engine.speech("again", voice="carol", request_id="i"))
    with pytest.raises(RequestCancelled):
        await running.__anext__()
    with pytest.raises(RequestCancelled):
        await idle.__anext__()
