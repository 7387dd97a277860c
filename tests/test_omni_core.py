"""The omni core: generate() over any pipeline, two-model pipelines (LLM -> TTS), streamed text input, abort by id.

Why the synthetic families (``tests/synthetic``): the pipeline's mechanics are checked on a reply of known text and
audio exact to the sample, at zero step cost; the same pair on the tiny Qwen3 and Qwen3-TTS is in
``test_serving_chat.py``."""

from __future__ import annotations

import asyncio
import random
import threading

import numpy as np
import pytest
from synthetic import SyntheticConfig, tone_samples, write_checkpoint
from synthetic.lm_family import write_lm_checkpoint

from omni_stream.chunks import Audio, StageOutput, TextDelta
from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.errors import ConfigError, InvalidRequestError, RequestCancelled
from omni_stream.family import ModelKind
from omni_stream.pipeline_specs import MissingModelError
from omni_stream.requests import ChatMessage, ChatRequest, Role, SpeechRequest, SpokenReply, TextRequest
from omni_stream.scheduler import Scheduler

CONFIG = SyntheticConfig()
SPF = CONFIG.samples_per_frame


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("core")
    return write_checkpoint(root / "tts"), write_lm_checkpoint(root / "lm")


@pytest.fixture
async def engine(checkpoints):
    tts, lm = checkpoints
    sources = {"tts": ModelSource(tts), "lm": ModelSource(lm, kind=ModelKind.TEXT)}
    async with await AsyncEngine.load(sources, progress=False, max_batch_size=8) as engine:
        yield engine


def chat(text: str, **fields) -> TextRequest:
    return TextRequest(messages=(ChatMessage(Role.USER, text),), **fields)


async def collect(stream) -> list:
    async with stream:
        return [item async for item in stream]


async def worker_barrier(engine: AsyncEngine) -> None:
    """Return once the worker has finished every iteration that began before this call."""
    await engine.worker.submit(lambda: None)
    await engine.worker.submit(lambda: None)


async def test_generate_streams_a_speech_request_as_stage_outputs(engine):
    outs = await collect(engine.generate(SpeechRequest("Hello there, world.", voice="bob")))
    assert all(isinstance(o, StageOutput) and o.stage == "codec" for o in outs)
    assert [o.last for o in outs] == [False, False, False, True]
    audio = np.concatenate([o.chunk.samples for o in outs])
    assert np.array_equal(audio, tone_samples(CONFIG, 2, 0, 10))


async def test_chat_streams_text_deltas_that_join_to_the_reply_with_usage(engine):
    stream = engine.chat(chat("one two three four"))
    outs = await collect(stream)
    assert all(o.stage == "text" and isinstance(o.chunk, TextDelta) for o in outs)
    assert "".join(o.chunk.text for o in outs) == "one two three four"
    assert outs[-1].last and outs[-1].chunk.finish_reason == "stop"
    assert stream.usage["text"].output_tokens == 5  # four words and the EOS step
    assert stream.usage["text"].input_tokens == 4 + 2


async def test_chat_stops_at_max_tokens_with_finish_reason_length(engine):
    outs = await collect(engine.chat(chat("a b c d e f", max_tokens=3)))
    assert "".join(o.chunk.text for o in outs) == "a b c"
    assert outs[-1].chunk.finish_reason == "length"


async def test_chat_with_speech_speaks_each_sentence_and_the_transcripts_join_to_the_text(engine):
    said = "First one here. Then a second. And the last"
    request = ChatRequest(chat(said), speech=SpokenReply(voice="carol"))
    outs = await collect(engine.generate(request))
    text = "".join(o.chunk.text for o in outs if o.stage == "text")
    assert text == said
    transcripts = [o.chunk.text for o in outs if o.stage == "speech" and isinstance(o.chunk, TextDelta)]
    assert transcripts == ["First one here.", " Then a second.", " And the last"]
    assert "".join(transcripts) == said
    audio = [o.chunk for o in outs if isinstance(o.chunk, Audio)]
    starts = [a.start_sample for a in audio]
    assert starts == sorted(starts) and starts[0] == 0  # one continuous reply
    assert [a.final for a in audio].count(True) == 1 and audio[-1].final
    # each sentence is its own request: its tone restarts at frame 0 (round(len * 0.5) frames each)
    expected = np.concatenate(
        [tone_samples(CONFIG, 3, 0, max(1, round(len(t.strip()) * CONFIG.frames_per_char))) for t in transcripts]
    )
    assert np.array_equal(np.concatenate([a.samples for a in audio]), expected)


