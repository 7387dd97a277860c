"""Our batched greedy Whisper decode gives transformers' ``generate()`` tokens, alone and in any batch."""

from __future__ import annotations

import asyncio
import copy
import threading

import numpy as np
import pytest
import torch
from asr_helpers import UTTERANCES, reference, utterance

from omni_stream.engine import AsyncEngine
from omni_stream.errors import InvalidRequestError
from omni_stream.transcription.spec import TranscriptionRequest

pytest_plugins = ("asr_fixtures",)

MAX_TOKENS = 12


def audios(seed: int = 0) -> list[np.ndarray]:
    return [utterance(kind, seconds, seed=seed + i) for i, (kind, seconds) in enumerate(UTTERANCES)]


def generated(model, extractor, audio: np.ndarray, **kwargs) -> list[int]:
    """``generate()``'s greedy tokens; like ours, it may not pick timestamp tokens (we decode without them)."""
    gen = copy.deepcopy(model.generation_config)
    gen.suppress_tokens = [*gen.suppress_tokens, *range(gen.no_timestamps_token_id + 1, model.config.vocab_size)]
    gen.max_new_tokens, gen.max_length = MAX_TOKENS, None
    if gen.is_multilingual:
        kwargs.setdefault("task", "transcribe")
    features = extractor(audio, sampling_rate=16000, return_tensors="pt").input_features
    with torch.no_grad():
        out = model.generate(features, generation_config=gen, **kwargs)
    ids = out[0].tolist()
    return ids[: ids.index(gen.eos_token_id) + 1] if gen.eos_token_id in ids else ids


def our_tokens(runner, request_id: str, kind: str = "token") -> list[int]:
    """The tokens the runner picked for a request (``kind="language"``: its detected language)."""
    seq_ids = [e[1] for e in runner.log if e[0] == "admit" and e[2] == request_id]
    assert len(seq_ids) == 1
    return [e[2] for e in runner.log if e[0] == kind and e[1] == seq_ids[0]]


def requests(clips: list[np.ndarray], **kwargs) -> list[TranscriptionRequest]:
    return [TranscriptionRequest(a, max_tokens=MAX_TOKENS, **kwargs) for a in clips]


async def transcribe(engine: AsyncEngine, audio: np.ndarray | TranscriptionRequest, **kwargs) -> tuple[str, str]:
    request = (
        audio
        if isinstance(audio, TranscriptionRequest)
        else TranscriptionRequest(audio, max_tokens=MAX_TOKENS, **kwargs)
    )
    deltas = [out.chunk async for out in engine.generate(request)]
    assert deltas[-1].final and not any(d.final for d in deltas[:-1])
    return "".join(d.text for d in deltas), deltas[-1].finish_reason


@pytest.mark.parametrize("language", ["en", "de", None])
async def test_batched_greedy_tokens_equal_transformers_generate(tiny_whisper, language):
    model, extractor = reference(tiny_whisper)
    expected = [generated(model, extractor, a, language=language) for a in audios()]
    assert len({tuple(e) for e in expected}) == len(expected)  # the inputs are told apart
    async with await AsyncEngine.from_pretrained(tiny_whisper, progress=False) as engine:
        runner = engine.models.get("transcription").runner
        runner.record = True
        reqs = requests(audios(), language=language)
        await asyncio.gather(*(transcribe(engine, r) for r in reqs))
        assert [our_tokens(runner, r.request_id) for r in reqs] == expected
        assert engine.models.get("transcription").scheduler.stats.max_batch > 1
        if language is None:  # detection ran first, from <|startoftranscript|> alone, as generate() does
            detected = model.detect_language(
                extractor(audios(), sampling_rate=16000, return_tensors="pt").input_features
            ).tolist()
            assert [our_tokens(runner, r.request_id, "language") for r in reqs] == [[d] for d in detected]


async def test_the_prompt_conditions_the_decoder_as_in_generate(tiny_whisper):
    model, extractor = reference(tiny_whisper)
    from transformers import WhisperTokenizer

    tok = WhisperTokenizer.from_pretrained(str(tiny_whisper))
    prompt = "hello world this is a test"
    audio = audios()[1]
    prompt_ids = torch.tensor(tok.get_prompt_ids(prompt))
    expected = generated(model, extractor, audio, language="en", prompt_ids=prompt_ids)
    plain = generated(model, extractor, audio, language="en")
    assert expected != plain
    async with await AsyncEngine.from_pretrained(tiny_whisper, progress=False) as engine:
        runner = engine.models.get("transcription").runner
        runner.record = True
        request = TranscriptionRequest(audio, language="en", prompt=prompt, max_tokens=MAX_TOKENS)
        async with engine.generate(request) as stream:
            [o async for o in stream]
        assert stream.usage["transcription"].input_tokens == 100 + len(prompt_ids)  # 2 s of audio + the prompt
        assert our_tokens(runner, request.request_id) == expected


