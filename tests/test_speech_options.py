"""A family's own request words travel in its own options object (``SpeechRequest.options``, the type its
``SpeechInfo.options`` names), checked by the engine; the engine's request types carry none of them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from omni_stream.engine import AsyncEngine
from omni_stream.errors import InvalidRequestError
from omni_stream.models.qwen3_tts.checkpoint import write_tiny_checkpoint
from omni_stream.models.qwen3_tts.options import Qwen3TTSOptions
from omni_stream.requests import GREEDY, SpeechRequest
from omni_stream.speak import with_samplers
from omni_stream.validation.speech import family_options


@pytest.fixture(scope="module")
def custom_voice_dir(tmp_path_factory: pytest.TempPathFactory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("cv"), "custom_voice", "0.6b", seed=1)


def test_the_engine_request_types_name_no_family_option() -> None:
    names = {f.name for f in dataclasses.fields(SpeechRequest)}
    assert not names & {"subtalker_sampling", "non_streaming_mode"} and "options" in names


async def _audio(engine: AsyncEngine, options: Qwen3TTSOptions | None, seed: int = 0) -> np.ndarray:
    request = SpeechRequest("Hello there.", voice="ryan", sampling=GREEDY, max_new_tokens=8, options=options, seed=seed)
    async with engine.speech(request) as stream:
        return np.concatenate([a.samples async for a in stream])


async def test_qwen3_tts_options_reach_its_prompt_and_its_code_predictor(custom_voice_dir) -> None:
    async with await AsyncEngine.from_pretrained(custom_voice_dir, progress=False) as engine:
        assert engine.speech_info.options is Qwen3TTSOptions
        # the code predictor's sampler: the checkpoint's samples (seeds differ), a greedy one does not
        assert not np.array_equal(await _audio(engine, None, seed=1), await _audio(engine, None, seed=2))
        greedy = Qwen3TTSOptions(subtalker_sampling=GREEDY)
        assert np.array_equal(await _audio(engine, greedy, seed=1), await _audio(engine, greedy, seed=2))
        # the prompt layout: all text in the prefill or one token a step, other prefills, other codes
        streaming = await _audio(engine, dataclasses.replace(greedy, non_streaming_mode=False))
        whole = await _audio(engine, dataclasses.replace(greedy, non_streaming_mode=True))
        assert not np.array_equal(streaming, whole)


async def test_options_of_another_type_are_refused_naming_the_field(custom_voice_dir) -> None:
    @dataclasses.dataclass(frozen=True)
    class Foreign:
        layout: str = "x"

    async with await AsyncEngine.from_pretrained(custom_voice_dir, progress=False) as engine:
        with pytest.raises(InvalidRequestError, match=r"options of type Foreign are not Qwen3-TTS's") as info:
            engine.speech(SpeechRequest("Hi.", voice="ryan", options=Foreign()))
        assert info.value.param == "options"


def test_wire_fields_become_the_familys_options_or_are_refused_naming_them(custom_voice_dir) -> None:
    from omni_stream.family import ModelKind, SpeechInfo

    info = SpeechInfo("m", "qwen3_tts", ModelKind.SPEECH, options=Qwen3TTSOptions)
    assert family_options(info, non_streaming_mode=None) is None  # nothing given: the family's defaults
    assert family_options(info, non_streaming_mode=True) == Qwen3TTSOptions(non_streaming_mode=True)
    with pytest.raises(InvalidRequestError, match=r"'warp' is not supported by this model \(Qwen3-TTS") as err:
        family_options(info, warp=2)
    assert err.value.param == "warp"
    none = SpeechInfo("m", "synthetic_tts", ModelKind.SPEECH)  # a family that takes no options
    with pytest.raises(InvalidRequestError, match="'non_streaming_mode' is not supported by this model"):
        family_options(none, non_streaming_mode=False)


def test_speak_greedy_sets_every_sampler_the_familys_options_have() -> None:
    assert with_samplers(Qwen3TTSOptions, GREEDY) == Qwen3TTSOptions(subtalker_sampling=GREEDY)
    assert with_samplers(None, GREEDY) is None
