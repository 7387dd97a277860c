"""Recordings longer than Whisper's window (``omni_stream.transcription.long_form``): where they are cut, and their
transcript through the engine, window by window on the tiny Whisper, against each window transcribed alone."""

from __future__ import annotations

import itertools
import random
from collections.abc import AsyncIterator

import anyio
import numpy as np
import pytest
from asr_helpers import utterance

from omni_stream.engine import AsyncEngine
from omni_stream.errors import InvalidRequestError, RequestCancelled
from omni_stream.family import ModelKind
from omni_stream.transcription.long_form import split_windows, transcribe_long
from omni_stream.transcription.spec import TranscriptionRequest

pytest_plugins = ("asr_fixtures",)

RATE = 16000


def noise_with_gaps(seconds: float, gaps: list[float], seed: int = 0) -> np.ndarray:
    """Noise with 0.2 s of silence starting at each of ``gaps`` (seconds)."""
    x = utterance("noise", seconds, RATE, seed)
    for at in gaps:
        x[int(at * RATE) : int((at + 0.2) * RATE)] = 0.0
    return x


def test_audio_that_fits_is_one_window():
    x = utterance("noise", 12.0)
    assert split_windows(x, RATE, 30.0) == ((0, x.size),)
    exact = utterance("noise", 30.0)
    assert split_windows(exact, RATE, 30.0) == ((0, exact.size),)


def test_cuts_fall_in_the_pauses_before_each_window_ends():
    x = noise_with_gaps(70.0, [28.9, 49.0])
    windows = split_windows(x, RATE, 30.0)
    assert len(windows) == 3
    (s0, e0), (s1, e1), (s2, e2) = windows
    assert s0 == 0 and e0 == s1 and e1 == s2 and e2 == x.size
    assert 28.9 * RATE <= e0 < 29.1 * RATE  # inside the first pause, in the last 2 s before 30 s
    # 41 s are left, two windows' worth: the cut is sought in the 2 s before about their middle (~50.5 s)
    assert 49.0 * RATE <= e1 < 49.2 * RATE
    assert all(end - start <= 30 * RATE for start, end in windows)


def test_a_recording_just_past_the_limit_is_two_halves():
    x = utterance("noise", 30.01)
    (s0, e0), (s1, e1) = split_windows(x, RATE, 30.0)
    # the cut is sought in the 2 s before (30.01 s + 2 s) / 2: both windows 14-16 s
    assert all(14.0 * RATE <= end - start <= 16.01 * RATE for start, end in ((s0, e0), (s1, e1)))


def test_silence_everywhere_cuts_at_the_earliest_quiet_frame():
    x = np.zeros(65 * RATE, np.float32)
    windows = split_windows(x, RATE, 30.0, search_seconds=2.0, frame_seconds=0.02)
    first_cut = windows[0][1]
    assert first_cut == 28 * RATE + 160  # the first frame of the last 2 s before 30 s, at its middle
    left = x.size - first_cut  # two windows' worth: sought in the 2 s before (left + 2 s) / 2
    second_cut = first_cut + (left + 2 * RATE) // 2 - 2 * RATE + 160
    assert windows[1:] == ((first_cut, second_cut), (second_cut, x.size))


@pytest.mark.parametrize("seed", range(20))
def test_windows_cover_the_samples_in_order_within_the_limit(seed):
    rng = random.Random(seed)
    n = rng.randrange(1, 200 * 100)  # up to 200 s at 100 Hz (the arithmetic is the same at any rate)
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32) * rng.choice([0.0, 1.0])
    limit_s = rng.choice([0.01, 0.5, 3.0, 30.0])
    windows = split_windows(x, 100, limit_s, search_seconds=rng.choice([0.01, 1.0, 5.0]), frame_seconds=0.02)
    assert windows[0][0] == 0 and windows[-1][1] == n
    for (_, end), (start, _) in itertools.pairwise(windows):
        assert end == start
    assert all(0 < end - start <= max(1, int(limit_s * 100)) for start, end in windows)


@pytest.fixture
async def engine(tiny_whisper) -> AsyncIterator[AsyncEngine]:
    async with await AsyncEngine.from_pretrained(tiny_whisper, progress=False, max_batch_size=8) as engine:
        yield engine


async def alone(engine: AsyncEngine, samples: np.ndarray, **fields) -> tuple[str, int]:
    async with engine.generate(TranscriptionRequest(samples, RATE, **fields)) as stream:
        text = "".join([out.chunk.text async for out in stream])
    return text, stream.usage["transcription"].output_tokens