async def test_an_english_only_model_decodes_without_language_or_task(tiny_whisper_en):
    model, extractor = reference(tiny_whisper_en)
    expected = [generated(model, extractor, a) for a in audios()[:3]]
    async with await AsyncEngine.from_pretrained(tiny_whisper_en, progress=False) as engine:
        runner = engine.models.get("transcription").runner
        runner.record = True
        reqs = requests(audios()[:3])
        await asyncio.gather(*(transcribe(engine, r) for r in reqs))
        assert [our_tokens(runner, r.request_id) for r in reqs] == expected


async def test_a_newcomer_joining_a_running_batch_gets_its_solo_transcript(tiny_whisper):
    clips, long = audios(seed=5), 60
    async with await AsyncEngine.from_pretrained(tiny_whisper, progress=False) as engine:
        family = engine.models.get("transcription")
        runner, sched = family.runner, family.scheduler
        first_request = TranscriptionRequest(clips[0], language="en", max_tokens=long)
        solo_first = await transcribe(engine, first_request)
        solo = [await transcribe(engine, a, language="en") for a in clips[1:]]
        assert len({text for text, _ in [solo_first, *solo]}) == len(clips)
        runner.record, runner.log = True, []
        queued, opened = asyncio.Event(), []
        plain_open = sched.open

        def open_and_count(payload, ctx=None, **options):
            session = plain_open(payload, ctx, **options)
            opened.append(session)
            if len(opened) == len(clips):
                queued.set()
            return session

        sched.open = open_and_count
        request = TranscriptionRequest(clips[0], language="en", max_tokens=long)
        async with engine.generate(request) as stream:
            head = [(await anext(stream)).chunk for _ in range(3)]  # the first request is decoding
            gate = threading.Event()
            blocked = engine.worker.submit(gate.wait)  # hold the worker between two steps
            late = [asyncio.create_task(transcribe(engine, a, language="en")) for a in clips[1:]]
            await queued.wait()  # every newcomer waits for a slot
            gate.set()
            await blocked
            tail = [out.chunk async for out in stream]
        together = await asyncio.gather(*late)
        deltas = head + tail
        assert ("".join(d.text for d in deltas), deltas[-1].finish_reason) == solo_first
        assert together == solo
        first_seq = next(e[1] for e in runner.log if e[0] == "admit" and e[2] == request.request_id)
        steps = [e for e in runner.log if e[0] == "step"]
        # One step encoded every newcomer while the first request decoded its next token.
        assert any(len(prefill) == len(clips) - 1 and first_seq in decode for _, prefill, decode in steps)
        # Every decoder call, the newcomers' prompts beside the running token included, ran at a shape captured
        # as a CUDA graph at load (a prompt call: width 4, every position; a token call: width 1).
        calls = {e[2:5] for e in runner.log if e[0] == "decode"}
        assert calls <= set(runner.shapes.keys()) and {w for _, w, _ in calls} == {1, 4}


async def test_rows_in_scattered_slots_decode_as_in_consecutive_ones(tiny_whisper):
    clips = audios(seed=9)
    async with await AsyncEngine.from_pretrained(tiny_whisper, progress=False, max_batch_size=8) as engine:
        solo = [await transcribe(engine, a, language="en") for a in clips]
        # Hold slots 0..3 with long requests, then free 0 and 2: the next batch lands in slots 0, 2, 4, ...
        streams = [engine.generate(TranscriptionRequest(utterance("noise", 2.0, seed=99 + i), language="en"))
                   for i in range(4)]  # fmt: skip
        for s in streams:
            await anext(s)
        await streams[0].aclose()
        await streams[2].aclose()
        got = await asyncio.gather(*(transcribe(engine, a, language="en") for a in clips))
        for s in (streams[1], streams[3]):
            await s.aclose()
        assert got == solo


@pytest.mark.parametrize("language", ["de", None])
async def test_translation_gives_transformers_generate_tokens_for_the_translate_task(tiny_whisper, language):
    model, extractor = reference(tiny_whisper)
    clips = audios(seed=3)
    expected = [generated(model, extractor, a, language=language, task="translate") for a in clips]
    transcribed = [generated(model, extractor, a, language=language) for a in clips]
    assert expected != transcribed  # the task token changes what the decoder writes
    async with await AsyncEngine.from_pretrained(tiny_whisper, progress=False) as engine:
        runner = engine.models.get("transcription").runner
        runner.record = True
        reqs = requests(clips, language=language, task="translate")
        await asyncio.gather(*(transcribe(engine, r) for r in reqs))
        assert [our_tokens(runner, r.request_id) for r in reqs] == expected


async def test_an_english_only_model_refuses_to_translate(tiny_whisper_en):
    async with await AsyncEngine.from_pretrained(tiny_whisper_en, progress=False) as engine:
        with pytest.raises(InvalidRequestError, match="does not translate") as err:
            engine.generate(TranscriptionRequest(audios()[0], task="translate"))
        assert err.value.param == "model"
        with pytest.raises(InvalidRequestError) as err:
            TranscriptionRequest(audios()[0], task="summarize")
        assert err.value.param == "task"
