"""Whisper through ``engine.generate(TranscriptionRequest(...))``: the transcription pipeline end to end."""

from __future__ import annotations

import asyncio
import math
import random
import threading
from collections import Counter
from collections.abc import AsyncIterator

import anyio
import numpy as np
import pytest
import torch
from asr_helpers import step_together, utterance

from omni_stream.chunks import Audio, TextDelta
from omni_stream.codecs.resample import resample
from omni_stream.engine import AsyncEngine
from omni_stream.errors import DeadlineExceeded, InvalidRequestError
from omni_stream.family import ModelKind
from omni_stream.family_registry import embedded_checkpoint
from omni_stream.models.whisper.family import transcription_hold
from omni_stream.runtime.cache import EMBEDDED_MARKER
from omni_stream.runtime.settings import Tuning
from omni_stream.transcription.spec import (
    TranscriptionFamily,
    TranscriptionInfo,
    TranscriptionRequest,
    transcription_family,
)

pytest_plugins = ("asr_fixtures",)


@pytest.fixture
async def engine(tiny_whisper) -> AsyncIterator[AsyncEngine]:
    async with await AsyncEngine.from_pretrained(tiny_whisper, progress=False, max_batch_size=8) as engine:
        yield engine


async def chunks_of(audio: np.ndarray, rate: int, piece: int, *, final: bool = True) -> AsyncIterator[Audio]:
    for i in range(0, audio.size, piece):
        last = i + piece >= audio.size
        yield Audio(audio[i : i + piece].copy(), rate, i, final=final and last)


async def transcript(engine: AsyncEngine, request: TranscriptionRequest) -> tuple[str, list[TextDelta], dict]:
    async with engine.generate(request) as stream:
        outs = [out async for out in stream]
    assert {o.stage for o in outs} == {"transcription"} and outs[-1].last
    deltas = [o.chunk for o in outs]
    return "".join(d.text for d in deltas), deltas, stream.usage


async def test_a_whole_utterance_at_any_rate_transcribes_with_usage(engine):
    family = engine.models.get(ModelKind.TRANSCRIPTION)
    assert isinstance(family, TranscriptionFamily) and isinstance(family.info, TranscriptionInfo)
    assert family.info.sample_rate == 16000 and family.info.model_type == "whisper" and "en" in family.info.languages
    audio16 = utterance("tone440", 2.0)
    text16, deltas, usage = await transcript(engine, TranscriptionRequest(audio16, language="en", max_tokens=10))
    assert text16 and deltas[-1].final and deltas[-1].finish_reason == "length"
    assert [d.index for d in deltas] == sorted(d.index for d in deltas) and deltas[-1].index == 9
    assert usage["transcription"].input_tokens == 100 and usage["transcription"].output_tokens == 10
    # Audio at 24 kHz is resampled to 16 kHz first: it reads as its 16 kHz resampling does.
    audio24 = utterance("tone440", 2.0, rate=24000)
    text24, _, _ = await transcript(
        engine, TranscriptionRequest(audio24, sample_rate=24000, language="en", max_tokens=10)
    )
    as16, _, _ = await transcript(
        engine, TranscriptionRequest(resample(audio24, 24000, 16000), language="en", max_tokens=10)
    )
    assert text24 == as16 != text16


async def test_streamed_audio_is_collected_until_its_final_chunk(engine):
    audio48 = resample(utterance("noise", 1.5, seed=3), 16000, 48000)
    whole, _, usage = await transcript(
        engine, TranscriptionRequest(audio48, sample_rate=48000, language="en", max_tokens=8)
    )
    streamed, _, usage_streamed = await transcript(
        engine, TranscriptionRequest(chunks_of(audio48, 48000, 960), language="en", max_tokens=8)
    )
    assert streamed == whole and usage_streamed == usage

    stop = anyio.Event()  # never set: a live stream that stays open after its turn ended

    async def live() -> AsyncIterator[Audio]:
        stereo = np.stack([audio48, audio48], axis=1)
        async for chunk in chunks_of(stereo, 48000, 4800):
            yield chunk
        await stop.wait()
        yield Audio(np.zeros(10, np.float32), 48000)

    with anyio.fail_after(60):
        held, _, _ = await transcript(engine, TranscriptionRequest(live(), language="en", max_tokens=8))
    assert held == whole


