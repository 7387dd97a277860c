"""The engine's one validator (omni_stream.validation) on the real tiny families: each rule in one place, with one
message, whichever way a request comes in (speech, a spoken chat reply, a realtime session's voice, a voice upload)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import pytest_asyncio
from lm_helpers import tiny_lm_checkpoint

from omni_stream.chunks import TextDelta
from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.errors import InvalidRequestError, UnknownVoiceError, UnsupportedTaskError
from omni_stream.family import ModelKind, TextInfo
from omni_stream.models.qwen3_tts.checkpoint import write_tiny_checkpoint
from omni_stream.realtime.speech.voice_store import StoredVoice, VoiceStore
from omni_stream.requests import (
    GREEDY,
    ChatMessage,
    ChatRequest,
    Role,
    SamplingParams,
    SpeechRequest,
    SpokenReply,
    TaskType,
    TextRequest,
)
from omni_stream.validation import speech as speech_rules
from omni_stream.validation.language import resolve_language
from omni_stream.validation.sampling import openai_sampling, sampling_from_openai
from omni_stream.validation.text import check_max_tokens, fit_prompt
from omni_stream.validation.voices import model_key

FRAMES = 4  # random weights never stop on their own: bound every request
shared_engine = pytest.mark.asyncio(loop_scope="module")  # the tests that use the module's engine


@pytest.fixture(scope="module")
def custom_voice(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("validation-cv"), "custom_voice")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("validation-base"), "base")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(custom_voice, tmp_path_factory):
    """The tiny Qwen3-TTS CustomVoice and the tiny Qwen3 chat model in one engine."""
    lm = tiny_lm_checkpoint(tmp_path_factory)
    sources = {"tts": ModelSource(custom_voice), "lm": ModelSource(lm, kind=ModelKind.TEXT)}
    async with await AsyncEngine.load(sources, progress=False) as loaded:
        yield loaded


def _chat(voice: str | None, **speech) -> ChatRequest:
    text = TextRequest(messages=(ChatMessage(Role.USER, "Say something."),), max_tokens=12, sampling=GREEDY)
    return ChatRequest(text, speech=SpokenReply(voice=voice, **speech))


@shared_engine
async def test_an_unknown_voice_gets_one_message_from_every_way_in(engine):
    messages = set()
    for ask in (
        lambda: engine.speech("Hi.", voice="nobody"),
        lambda: engine.generate(_chat("nobody")),
        lambda: engine.voice("nobody"),
    ):
        with pytest.raises(UnknownVoiceError) as info:
            ask()
        assert info.value.param == "voice"
        messages.add(info.value.message)
    voices = ", ".join(sorted(v.lower() for v in engine.speech_info.voices))
    assert messages == {f"Invalid voice 'nobody'. Supported: {voices}"}


@shared_engine
async def test_a_spoken_replys_voice_is_resolved_once_for_the_whole_reply(engine, monkeypatch):
    looked_up: list[str] = []
    find_voice = speech_rules.find_voice

    def counting(info, voices, name):
        looked_up.append(name)
        return find_voice(info, voices, name)

    monkeypatch.setattr(speech_rules, "find_voice", counting)
    voice = engine.speech_info.voices[1]
    units = []  # the transcript of each spoken unit, just before its audio
    # units of at most 8 characters: the reply is spoken in several requests, each with the reply's voice
    async with engine.generate(_chat(voice.upper(), max_unit_chars=8, initial_codec_chunk_frames=1)) as stream:
        async for out in stream:
            if out.stage == "speech" and isinstance(out.chunk, TextDelta):
                units.append(out.chunk.text)
    assert len(units) >= 2  # several units were spoken
    assert looked_up == [voice.upper()]  # and the voice was looked up once, before the pipeline ran


@shared_engine
async def test_language_and_task_are_resolved_in_the_models_spelling(engine):
    resolved = engine.resolve(SpeechRequest("Hi.", voice=engine.speech_info.voices[0].upper(), language="english"))
    assert (resolved.language, resolved.voice, resolved.task_type) == (
        "English",
        engine.speech_info.voices[0],
        TaskType.CUSTOM_VOICE,
    )
    assert engine.resolve(SpeechRequest("Hi.")).voice == engine.speech_info.default_voice
    with pytest.raises(InvalidRequestError) as info:
        engine.resolve(SpeechRequest("Hi.", language="Klingon"))
    languages = ", ".join(engine.speech_info.languages)
    assert (info.value.param, info.value.message) == (
        "language",
        f"Unsupported language 'Klingon'. Supported: Auto, {languages}",
    )
    assert resolve_language("AUTO", ("English",)) == "Auto" and resolve_language("x", ()) == "x"
    # an ISO 639-1 code names the model's language; a refused value is named as it was sent
    assert resolve_language("en", ("English", "Chinese")) == "English"
    assert resolve_language(" ZH ", ("English", "Chinese")) == "Chinese"
    with pytest.raises(InvalidRequestError, match=r"Unsupported language 'ja'\. Supported: Auto, English$"):
        resolve_language("ja", ("English",))


@shared_engine
async def test_a_task_the_checkpoint_cannot_do_is_named_first_whatever_else_is_wrong(engine):
    # a reference (cloning) without task_type means Base, as vLLM-Omni infers; the language is wrong too
    for request in (
        SpeechRequest("Hi.", task_type=TaskType.BASE, language="Klingon"),
        SpeechRequest("Hi.", ref_text="a transcript", language="Klingon"),
    ):
        with pytest.raises(UnsupportedTaskError) as info:
            engine.resolve(request)
        assert info.value.param == "task_type"
        assert info.value.message.startswith("Qwen3-TTS CustomVoice checkpoint does not support task_type='Base'")


async def test_uploaded_voices_come_through_the_catalog_the_engine_is_given(base, custom_voice):
    async with await AsyncEngine.from_pretrained(base, progress=False) as engine:
        ref = np.random.default_rng(0).standard_normal(24000 * 2).astype(np.float32) * 0.1
        prompt = await engine.create_voice_prompt(ref, 24000, "a reference transcript")
        store = VoiceStore(None)
        info = engine.speech_info
        store.save(
            StoredVoice("Mine", "yes", 0, "audio/wav", 1, ref, 24000, "a reference transcript", None, prompt,
                        model_key(info)),
            b"",
        )  # fmt: skip
        with pytest.raises(UnknownVoiceError):  # no catalog: no uploaded voices
            engine.resolve(SpeechRequest("Hi.", voice="mine"))
        engine.use_voices(store)
        resolved = engine.resolve(SpeechRequest("Hi.", voice="MINE"))
        assert resolved.task_type is TaskType.BASE and resolved.voice_prompt is prompt
        assert engine.voice("mine") == "Mine"
        async with engine.speech("Hi.", voice="mine", max_new_tokens=FRAMES, seed=0) as stream:
            assert sum([a.n_samples async for a in stream]) > 0
        # the same store on a checkpoint that cannot clone: the voice is known, and refused for what it is
    async with await AsyncEngine.from_pretrained(custom_voice, progress=False) as engine:
        engine.use_voices(store)
        with pytest.raises(InvalidRequestError) as error:
            engine.resolve(SpeechRequest("Hi.", voice="mine"))
        assert error.value.param == "voice" and "cannot do" in error.value.message


async def test_a_cloning_reference_is_checked_before_any_audio_is_read(base):
    async with await AsyncEngine.from_pretrained(base, progress=False) as engine:
        info = engine.speech_info
        pending = SpeechRequest("Hi.", ref_text="the transcript")
        assert speech_rules.resolve_speech(info, None, pending, reference_follows=True).task_type is TaskType.BASE
        with pytest.raises(InvalidRequestError) as error:  # the reference must come
            engine.resolve(pending)
        assert error.value.param == "ref_audio"
        with pytest.raises(InvalidRequestError) as error:  # in-context cloning needs the transcript
            engine.resolve(SpeechRequest("Hi.", ref_audio=np.zeros(24000, np.float32)))
        assert error.value.param == "ref_text"
        with pytest.raises(InvalidRequestError) as error:  # too short, by the engine's one bound
            engine.resolve(SpeechRequest("Hi.", ref_audio=np.zeros(2400, np.float32), x_vector_only_mode=True))
        assert error.value.param == "ref_audio" and "too short" in error.value.message


def test_the_prompt_fits_the_context_by_one_rule():
    assert fit_prompt(10, None, 16) == 6 and fit_prompt(10, 6, 16) == 6
    with pytest.raises(InvalidRequestError) as error:
        fit_prompt(16, None, 16, "prompt")
    assert error.value.param == "prompt"
    check_max_tokens(TextInfo("m", "openai", "text", max_context=16, context_known=False), 100)  # the server's to say
    with pytest.raises(InvalidRequestError) as error:
        check_max_tokens(TextInfo("m", "qwen3", "text", max_context=16), 16)
    assert error.value.param == "max_tokens"


@shared_engine
async def test_max_tokens_past_the_text_models_context_is_refused_before_the_pipeline(engine):
    context = engine.models.text().info.max_context
    with pytest.raises(InvalidRequestError) as error:
        engine.chat(TextRequest(messages=(ChatMessage(Role.USER, "hi"),), max_tokens=context))
    assert error.value.param == "max_tokens" and f"context of {context} tokens" in error.value.message


def test_sampling_in_openais_words_both_ways():
    assert sampling_from_openai(None, None) is None
    assert sampling_from_openai(0.0, 0.5) == GREEDY
    assert sampling_from_openai(0.0, None, 5, 1.2) == replace(GREEDY, repetition_penalty=1.2)  # greedy, penalized
    assert sampling_from_openai(None, None, -1, None) == SamplingParams(temperature=1.0, top_k=0, top_p=1.0)
    assert sampling_from_openai(0.7, None, 20, 1.1) == SamplingParams(
        temperature=0.7, top_k=20, top_p=1.0, repetition_penalty=1.1
    )
    with pytest.raises(InvalidRequestError) as error:
        sampling_from_openai(0.7, None, None, 0.0)
    assert error.value.param == "repetition_penalty"
    assert sampling_from_openai(0.7, None) == SamplingParams(temperature=0.7, top_k=0, top_p=1.0)
    with pytest.raises(InvalidRequestError) as error:
        sampling_from_openai(0.7, 0.0)
    assert error.value.param == "top_p"
    assert openai_sampling(GREEDY) == {"temperature": 0.0}
    assert openai_sampling(SamplingParams(temperature=0.7, top_k=0, top_p=1.0)) == {"temperature": 0.7}
    assert openai_sampling(SamplingParams(temperature=0.7, top_k=5, top_p=0.9, repetition_penalty=1.1)) == {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "repetition_penalty": 1.1,
    }


@shared_engine
async def test_images_to_a_text_model_that_does_not_see_are_refused_before_the_pipeline(engine):
    picture = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(InvalidRequestError) as error:
        engine.chat(TextRequest(messages=(ChatMessage(Role.USER, "what is this?", images=(picture,)),), max_tokens=4))
    assert error.value.param == "messages" and "does not take images" in error.value.message


def test_a_messages_images_are_user_turns_of_rgb_pixels_shown_before_its_text():
    picture = np.zeros((8, 8, 3), np.uint8)
    shown = ChatMessage(Role.USER, "what is this?", images=[picture, picture])
    parts = [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "what is this?"}]
    assert shown.template()["content"] == parts
    assert ChatMessage(Role.USER, "hi").template()["content"] == "hi"
    with pytest.raises(InvalidRequestError, match="only user messages"):
        ChatMessage(Role.ASSISTANT, "it is", images=(picture,))
    with pytest.raises(InvalidRequestError, match="uint8 RGB"):
        ChatMessage(Role.USER, "grey?", images=(np.zeros((8, 8), np.uint8),))