async def assert_no_state(engine: AsyncEngine) -> None:
    """Every slot free once the worker has run the steps that began before (releases are applied between steps)."""
    await engine.worker.submit(lambda: None)
    await engine.worker.submit(lambda: None)
    family = engine.models.get(ModelKind.TRANSCRIPTION)
    sched = family.scheduler
    assert sched.live() == dict.fromkeys(sched.live(), 0)
    assert family.runner.live == set()


async def test_a_long_recording_is_its_windows_transcribed_alone_in_order(engine):
    x = noise_with_gaps(65.0, [29.0, 58.0], seed=3)
    async with transcribe_long(engine, TranscriptionRequest(x, RATE, language="en", max_tokens=12)) as transcript:
        pieces = [piece async for piece in transcript]
    windows = transcript.windows
    assert len(windows) == 3
    parts = [await alone(engine, x[a:b], language="en", max_tokens=12) for a, b in windows]
    texts = [t for t, _ in parts]
    assert all(texts)  # the tiny random Whisper writes something for noise
    expected = texts[0]
    for t in texts[1:]:
        expected += t if expected[-1:].isspace() or t[:1].isspace() else " " + t
    assert "".join(pieces) == expected
    assert transcript.usage.output_tokens == sum(n for _, n in parts)
    assert transcript.usage.input_audio_tokens > 0
    assert all(pieces)
    await assert_no_state(engine)


async def test_windows_start_at_most_at_once_ahead_of_the_reader(engine):
    x = utterance("noise", 100.0, seed=5)  # 4 windows
    async with transcribe_long(engine, TranscriptionRequest(x, RATE, language="en", max_tokens=3), at_once=2) as t:
        assert t.started == 0  # building it checks every window; none runs before it is read
        seen = []
        async for _ in t:
            seen.append((t.reading, t.started))
            assert t.started <= t.reading + 2
        assert len(t.windows) == 4 and t.started == 4
    assert {r for r, _ in seen} == {0, 1, 2, 3} and (0, 2) in seen
    await assert_no_state(engine)


async def test_an_abort_while_reading_raises_instead_of_ending_the_text_early(engine):
    x = utterance("noise", 100.0, seed=6)
    async with transcribe_long(engine, TranscriptionRequest(x, RATE, language="en", max_tokens=4)) as t:
        pieces = aiter(t)
        await anext(pieces)
        t.abort()
        with pytest.raises(RequestCancelled):
            async for _ in pieces:
                pass
        assert t.started == 4
    await assert_no_state(engine)


async def test_a_bad_request_is_refused_before_anything_runs(engine):
    x = utterance("noise", 70.0)
    with pytest.raises(InvalidRequestError) as err:
        transcribe_long(engine, TranscriptionRequest(x, RATE, language="xx"))
    assert err.value.param == "language"
    await assert_no_state(engine)


async def test_random_aborts_leave_no_state(engine):
    rng = random.Random(7)

    async def one(seed: int) -> None:
        x = utterance("noise", rng.choice([5.0, 40.0, 75.0]), seed=seed)
        stop_after = rng.randrange(0, 6)
        async with transcribe_long(engine, TranscriptionRequest(x, RATE, language="en", max_tokens=6)) as t:
            n = 0
            async for _ in t:
                n += 1
                if n >= stop_after:
                    break

    async with anyio.create_task_group() as tg:
        for seed in range(8):
            tg.start_soon(one, seed)
    await assert_no_state(engine)  # each transcript's exit waited until its windows' slots were free


def most_at_once(runner, request_ids: set[str]) -> int:
    """The most sequences of ``request_ids`` the runner held at once (from its admit and release events)."""
    held, most, ids = 0, 0, set()
    for event in runner.log:
        if event[0] == "admit" and event[2] in request_ids:
            ids.add(event[1])
            held += 1
            most = max(most, held)
        elif event[0] == "release" and event[1] in ids:
            held -= 1
    return most


async def test_a_bulk_recording_holds_at_most_half_the_slots(tiny_whisper):
    async with await AsyncEngine.from_pretrained(tiny_whisper, progress=False, max_batch_size=4) as engine:
        runner = engine.models.get(ModelKind.TRANSCRIPTION).runner
        runner.record = True
        x = utterance("noise", 100.0, seed=8)
        for bulk, most in ((False, 4), (True, 2)):  # the same 4 windows, started at once, decoding 40 tokens each
            request = TranscriptionRequest(x, RATE, language="en", max_tokens=40, bulk=bulk)
            async with transcribe_long(engine, request, at_once=4) as t:
                assert "".join([piece async for piece in t])
            windows = {f"{request.request_id}-{i}" for i in range(len(t.windows))}
            assert len(windows) == 4 and most_at_once(runner, windows) == most
        await assert_no_state(engine)