async def test_a_stream_without_a_final_chunk_ends_with_its_iterator(engine):
    audio = utterance("tone220", 1.0)
    ended, _, _ = await transcript(
        engine, TranscriptionRequest(chunks_of(audio, 16000, 1600, final=False), language="en", max_tokens=6)
    )
    assert ended == (await transcript(engine, TranscriptionRequest(audio, language="en", max_tokens=6)))[0]


async def test_a_transcript_stops_at_end_of_text(tiny_whisper):
    async with await AsyncEngine.from_pretrained(tiny_whisper, progress=False) as engine:
        runner = engine.models.get(ModelKind.TRANSCRIPTION).runner
        real_run, eot = runner._run, runner.tokens.eot
        assert runner.decode_graphs is None  # the CPU runs the decoder call itself, so it can be wrapped

        def eot_wins(b, w, span):  # end of text is picked, but not first (begin suppression masks it there)
            real_run(b, w, span)
            first = runner._inputs(runner._dec_in, b, w)[:, 2].bool()
            runner._picks[:b, 0] = torch.where(first, runner._picks[:b, 0], eot)

        runner._run = eot_wins
        text, deltas, usage = await transcript(engine, TranscriptionRequest(utterance("noise", 1.0), language="en"))
    assert text and [d.finish_reason for d in deltas if d.final] == ["stop"]
    assert usage["transcription"].output_tokens == 2  # one text token, then end of text


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"language": "klingon"}, "language"),
        ({"max_tokens": 1000}, "max_tokens"),
        ({"audio": np.zeros(16000 * 31, np.float32)}, "audio"),
        ({"audio": np.array([0.1, np.nan], np.float32)}, "audio"),
    ],
)
async def test_bad_requests_fail_before_anything_streams_naming_the_field(engine, fields, param):
    with pytest.raises(InvalidRequestError) as err:  # NaN samples: refused as the request is built
        engine.generate(TranscriptionRequest(**{"audio": utterance("noise", 0.5), **fields}))
    assert err.value.param == param


async def test_an_english_only_model_refuses_other_languages(tiny_whisper_en):
    async with await AsyncEngine.from_pretrained(tiny_whisper_en, progress=False) as engine:
        with pytest.raises(InvalidRequestError, match=r"Unsupported language 'fr'\. Supported: Auto, en$") as err:
            engine.generate(TranscriptionRequest(utterance("noise", 0.5), language="fr"))
        assert err.value.param == "language"
        text, _, _ = await transcript(engine, TranscriptionRequest(utterance("noise", 0.5), language="English"))
        assert text


async def test_the_language_check_alone_is_the_requests(engine, tiny_whisper_en):
    """``check_language`` (a realtime session's transcription language, set before any audio) refuses what a
    request would be refused for, and takes codes, names and auto."""
    family = transcription_family(engine.models)
    for language in (None, "auto", "en", "English", "<|en|>"):
        family.check_language(language)
    with pytest.raises(InvalidRequestError, match="Unsupported language 'klingon'") as err:
        family.check_language("klingon")
    assert err.value.param == "language"
    async with await AsyncEngine.from_pretrained(tiny_whisper_en, progress=False) as english:
        with pytest.raises(InvalidRequestError, match=r"Supported: Auto, en$"):
            transcription_family(english.models).check_language("fr")


@pytest.mark.parametrize("case", ["too_long", "empty", "rates", "nan"])
async def test_bad_streams_fail_the_request_with_the_field_named(engine, case):
    async def stream() -> AsyncIterator[Audio]:
        if case == "too_long":
            for i in range(40):
                yield Audio(np.full(16000, 0.01, np.float32), 16000, i * 16000)
        elif case == "rates":
            yield Audio(np.zeros(160, np.float32), 16000)
            yield Audio(np.zeros(240, np.float32), 24000)
        elif case == "nan":
            yield Audio(np.array([0.0, np.nan], np.float32), 16000)
        return

    family = engine.models.get(ModelKind.TRANSCRIPTION)
    with pytest.raises(InvalidRequestError) as err:
        await transcript(engine, TranscriptionRequest(stream(), language="en"))
    assert err.value.param == "audio"
    assert family.scheduler.live() == dict.fromkeys(family.scheduler.live(), 0)