async def test_a_transcript_arrives_just_before_its_sentences_audio(engine):
    request = ChatRequest(chat("One two. Three four."), speech=SpokenReply(voice="alice", with_text=False))
    outs = await collect(engine.generate(request))
    kinds = ["t" if isinstance(o.chunk, TextDelta) else "a" for o in outs]
    assert all(o.stage == "speech" for o in outs)
    assert kinds[0] == "t" and kinds.count("t") == 2
    second = kinds.index("t", 1)
    assert kinds[second - 1] == "a" and kinds[second + 1] == "a"


async def test_speech_of_streamed_text_deltas(engine):
    async def deltas():
        for piece in ["Hel", "lo the", "re. How", " are", " you?"]:
            yield TextDelta(piece)

    chunks = await collect(engine.speech(deltas(), voice="dave"))
    assert all(isinstance(c, Audio) for c in chunks) and chunks[-1].final
    n1, n2 = round(len("Hello there.") * 0.5), round(len("How are you?") * 0.5)
    expected = np.concatenate([tone_samples(CONFIG, 4, 0, n1), tone_samples(CONFIG, 4, 0, n2)])
    assert np.array_equal(np.concatenate([c.samples for c in chunks]), expected)
    assert chunks[0].start_sample == 0


async def test_bad_voice_of_a_spoken_reply_fails_before_anything_streams(engine):
    with pytest.raises(InvalidRequestError) as info:
        engine.generate(ChatRequest(chat("hi"), speech=SpokenReply(voice="nobody")))
    assert info.value.param == "voice"


async def test_a_request_needing_an_unloaded_model_is_a_clear_error(checkpoints):
    tts, _ = checkpoints
    async with await AsyncEngine.from_pretrained(tts, progress=False) as engine:
        with pytest.raises(MissingModelError, match="no text model"):
            engine.chat(chat("hi"))


async def test_abort_by_request_id_frees_both_models_before_their_next_step(engine):
    request = ChatRequest(chat("word " * 200, ignore_eos=True, max_tokens=400), speech=SpokenReply(voice="bob"))
    stream = engine.generate(request)
    got = 0
    with pytest.raises(RequestCancelled):
        async with stream:
            async for out in stream:
                got += isinstance(out.chunk, Audio)
                if got == 2:
                    assert engine.abort(request.request_id)
    await worker_barrier(engine)
    for family in (engine.models.speech(), engine.models.text()):
        assert all(v == 0 for v in family.scheduler.live().values()), family.scheduler.live()


async def test_an_abort_releases_every_model_s_slots_while_holding_the_worker_s_lock(engine, monkeypatch):
    """The LLM's sequence and both open sentences' speech sequences go back in one critical section: a thread that
    tries the worker's lock during any of the releases (as the worker does to schedule a step) cannot take it."""
    worker, speech = engine.worker, engine.models.speech()
    probes: list[tuple[str, bool]] = []
    original = Scheduler.release

    def release(self, sess):
        taken = []

        def probe() -> None:
            got = worker.cond.acquire(blocking=False)
            if got:
                worker.cond.release()
            taken.append(got)

        thread = threading.Thread(target=probe)
        thread.start()
        thread.join()
        probes.append((self.name, taken[0]))
        original(self, sess)

    said = " ".join(f"Sentence number {i} is here." for i in range(30))
    request = ChatRequest(chat(said, ignore_eos=True, max_tokens=400), speech=SpokenReply(voice="bob"))
    stream = engine.generate(request)
    with pytest.raises(RequestCancelled):
        async with stream:
            async for out in stream:
                if isinstance(out.chunk, Audio) and speech.scheduler.live()["sessions"] >= 2:
                    monkeypatch.setattr(Scheduler, "release", release)
                    stream.abort(RequestCancelled("barge-in"))
    aborted = probes[:3]  # the abort's own releases; the stages' exits release again (no-ops) later
    assert sorted(name for name, _ in aborted) == ["lm", "talker", "talker"]
    assert not any(taken for _, taken in aborted), probes
    await worker_barrier(engine)
    for family in (speech, engine.models.text()):
        assert all(v == 0 for v in family.scheduler.live().values()), family.scheduler.live()


# --- backpressure across models ---------------------------------------------------------------------------


