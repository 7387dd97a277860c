"""Requests built in Python: each field's type is checked (or a numpy scalar taken as its Python number) when the
request is built, naming the field, so a wrong value never reaches a batch step that other requests share."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from omni_stream.chunks import Audio, CodecFrames, Image
from omni_stream.engine import AsyncEngine
from omni_stream.errors import ConfigError, InvalidRequestError
from omni_stream.family import LoadOptions
from omni_stream.images.spec import ImageRequest
from omni_stream.requests import (
    ChatMessage,
    ChatRequest,
    Role,
    SamplingParams,
    SpeechRequest,
    SpokenReply,
    TaskType,
    TextRequest,
)
from omni_stream.text.tools import FormatKind, FunctionTool, ResponseFormat, ToolChoice, ToolMode
from omni_stream.transcription.spec import TranscriptionRequest
from omni_stream.validation.audio import mono_float
from omni_stream.video.spec import VideoRequest

HI = (ChatMessage(Role.USER, "hi"),)


def _param(make) -> str | None:
    with pytest.raises(InvalidRequestError) as refused:
        make()
    return refused.value.param


def test_speech_fields_are_checked_when_the_request_is_built():
    assert SpeechRequest("hi", seed=np.int64(7)).seed == 7 and type(SpeechRequest("hi", seed=np.uint8(7)).seed) is int
    assert SpeechRequest("hi", task_type="Base").task_type is TaskType.BASE
    assert SpeechRequest("hi", split="clause").split == "clause"
    assert _param(lambda: SpeechRequest("hi", seed="abc")) == "seed"
    assert _param(lambda: SpeechRequest("hi", seed=np.float32(3))) == "seed"
    assert _param(lambda: SpeechRequest("hi", seed=True)) == "seed"
    assert _param(lambda: SpeechRequest("hi", seed=2**63)) == "seed"  # 64-bit seeds, as OpenAI's and vLLM's
    assert SpeechRequest("hi", seed=-(2**63)).seed == -(2**63)
    assert SpeechRequest("hi", max_new_tokens=np.int64(12)).max_new_tokens == 12
    assert SpeechRequest("hi", language=None).language == "Auto"
    assert _param(lambda: SpeechRequest("hi", ignore_eos="yes")) == "ignore_eos"
    assert _param(lambda: SpokenReply(max_unit_chars=1.5)) == "max_unit_chars"
    assert _param(lambda: SpokenReply(first_unit_tokens="5")) == "first_unit_tokens"
    assert SpokenReply(language=None).language == "Auto"
    assert _param(lambda: SpeechRequest("hi", sampling={"temperature": 0.5})) == "sampling"
    assert _param(lambda: SpeechRequest("hi", voice=3)) == "voice"
    assert _param(lambda: SpeechRequest("hi", task_type="bogus")) == "task_type"
    assert _param(lambda: SpeechRequest("hi", split="bogus")) == "split"
    assert _param(lambda: SpeechRequest("hi", ref_sample_rate=22050.5)) == "ref_sample_rate"
    assert _param(lambda: SpeechRequest("hi", initial_codec_chunk_frames=1.5)) == "initial_codec_chunk_frames"


def test_sampling_parameters_are_finite_numbers_in_range():
    assert SamplingParams(temperature=np.float32(0.5), top_k=np.int64(5)).top_k == 5
    assert _param(lambda: SamplingParams(temperature=float("nan"))) == "temperature"
    assert _param(lambda: SamplingParams(top_p=float("inf"))) == "top_p"
    assert _param(lambda: SamplingParams(top_k=10**20)) == "top_k"
    assert _param(lambda: SamplingParams(top_k=2.5)) == "top_k"
    assert _param(lambda: SamplingParams(do_sample="yes")) == "do_sample"


def test_text_fields_are_checked_and_openai_shorthands_taken():
    assert TextRequest(messages=HI, stop="ab").stop == ("ab",)  # one stop string, not the characters a and b
    assert TextRequest(messages=HI, logit_bias={5: 1.0}).logit_bias == ((5, 1.0),)
    tool = FunctionTool("f", parameters={"type": "object", "properties": {}})  # a dict, written as JSON text
    assert json.loads(tool.parameters) == {"type": "object", "properties": {}}
    required = TextRequest(messages=HI, tools=[tool], tool_choice="required")
    assert required.tool_choice == ToolChoice(ToolMode.REQUIRED) and required.tools == (tool,)
    assert not ResponseFormat("text").constrains and ResponseFormat("json_object").kind is FormatKind.JSON_OBJECT
    assert _param(lambda: ResponseFormat("json_schema")) == "response_format"  # a schema is needed
    assert _param(lambda: ResponseFormat(FormatKind.JSON_SCHEMA, "{bad")) == "response_format.json_schema.schema"
    assert _param(lambda: ResponseFormat("xml")) == "response_format"
    assert _param(lambda: FunctionTool("f", parameters="[1]")) == "tools.function.parameters"
    assert _param(lambda: TextRequest(messages=[{"role": "user", "content": "Hi"}])) == "messages"
    assert _param(lambda: TextRequest(messages=HI, max_tokens=2.5)) == "max_tokens"
    assert _param(lambda: TextRequest(messages=HI, max_tokens="5")) == "max_tokens"
    assert _param(lambda: TextRequest(messages=HI, tool_choice="sometimes")) == "tool_choice"
    assert _param(lambda: TextRequest(messages=HI, presence_penalty=float("nan"))) == "presence_penalty"
    assert _param(lambda: TextRequest(messages=HI, seed="1")) == "seed"
    assert _param(lambda: TextRequest(messages=HI, seed=2**63)) == "seed"
    assert _param(lambda: TextRequest(messages=HI, parallel_tool_calls="no")) == "parallel_tool_calls"
    assert _param(lambda: ChatRequest("Hello")) == "text"


def test_audio_samples_are_read_as_the_same_sound_whatever_their_dtype():
    t = np.arange(16000) / 16000
    wave = (0.5 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    pcm = np.round(wave * 32768).astype(np.int16)
    as_int16 = TranscriptionRequest(pcm).audio
    assert as_int16.dtype == np.float32 and np.abs(as_int16 - wave).max() < 1 / 32768
    assert TranscriptionRequest(wave.astype(np.float64)).audio.dtype == np.float32
    stereo = TranscriptionRequest(np.stack([wave, wave], axis=1)).audio
    assert stereo.shape == wave.shape and np.array_equal(stereo, wave)
    assert _param(lambda: TranscriptionRequest(np.ones(100, np.int32))) == "audio"  # an int32's scale is unknown
    assert _param(lambda: TranscriptionRequest(np.full(100, np.nan, np.float32))) == "audio"
    assert _param(lambda: TranscriptionRequest(wave, sample_rate=22050.5)) == "sample_rate"
    assert _param(lambda: TranscriptionRequest(wave, sample_rate=10**9)) == "sample_rate"
    assert np.array_equal(mono_float(pcm), as_int16)  # the one rule the VAD and cloning references read by too


def test_image_fields_are_checked_when_the_request_is_built():
    pixels = np.zeros((8, 8, 3), np.uint8)
    assert ImageRequest("a cat", size=(np.int64(64), 32)).size == (64, 32)
    assert _param(lambda: ImageRequest("a cat", size=64)) == "size"
    assert _param(lambda: ImageRequest("a cat", steps=2.5)) == "num_inference_steps"
    assert _param(lambda: ImageRequest("a cat", images=[object()])) == "image"
    assert _param(lambda: ImageRequest("a cat", images=[pixels], mask=np.full((8, 8), 255, np.uint8))) == "mask"
    assert _param(lambda: ImageRequest("a cat", guidance_scale=float("nan"))) == "guidance_scale"
    assert ImageRequest("a cat", seed=-5).seed == -5 and _param(lambda: ImageRequest("a cat", seed=2**63)) == "seed"
    boolean = ImageRequest("a cat", images=[pixels], mask=np.ones((8, 8), bool)).mask  # True: may change
    assert boolean.dtype == np.float32 and boolean.min() == 1.0


def test_video_fields_are_checked_when_the_request_is_built():
    assert VideoRequest("a kite", width=np.int64(64), seed=np.int64(3)).width == 64
    assert _param(lambda: VideoRequest("a kite", seed=2**70)) == "seed"  # failed inside the stage before
    assert _param(lambda: VideoRequest("a kite", seed="abc")) == "seed"
    assert _param(lambda: VideoRequest("a kite", width=0)) == "width"
    assert _param(lambda: VideoRequest("a kite", guidance_scale=float("inf"))) == "guidance_scale"


async def test_load_options_say_what_is_wrong_before_anything_loads():
    with pytest.raises(ConfigError, match="max_batch_size"):
        LoadOptions(max_batch_size=0)
    with pytest.raises(ConfigError, match="max_buffered_frames"):
        LoadOptions(max_buffered_frames=0)
    assert LoadOptions(max_batch_size=np.int64(4)).max_batch_size == 4
    with pytest.raises(ConfigError, match="device must be"):
        LoadOptions(device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="use device='cpu'"):
            LoadOptions(device="cuda")
    for bad in (0, -1, float("nan"), True):
        with pytest.raises(ConfigError, match="wait_timeout"):
            await AsyncEngine.load({}, wait_timeout=bad, progress=False)


def test_a_chunks_repr_names_its_arrays_by_dtype_and_shape():
    assert repr(Audio(np.zeros(1920, np.float32), 24000)) == (
        "Audio(samples=float32(1920,), sample_rate=24000, start_sample=0, final=False)"
    )
    assert repr(Image(np.zeros((4, 4, 3), np.uint8))).startswith("Image(pixels=uint8(4, 4, 3), partial=False")
    assert repr(CodecFrames(torch.zeros(2, 16, dtype=torch.long))).startswith("CodecFrames(codes=int64(2, 16)")
    with pytest.raises(ValueError, match="sample_rate"):
        Audio(np.zeros(3, np.float32), 24000.5)
    assert type(Audio(np.zeros(3, np.float32), np.int64(16000)).sample_rate) is int