async def test_feature_extraction_runs_off_the_event_loop(engine):
    family = engine.models.get(ModelKind.TRANSCRIPTION)
    loop_thread = threading.get_ident()
    threads: list[int] = []
    prepare = family._prepare

    def spy(*args):
        threads.append(threading.get_ident())
        return prepare(*args)

    family._prepare = spy
    await transcript(engine, TranscriptionRequest(utterance("noise", 0.5), language="en", max_tokens=3))
    assert threads and loop_thread not in threads
    assert engine.worker.thread_id not in threads  # nor on the device worker: the model steps stay unblocked


MODES = ("aclose", "task_cancel", "break", "deadline", "engine_abort", "complete")


async def test_random_aborts_free_every_slot(tiny_whisper):
    rng = random.Random(20261201)
    async with await AsyncEngine.from_pretrained(
        tiny_whisper, progress=False, max_batch_size=6, max_buffered_frames=3
    ) as engine:
        family = engine.models.get(ModelKind.TRANSCRIPTION)
        runner, sched = family.runner, family.scheduler
        runner.record = True
        outcomes: Counter[str] = Counter()

        async def one(i: int) -> None:
            mode = rng.choice(MODES)
            k = rng.randint(1, 6)
            request = TranscriptionRequest(utterance("noise", rng.uniform(0.3, 2.0), seed=i), language="en",
                                           max_tokens=rng.randint(4, 30))  # fmt: skip
            if mode == "aclose":
                stream = engine.generate(request)
                for _ in range(k):
                    if await anext(stream, None) is None:
                        break
                await stream.aclose()
            elif mode == "task_cancel":
                started = asyncio.Event()

                async def read() -> None:
                    async for _ in engine.generate(request):
                        started.set()
                    started.set()

                task = asyncio.create_task(read())
                await started.wait()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            elif mode == "break":
                async with engine.generate(request) as stream:
                    n = 0
                    async for _ in stream:
                        n += 1
                        if n >= k:
                            break
            elif mode == "deadline":
                try:
                    async with engine.generate(request, timeout=rng.uniform(0.001, 0.05)) as stream:
                        async for _ in stream:
                            await anyio.sleep(0.01)
                except DeadlineExceeded:
                    outcomes["deadline_hit"] += 1
            elif mode == "engine_abort":
                stream = engine.generate(request)
                await anext(stream)
                engine.abort(request.request_id)
                with pytest.raises(Exception, match="aborted"):
                    async for _ in stream:
                        pass
            else:
                text, _, _ = await transcript(engine, request)
                assert text is not None
            outcomes[mode] += 1

        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(one, i)
        await engine.worker.submit(lambda: None)  # the worker has finished every step that began before
        await engine.worker.submit(lambda: None)

        assert sum(outcomes[m] for m in MODES) == 50 and len([m for m in MODES if outcomes[m]]) >= 5
        assert sched.live() == dict.fromkeys(sched.live(), 0)
        assert runner.live == set()
        admitted = Counter(e[1] for e in runner.log if e[0] == "admit")
        assert set(admitted.values()) == {1} and runner.released == admitted  # released once per admission
        assert sched.stats.max_batch > 1
        assert asyncio.all_tasks() == {asyncio.current_task()}


