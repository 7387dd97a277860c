"""Whisper's shorter encoder windows (``transcription_window_ms``): the policy, and transcripts equal to
``transformers``' own model run at that window (whisper.cpp's ``audio_ctx``), alone and in any batch."""

from __future__ import annotations

import asyncio
import copy

import numpy as np
import pytest
import torch
from asr_helpers import reference, step_together, utterance

from omni_stream.engine import AsyncEngine
from omni_stream.errors import ConfigError
from omni_stream.family import ModelKind
from omni_stream.models.whisper.family import windows
from omni_stream.models.whisper.shapes import WINDOW_MARGIN_S, encoder_windows, window_for
from omni_stream.runtime.settings import Tuning
from omni_stream.transcription.spec import TranscriptionRequest

pytest_plugins = ("asr_fixtures",)

MAX_TOKENS = 10
WINDOW_MS = 4000  # windows of 200, 400, 800 and 1500 frames


def test_windows_double_from_the_smallest_to_the_whole_one():
    assert encoder_windows(1500, None) == (1500,)
    assert encoder_windows(1500, 1500) == encoder_windows(1500, 3000) == (1500,)
    assert encoder_windows(1500, 500) == (500, 1000, 1500)
    assert encoder_windows(1500, 200) == (200, 400, 800, 1500)
    with pytest.raises(ValueError, match="at least one frame"):
        encoder_windows(1500, 0)


def test_an_utterance_takes_the_smallest_window_holding_it_and_the_margin():
    ws = (200, 400, 800, 1500)
    assert WINDOW_MARGIN_S == 2.0
    assert window_for(0.5, ws) == 200  # 2.5 s: 125 frames
    assert window_for(2.0, ws) == 200  # 4 s: 200 frames, exactly the window
    assert window_for(2.1, ws) == 400
    assert window_for(14.0, ws) == 800  # 16 s
    assert window_for(14.1, ws) == 1500
    assert window_for(30.0, ws) == 1500  # none holds it: the whole window


def test_the_switch_sets_the_smallest_window_and_is_off_by_default():
    assert windows(Tuning(), 1500) == (1500,)
    assert windows(Tuning.from_env({"OMNI_STREAM_TRANSCRIPTION_WINDOW_MS": "10000"}), 1500) == (500, 1000, 1500)
    assert windows(Tuning(transcription_window_ms=4010), 1500) == (201, 402, 804, 1500)  # frames rounded up
    assert Tuning.from_env({"OMNI_STREAM_TRANSCRIPTION_WINDOW_MS": "auto"}).transcription_window_ms is None
    for bad in ("500", "40000", "ten"):
        with pytest.raises(ConfigError, match=r"OMNI_STREAM_TRANSCRIPTION_WINDOW_MS must be a number of milliseconds "
                                              r"within 1000\.\.30000"):  # fmt: skip
            Tuning.from_env({"OMNI_STREAM_TRANSCRIPTION_WINDOW_MS": bad})


def windowed_generate(model, extractor, audio: np.ndarray, frames: int) -> list[int]:
    """``transformers``' greedy tokens with its encoder cut to ``frames`` (the first ``frames`` positions, the
    first ``2 * frames`` log-mel frames): its own modules, only the window changed."""
    model = copy.deepcopy(model)
    enc = model.model.encoder
    enc.embed_positions = torch.nn.Embedding.from_pretrained(enc.embed_positions.weight[:frames].clone())
    model.config.max_source_positions = frames  # the encoder's length check and generate()'s short-form test
    gen = copy.deepcopy(model.generation_config)
    gen.suppress_tokens = [*gen.suppress_tokens, *range(gen.no_timestamps_token_id + 1, model.config.vocab_size)]
    gen.max_new_tokens, gen.max_length = MAX_TOKENS, None
    features = extractor(audio, sampling_rate=16000, return_tensors="pt").input_features[:, :, : 2 * frames]
    with torch.no_grad():
        ids = model.generate(features, generation_config=gen, language="en", task="transcribe")[0].tolist()
    return ids[: ids.index(gen.eos_token_id) + 1] if gen.eos_token_id in ids else ids


