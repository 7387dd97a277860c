"""The synthetic ASR test double: it hears the synthetic TTS's tones, on the shared scheduler path."""

from __future__ import annotations

import asyncio
from collections import Counter

import numpy as np
import pytest
from synthetic import tone_hz, write_checkpoint
from synthetic.asr_family import (
    Segment,
    SyntheticASRFault,
    segments,
    transcript_words,
    write_asr_checkpoint,
)

from omni_stream.chunks import Audio
from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.errors import ConfigError, InvalidRequestError
from omni_stream.family import ModelKind
from omni_stream.transcription.spec import TranscriptionRequest


def tone(hz: float, seconds: float, rate: int = 16000, amplitude: float = 0.25) -> np.ndarray:
    return (amplitude * np.sin(2 * np.pi * hz * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def test_segments_read_pitch_and_duration_of_each_tone():
    quiet = np.zeros(1600, np.float32)
    audio = np.concatenate([quiet, tone(220, 0.4), np.zeros(3200, np.float32), tone(640, 1.2), quiet])
    assert segments(audio, 16000) == [Segment(220, 400), Segment(640, 1200)]
    assert transcript_words(segments(audio, 16000)) == ("220", " hz", " 400", " ms", " 640", " hz", " 1200", " ms")
    assert transcript_words(segments(np.zeros(16000, np.float32), 16000)) == ("silence",)
    # Gaps shorter than 50 ms do not split a segment (the tone's own zero crossings are far shorter).
    assert segments(np.concatenate([tone(300, 0.2), np.zeros(320, np.float32), tone(300, 0.2)]), 16000)[0].ms == 420


@pytest.fixture
async def engine(tmp_path):
    sources = {
        "tts": ModelSource(write_checkpoint(tmp_path / "tts")),
        "asr": ModelSource(write_asr_checkpoint(tmp_path / "asr", fail_hz=980.0)),
    }
    async with await AsyncEngine.load(sources, progress=False, max_batch_size=8) as engine:
        engine.models.get(ModelKind.TRANSCRIPTION).model.record = True
        yield engine


async def spoken(engine: AsyncEngine, text: str, voice: str) -> np.ndarray:
    async with engine.speech(text, voice=voice) as stream:
        return np.concatenate([a.samples async for a in stream])


async def heard(engine: AsyncEngine, request: TranscriptionRequest) -> tuple[str, str, dict]:
    async with engine.generate(request) as stream:
        deltas = [out.chunk async for out in stream]
    assert deltas[-1].final and not any(d.final for d in deltas[:-1])
    return "".join(d.text for d in deltas), deltas[-1].finish_reason, stream.usage


@pytest.mark.parametrize(("voice", "text"), [("alice", "Hello there"), ("carol", "A longer sentence to say.")])
async def test_it_transcribes_what_the_synthetic_tts_says(engine, voice, text):
    audio = await spoken(engine, text, voice)  # 24 kHz, resampled to 16 kHz by the stage
    frames = max(1, round(len(text.strip()) * 0.5))
    hz = int(tone_hz(1 + ["alice", "bob", "carol", "dave"].index(voice)))
    got, reason, usage = await heard(engine, TranscriptionRequest(audio, sample_rate=24000))
    assert got == f"{hz} hz {frames * 80} ms" and reason == "stop"
    assert usage["transcription"].output_tokens == 4
    assert usage["transcription"].input_tokens == round(frames * 0.08 * 50)


async def test_streamed_tts_audio_reads_the_same_as_whole(engine):
    async def stream():
        async with engine.speech("Streaming works fine", voice="bob") as s:
            async for chunk in s:
                yield chunk

    got, _, _ = await heard(engine, TranscriptionRequest(stream()))
    assert got == "240 hz 800 ms"


async def test_max_tokens_cuts_the_transcript(engine):
    got, reason, _ = await heard(engine, TranscriptionRequest(tone(300, 0.5), max_tokens=2))
    assert (got, reason) == ("300 hz", "length")


async def test_the_fault_pitch_fails_its_request_alone(engine):
    ok = asyncio.create_task(heard(engine, TranscriptionRequest(tone(300, 0.5))))
    with pytest.raises(SyntheticASRFault):
        await heard(engine, TranscriptionRequest(tone(980, 0.5)))
    assert (await ok)[0] == "300 hz 500 ms"


async def test_requests_share_steps_and_every_slot_is_released(engine):
    family = engine.models.get(ModelKind.TRANSCRIPTION)
    pitches = [200 + 20 * i for i in range(8)]
    results = await asyncio.gather(*(heard(engine, TranscriptionRequest(tone(hz, 0.3))) for hz in pitches))
    assert [r[0] for r in results] == [f"{hz} hz 300 ms" for hz in pitches]
    steps = [e for e in family.model.log if e[0] == "step"]
    assert max(len(decode) for _, _, decode in steps) > 1  # words of several requests in one step
    # An abort mid-transcript frees the slot too.
    stream = engine.generate(TranscriptionRequest(tone(250, 0.3)))
    await anext(stream)
    await stream.aclose()
    await engine.worker.submit(lambda: None)
    await engine.worker.submit(lambda: None)
    admitted = Counter(i for e in family.model.log if e[0] == "step" for i in e[1])
    assert len(admitted) == 9 and family.model.released == admitted and family.model.live == set()
    assert family.scheduler.live() == dict.fromkeys(family.scheduler.live(), 0)


async def test_bad_input_and_config_name_the_problem(engine, tmp_path):
    with pytest.raises(InvalidRequestError) as err:
        engine.generate(TranscriptionRequest(np.zeros(16000 * 31, np.float32)))
    assert err.value.param == "audio"

    async def empty():
        return
        yield Audio(np.zeros(1, np.float32), 16000)

    with pytest.raises(InvalidRequestError, match="without any audio"):
        await heard(engine, TranscriptionRequest(empty()))
    with pytest.raises(ConfigError, match="unknown synthetic_asr config keys"):
        write_asr_checkpoint(tmp_path / "bad", pitch=3)