def test_the_embedded_default_is_built_once_atomically(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("OMNI_STREAM_CACHE", str(tmp_path))
    path = embedded_checkpoint(ModelKind.TRANSCRIPTION)
    assert (path / EMBEDDED_MARKER).exists() and (path / "model.safetensors").is_file()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [path.name]  # no temp leftovers
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert embedded_checkpoint(ModelKind.TRANSCRIPTION) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime

    async def load() -> None:
        async with await AsyncEngine.from_pretrained(path, progress=False) as engine:
            family = engine.models.get(ModelKind.TRANSCRIPTION)
            assert family.embedded
            text, _, usage = await transcript(engine, TranscriptionRequest(utterance("noise", 1.0), max_tokens=4))
            assert text and usage["transcription"].output_tokens == 4
            assert math.isclose(usage["transcription"].input_tokens, 50)

    anyio.run(load)


async def test_newcomers_encode_at_a_batch_bucket_and_padding_changes_no_token(engine):
    """The encoder runs at bucketed batch sizes only (what a CUDA graph replays; the padding rows encode silence into
    a spare slot): five newcomers encode as a batch of six and decode the tokens each gets alone."""
    family = engine.models.get(ModelKind.TRANSCRIPTION)
    runner = family.runner
    runner.record = True
    payloads = [
        family._prepare(audio, TranscriptionRequest(audio, 16000, max_tokens=10), None)
        for audio in (
            utterance("noise", 1.0, seed=1),
            utterance("tone440", 0.7),
            utterance("noise", 2.0, seed=2),
            utterance("tone440", 1.2),
            utterance("noise", 0.5, seed=3),
        )
    ]
    calls, utterances = runner.encoder_calls, runner.utterances_encoded
    buckets = dict(runner.encoder_buckets)
    runner.time_encoder = True  # CUDA events only: on the CPU nothing is timed
    alone = [step_together(runner, [p])[0] for p in payloads]
    assert (runner.encoder_calls - calls, runner.utterances_encoded - utterances) == (5, 5)  # benchmarks read these
    assert runner.encoder_buckets[1] - buckets.get(1, 0) == 5
    runner.log.clear()
    together = step_together(runner, payloads)
    assert together == alone
    encodes = [e for e in runner.log if e[0] == "encode"]
    assert encodes == [("encode", 5, 6, 1500, "eager")]  # CPU: the same static-buffer encoder, eagerly
    assert (runner.encoder_calls - calls, runner.utterances_encoded - utterances) == (6, 10)
    assert runner.encoder_buckets[6] - buckets.get(6, 0) == 1
    assert not runner.encoder_device_ms and not runner.encoder_timed and not runner._timed
    assert all(b in runner.encode_buckets for _, _, b, _, _ in encodes)
    assert not runner.live


def decoder_payloads(family, n: int) -> list:
    """``n`` requests of every kind a decoder call meets: a named language, language detection, a context prompt
    (a wide prompt), long and short budgets (spans past the smallest bucket)."""
    out = []
    for i in range(n):
        audio = utterance("noise" if i % 2 else f"tone{300 + 100 * i}", 0.4 + 0.3 * i, seed=i)
        kind = i % 4
        request = TranscriptionRequest(
            audio,
            16000,
            language=(None if kind == 1 else "en"),
            prompt=("hello world this is a speech test and this is a voice" if kind == 2 else None),
            max_tokens=(80 if kind == 3 else 6 + i),
        )
        out.append(family._prepare(audio, request, family.tokens.language_id(request.language)))
    return out


async def test_every_decoder_call_runs_at_a_captured_shape_and_gives_the_unbucketed_tokens(tiny_whisper):
    """Each batch size 1..8 (and rows in scattered slots): every decoder call runs at a shape of the set captured as
    CUDA graphs at load (no other shape, so no eager path for a size seen for the first time), and each request's
    tokens equal those of the same decode at each step's exact shape."""
    async with await AsyncEngine.from_pretrained(tiny_whisper, progress=False, max_batch_size=8) as engine:
        family = engine.models.get(ModelKind.TRANSCRIPTION)
        runner = family.runner
        runner.record = True
        keys = set(runner.shapes.keys())
        payloads = decoder_payloads(family, 8)
        groups = [(list(range(n)), None) for n in range(1, 9)] + [([0, 1, 2], [0, 3, 6]), ([3, 2], [5, 1])]
        seen, padded = set(), 0
        for group, slots in groups:
            batch = [payloads[i] for i in group]
            runner.pad_shapes, mark = True, len(runner.log)
            bucketed = step_together(runner, batch, slots)
            calls = [e[2:5] for e in runner.log[mark:] if e[0] == "decode"]
            runner.pad_shapes, mark = False, len(runner.log)
            exact = step_together(runner, batch, slots)
            exact_calls = [e[2:5] for e in runner.log[mark:] if e[0] == "decode"]
            assert bucketed == exact
            assert all(tokens for _, tokens in bucketed)
            assert set(calls) <= keys, set(calls) - keys
            assert len(calls) == len(exact_calls)
            for (b, w, span), (eb, ew, espan) in zip(calls, exact_calls, strict=True):
                assert (b, w, span) == runner.shapes.pick(eb, ew, espan)
            assert exact_calls[0][0] == max(slots or group) + 1  # rows up to the highest slot
            padded += sum(c != e for c, e in zip(calls, exact_calls, strict=True))
            seen |= set(calls)
        assert padded > 0.9 * sum(1 for e in runner.log if e[0] == "decode") / 2  # nearly every call was padded
        assert all(e[-1] == "eager" for e in runner.log if e[0] == "decode")  # CPU: no graphs, the same shapes
        # The mix reached every kind of call: tokens alone at the first two spans, a plain prompt, a context prompt
        assert {(1, 64), (1, 128), (4, 448)} <= {(w, span) for _, w, span in seen}
        assert any(w > 4 for _, w, _ in seen) and {b for b, _, _ in seen} == {1, 2, 4, 8}
        assert not runner.live


async def test_a_transcript_never_pauses_for_a_slow_reader(tiny_whisper):
    """However small the engine's watermark, a transcription row runs to its last token while nobody reads it: its
    tokens are few and a pause would stall its turn behind the reader."""
    async with await AsyncEngine.from_pretrained(
        tiny_whisper, progress=False, max_batch_size=2, max_buffered_frames=3
    ) as engine:
        family = engine.models.get(ModelKind.TRANSCRIPTION)
        runner, loop = family.runner, asyncio.get_running_loop()
        finished = asyncio.Event()
        step = runner.step

        def watched(batch):  # the worker's step: tell the loop when the row has made its last token
            outs = step(batch)
            if any(o.finished for o in outs):
                loop.call_soon_threadsafe(finished.set)
            return outs

        runner.step = watched
        request = TranscriptionRequest(utterance("noise", 1.0), language="en", max_tokens=20)
        async with engine.generate(request) as stream:
            with anyio.fail_after(20):  # paused at the watermark, it would never finish
                await finished.wait()  # read nothing until then: 20 tokens against a watermark of 3
            assert family.scheduler.high > runner.positions
            outs = [out async for out in stream]
        last = outs[-1].chunk
        assert last.final and last.finish_reason == "length" and last.index == 19


async def test_a_paused_row_keeps_its_cache_while_calls_run_over_its_slot(engine):
    """A row the scheduler leaves out of some steps (its reader is slow) sits idle in calls that cover its slot:
    it feeds nothing and its cache stays as it was, so its transcript is the one it gets alone."""
    from omni_stream.batch_model import Batch, Sequence

    family = engine.models.get(ModelKind.TRANSCRIPTION)
    runner = family.runner
    runner.record = True
    payloads = decoder_payloads(family, 4)[2:]  # a context prompt, then a long budget
    alone = [step_together(runner, [p])[0][1] for p in payloads]
    mark = len(runner.log)
    paused, other = Sequence(0, payloads[0], slot=0), Sequence(1, payloads[1], slot=1)
    runner.step(Batch(prefill=(paused, other)))
    runner.step(Batch(decode=(paused, other)))
    for _ in range(4):  # slot 0 idle below slot 1
        runner.step(Batch(decode=(other,)))
    live = [paused, other]
    while live:
        outs = runner.step(Batch(decode=tuple(live)))
        live = [s for s, o in zip(live, outs, strict=True) if not o.finished]
    for seq in (paused, other):
        runner.release(seq)
    tokens = [[e[2] for e in runner.log[mark:] if e[0] == "token" and e[1] == i] for i in (0, 1)]
    assert tokens == alone
    calls = [e for e in runner.log[mark:] if e[0] == "decode"]
    assert [e[1:3] for e in calls[2:6]] == [(1, 2)] * 4  # one live row in a call over two slots


async def test_a_whole_utterance_already_at_the_models_rate_is_taken_as_it_is():
    """A voice agent's turn arrives as float32 at the model's rate: no copy and no thread hop; anything else is made
    float32 and resampled (on a thread) as before."""
    from omni_stream.transcription.stage import collect_utterance

    async def nothing():
        return
        yield

    audio = utterance("noise", 0.5)
    assert await collect_utterance(TranscriptionRequest(audio, 16000), nothing(), 16000, 30.0) is audio
    wide = utterance("tone440", 0.5, rate=24000).astype(np.float64)
    got = await collect_utterance(TranscriptionRequest(wide, 24000), nothing(), 16000, 30.0)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, resample(wide.astype(np.float32), 24000, 16000), atol=1e-6)