CLIPS = [("noise", 1.0, 0), ("tone440", 0.6, 0), ("noise", 3.0, 4), ("tone300", 7.0, 0), ("noise", 15.0, 2)]


def clips() -> list[np.ndarray]:
    return [utterance(kind, seconds, seed=seed) for kind, seconds, seed in CLIPS]


@pytest.fixture
async def windowed(tiny_whisper):
    tuning = Tuning(transcription_window_ms=WINDOW_MS)
    async with await AsyncEngine.from_pretrained(tiny_whisper, progress=False, max_batch_size=8, tuning=tuning) as e:
        yield e


def payloads(family, audios):
    return [family._prepare(a, TranscriptionRequest(a, max_tokens=MAX_TOKENS), family.tokens.language_id("en"))
            for a in audios]  # fmt: skip


async def test_the_encoder_at_the_whole_window_is_transformers_own(tiny_whisper):
    """The runner's encoder forward (positions cut to the window) gives transformers' values at 30 s, exactly."""
    async with await AsyncEngine.from_pretrained(tiny_whisper, progress=False, max_batch_size=2) as engine:
        family = engine.models.get(ModelKind.TRANSCRIPTION)
        runner = family.runner
        assert runner.windows == (1500,) and runner._cross_keep is None  # unset: no mask at all
        features = torch.stack([p.features for p in payloads(family, clips()[:2])])
        assert features.shape[-1] == 3000
        with torch.inference_mode():
            assert torch.equal(runner._encoder_states(features), runner.encoder(features).last_hidden_state)


async def test_each_window_transcribes_as_transformers_does_at_that_window_alone_and_mixed(windowed, tiny_whisper):
    """Clips of 0.6-15 s go to windows of 200, 400, 800 and 1500 frames; each one's tokens equal transformers'
    at its window, alone, in one mixed step (a pass per window) and through the engine. Slots a longer clip held
    before are read only as far as the new row's window (the mask): otherwise its stale frames would change it."""
    family = windowed.models.get(ModelKind.TRANSCRIPTION)
    runner = family.runner
    assert runner.windows == (200, 400, 800, 1500)
    model, extractor = reference(tiny_whisper)
    audios = clips()
    batch = payloads(family, audios)
    assert [p.window for p in batch] == [200, 200, 400, 800, 1500]
    assert [p.features.shape[-1] for p in batch] == [400, 400, 800, 1600, 3000]
    expected = [windowed_generate(model, extractor, a, p.window) for a, p in zip(audios, batch, strict=True)]
    assert len({tuple(e) for e in expected}) == len(expected)  # told apart
    runner.record = True
    try:
        # the long clips first, in slots 0-2, so the short ones below read slots that hold 800-1500 frames of theirs
        step_together(runner, batch[2:])
        alone = [step_together(runner, [p])[0][1] for p in batch[:2]]
        runner.log.clear()
        together = [tokens for _, tokens in step_together(runner, list(reversed(batch)))]
        encodes = [e for e in runner.log if e[0] == "encode"]
    finally:
        runner.record = False
    assert alone == expected[:2]
    assert list(reversed(together)) == expected
    # one step, a pass per window (smallest first), each at its batch bucket
    assert encodes == [("encode", 2, 2, 200, "eager"), ("encode", 1, 1, 400, "eager"),
                       ("encode", 1, 1, 800, "eager"), ("encode", 1, 1, 1500, "eager")]  # fmt: skip
    assert runner.encoder_windows[200] >= 3 and runner.encoder_windows[1500] >= 2
    assert not runner.live
    # through the engine, concurrently: the same transcripts
    texts = await asyncio.gather(*(transcribe(windowed, a) for a in audios))
    assert texts == [family.tokenizer.decode(e, skip_special_tokens=True).strip() for e in expected]