async def test_a_stalled_audio_reader_pauses_its_llm_request_within_the_bound(checkpoints, tmp_path):
    """Stalled after its first audio chunk, a chat+speech request stops the LLM within the documented bound
    (speech_text: two units synthesizing, one in hand, a partial one, one token in hand, the text watermark),
    while a neighbour text request steps in every LLM step until it is done."""
    tts, _ = checkpoints
    lm = write_lm_checkpoint(tmp_path / "lm", step_cost_ms=1.0)
    sources = {"tts": ModelSource(tts), "lm": ModelSource(lm)}
    async with await AsyncEngine.load(sources, progress=False, max_batch_size=8, max_buffered_frames=12) as engine:
        text_family = engine.models.text()
        text_family.model.record = True
        sentence = "w1 w2 w3 w4."  # four tokens a unit
        stalled = engine.generate(
            ChatRequest(chat(" ".join([sentence] * 80)), speech=SpokenReply(voice="bob", with_text=False))
        )
        async with stalled:
            first = [await anext(stalled), await anext(stalled)]  # the transcript of unit 0, its first audio
            assert isinstance(first[0].chunk, TextDelta) and isinstance(first[1].chunk, Audio)
            neighbour = engine.chat(chat("x", ignore_eos=True, max_tokens=200))
            got = await collect(neighbour)
            assert len(got) == 200
            await worker_barrier(engine)
            log = [e for e in text_family.model.log if e[0] == "step"]
            stalled_id, neighbour_id = 0, 1
            steps_of = [i for i, (_, pre, dec) in enumerate(log) if stalled_id in pre + dec]
            unit, high = 4, text_family.scheduler.high
            bound = 2 * unit + unit + unit + 1 + high
            assert len(steps_of) <= bound, (len(steps_of), bound)
            seq = next(s for s in text_family.scheduler.running.values() if s.seq_id == stalled_id)
            assert seq.state.value == "paused" and seq.slot >= 0  # paused, slot kept
            mine = [i for i, (_, pre, dec) in enumerate(log) if neighbour_id in pre + dec]
            assert mine == list(range(mine[0], mine[0] + 200))  # every step from admission to its end
    assert text_family.model.live == set()


ABORT_MODES = ("aclose", "task_cancel", "abort", "deadline", "complete")


async def _run_and_abort(engine: AsyncEngine, mode: str, k: int, rng: random.Random) -> None:
    text = " ".join(["go on now."] * rng.randint(1, 6))
    request = ChatRequest(chat(text), speech=SpokenReply(voice=rng.choice(CONFIG.voices)))
    timeout = rng.uniform(0.001, 0.03) if mode == "deadline" else None
    stream = engine.generate(request, timeout=timeout)
    if mode == "task_cancel":

        async def read() -> None:
            async for _ in stream:
                await asyncio.sleep(0)

        task = asyncio.get_running_loop().create_task(read())
        for _ in range(k):
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return
    try:
        async with stream:
            n = 0
            async for _ in stream:
                n += 1
                if mode == "aclose" and n >= k:
                    break
                if mode == "abort" and n >= k:
                    engine.abort(request.request_id)
                if mode == "deadline":
                    await asyncio.sleep(0.001)
    except (RequestCancelled, TimeoutError):
        pass


async def test_random_aborts_of_two_model_requests_leave_no_state_in_either_scheduler(engine):
    rng = random.Random(7)
    text_family, speech_family = engine.models.text(), engine.models.speech()
    text_family.model.record = speech_family.talker.record = True
    for _ in range(10):
        await asyncio.gather(
            *(_run_and_abort(engine, rng.choice(ABORT_MODES), rng.randint(0, 12), rng) for _ in range(20))
        )
    await worker_barrier(engine)
    for family in (text_family, speech_family):
        assert all(v == 0 for v in family.scheduler.live().values()), family.scheduler.live()
    assert text_family.model.live == set() and speech_family.talker.live == set()
    assert set(text_family.model.released.values()) <= {1} and set(speech_family.talker.released.values()) <= {1}
    assert len(text_family.model.released) > 100  # most of the 200 reached the model before leaving


async def test_from_pretrained_takes_several_checkpoints_each_filling_its_kind(checkpoints):
    tts, lm = checkpoints
    async with await AsyncEngine.from_pretrained([tts, lm], progress=False) as engine:
        assert set(engine.models.kinds) == {"speech", "text"}
        assert engine.models.text().info.model_type == "synthetic_lm"
    from omni_stream.family_registry import register_family, resolve_family

    loads = []
    real_load = resolve_family("synthetic_tts")
    register_family("synthetic_tts", lambda load: loads.append(load.checkpoint) or real_load(load))
    try:
        with pytest.raises(ConfigError, match="a speech model is loaded already"):
            await AsyncEngine.from_pretrained([tts, tts], progress=False)
    finally:
        register_family("synthetic_tts", real_load)
    assert loads == [tts]  # the second was refused from its declared kind, before its weights loaded