async def test_utterances_that_end_together_share_one_encoder_pass_and_a_lone_one_waits_for_nothing(engine):
    """A transcription counts as arriving while its features are made, so a newcomer already queued waits for it
    (at most the scheduler's hold, ``transcription_hold_ms``): two utterances whose preparation overlapped are
    encoded in one pass. Deterministic: the hold is long here, the second's preparation ends only when the test
    lets it, and while it is prepared the worker has nothing to admit."""
    family = engine.models.get(ModelKind.TRANSCRIPTION)
    runner, sched = family.runner, family.scheduler
    assert sched.hold == 0.0  # the default on a CPU (Tuning.transcription_hold_ms): 50 ms on CUDA
    assert transcription_hold(Tuning(), torch.device("cuda")) == 0.05
    assert transcription_hold(Tuning(transcription_hold_ms=0), torch.device("cuda")) == 0.0
    assert transcription_hold(Tuning.from_env({"OMNI_STREAM_TRANSCRIPTION_HOLD_MS": "20"}), torch.device("cpu")) == 0.02
    sched.hold = 60.0  # only the arrival ends the wait: the test's outcome never depends on time
    runner.record = True
    prepare = family._prepare
    entered, release = threading.Event(), threading.Event()

    def gated(samples, request, language):
        if request.max_tokens == 5:  # the second utterance: its features take until the test says so
            entered.set()
            assert release.wait(30)
        return prepare(samples, request, language)

    family._prepare = gated
    try:
        mark = len(runner.log)
        first = asyncio.create_task(transcript(engine, TranscriptionRequest(utterance("tone440", 1.0), language="en",
                                                                            max_tokens=4)))  # fmt: skip
        second = asyncio.create_task(transcript(engine, TranscriptionRequest(utterance("noise", 1.0, seed=5),
                                                                             language="en", max_tokens=5)))  # fmt: skip
        assert await asyncio.to_thread(entered.wait, 30)
        for _ in range(3000):  # the first is queued while the second is still being prepared
            if sched.waiting:
                break
            await asyncio.sleep(0.01)
        assert len(sched.waiting) == 1 and sched._arriving == 1
        assert not sched.has_work()  # held for the second: the worker admits nothing
        assert not [e for e in runner.log[mark:] if e[0] == "encode"]
        release.set()
        (text1, _, _), (text2, _, _) = await asyncio.wait_for(asyncio.gather(first, second), 60)
        assert [e for e in runner.log[mark:] if e[0] == "encode"] == [("encode", 2, 2, 1500, "eager")]  # one pass
        assert text1 and text2
        # Alone, nothing is in preparation: it goes in at once despite the 60 s hold
        mark = len(runner.log)
        await asyncio.wait_for(transcript(engine, TranscriptionRequest(utterance("tone440", 1.0), language="en",
                                                                       max_tokens=4)), 30)  # fmt: skip
        assert [e for e in runner.log[mark:] if e[0] == "encode"] == [("encode", 1, 1, 1500, "eager")]
        assert sched._arriving == 0
    finally:
        family._prepare = prepare
        release.set()
        runner.record = False