async def transcribe(engine: AsyncEngine, audio: np.ndarray) -> str:
    request = TranscriptionRequest(audio, language="en", max_tokens=MAX_TOKENS)
    return "".join([out.chunk.text async for out in engine.generate(request)]).strip()


async def test_random_aborts_free_every_slot_at_every_window(windowed):
    """Requests of every window cancelled at random points: every slot and cross mask row is free for the next."""
    family = windowed.models.get(ModelKind.TRANSCRIPTION)
    rng = np.random.default_rng(3)
    audios = clips()

    async def one(i: int) -> None:
        request = TranscriptionRequest(audios[i % len(audios)], language="en", max_tokens=MAX_TOKENS)
        task = asyncio.create_task(transcribe_request(windowed, request))
        await asyncio.sleep(float(rng.uniform(0, 0.05)))
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    await asyncio.gather(*(one(i) for i in range(12)))
    for _ in range(500):
        if not family.runner.live and not family.scheduler.running:
            break
        await asyncio.sleep(0.01)
    assert not family.runner.live
    assert await transcribe(windowed, audios[0])  # the engine still transcribes


async def transcribe_request(engine: AsyncEngine, request: TranscriptionRequest) -> None:
    async for _ in engine.generate(request):
        pass


@pytest.mark.parametrize("window", [1500, 500, 200])
def test_features_over_the_audio_alone_are_the_extractors_whole_window_pass(window):
    """:func:`window_features` computes the audio and a little silence, then repeats a silent frame: the same
    values as the extractor's pass over the whole zero-padded 30 s, cut to the window, at any length (a frame's
    edge, the minimum computed, the window's end), for silence too."""
    from transformers import WhisperFeatureExtractor

    from omni_stream.models.whisper.features import window_features

    extractor = WhisperFeatureExtractor(feature_size=80)
    rng = np.random.default_rng(window)
    most = window * 320
    lengths = [1, 159, 160, 401, 15999, 16000, 16361, most - 400, most - 1, most, *rng.integers(1, most, 12)]
    for n in lengths:
        audio = (rng.standard_normal(int(n)) * 0.1).astype(np.float32)
        whole = extractor(audio, sampling_rate=16000, return_tensors="pt").input_features[0]
        assert torch.equal(window_features(extractor, audio, window), whole[:, : 2 * window]), n
    silence = np.zeros(8000, np.float32)
    whole = extractor(silence, sampling_rate=16000, return_tensors="pt").input_features[0]
    assert torch.equal(window_features(extractor, silence, window), whole[:, : 2 * window])
    with pytest.raises(ValueError, match="do not fit a window"):
        window_features(extractor, np.zeros(most + 1, np.float32), window)


def test_a_dithering_extractor_takes_its_whole_pass():
    """Dither is noise over the whole window (silence is not silent): nothing is shortened, the extractor's own
    random draws decide every frame."""
    from transformers import WhisperFeatureExtractor

    from omni_stream.models.whisper.features import window_features

    extractor = WhisperFeatureExtractor(feature_size=80, dither=1e-3)
    audio = utterance("noise", 1.0)
    calls = []
    real = extractor.__call__

    class Spy(WhisperFeatureExtractor):
        def __call__(self, *args, **kwargs):
            calls.append(kwargs["max_length"])
            return real(*args, **kwargs)

    extractor.__class__ = Spy
    out = window_features(extractor, audio, 1500)
    assert calls == [480000] and out.shape == (80, 3000)
    assert len(out[:, -200:].unique()) > 1  # the padding is dithered, not one silent value


async def test_the_family_refuses_a_feature_extractor_of_another_layout(tiny_whisper, tmp_path):
    import json
    import shutil

    ckpt = tmp_path / "whisper-hop"
    shutil.copytree(tiny_whisper, ckpt)
    config = json.loads((ckpt / "preprocessor_config.json").read_text())
    config["hop_length"] = 320
    (ckpt / "preprocessor_config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="hop_length must be 160 and n_samples 480000"):
        await AsyncEngine.from_pretrained(ckpt, progress=False)
