"""The engine's speech bounds (pure), the frame budget on the embedded checkpoint, and the worker's threads."""

from __future__ import annotations

import anyio
import numpy as np
import pytest
import torch

from omni_stream.engine import AsyncEngine
from omni_stream.errors import InvalidRequestError, UnsupportedTaskError
from omni_stream.models.qwen3_tts.family import embedded_default_checkpoint
from omni_stream.requests import SpeechRequest, TaskType
from omni_stream.speech import limits as sl
from omni_stream.validation.speech import unsupported_task_message
from omni_stream.worker import DeviceWorker, intra_op_threads


def test_frame_budget_is_proportional_to_the_text_with_a_floor_and_a_cap():
    assert sl.frame_budget("") == sl.FRAME_FLOOR
    assert sl.frame_budget("Hi.") == 25 + 3 * 3
    assert sl.frame_budget("  Hi.  ") == sl.frame_budget("Hi.")  # counted after stripping
    assert sl.frame_budget("x" * 100) - sl.frame_budget("x" * 99) == sl.FRAMES_PER_CHAR
    assert sl.frame_budget("x" * 10_000) == sl.MAX_NEW_TOKENS
    assert sl.resolved_max_new_tokens("Hi.", None) == sl.frame_budget("Hi.")
    assert sl.resolved_max_new_tokens("Hi.", 7) == 7  # max_new_tokens overrides it


@pytest.mark.parametrize("context", [512, 2048, 4096, 32768])
def test_a_text_at_the_input_limit_fits_the_context_with_its_budget(context):
    n = sl.max_input_chars(context)
    # at most one prompt position per character, plus the template, plus the default budget
    assert n + sl.PROMPT_OVERHEAD + sl.frame_budget("x" * n) <= context
    assert (n + 1) + sl.PROMPT_OVERHEAD + sl.frame_budget("x" * (n + 1)) > context or n * 3 + 25 >= sl.MAX_NEW_TOKENS
    assert sl.MAX_INPUT_CHARS == sl.max_input_chars(sl.DEFAULT_CONTEXT) == 1001


@pytest.mark.parametrize(
    ("call", "param", "message"),
    [
        (lambda: sl.check_text(""), "input", "Input text cannot be empty"),
        (lambda: sl.check_text(" \n "), "input", "Input text cannot be empty"),
        (lambda: sl.check_text("x" * 1002), "input", "Input text too long (max 1001 characters, got 1002)"),
        (lambda: sl.check_instructions("x" * 501), "instructions", "Instructions too long (max 500 characters)"),
        (lambda: sl.check_max_new_tokens(0), "max_new_tokens", "max_new_tokens must be at least 1"),
        (lambda: sl.check_max_new_tokens(4097), "max_new_tokens", "max_new_tokens cannot exceed 4096"),
        (lambda: sl.check_max_new_tokens(True), "max_new_tokens", "must be an integer"),
        (lambda: sl.check_ref_seconds(0.5), "ref_audio", "Reference audio too short (0.5s)"),
        (lambda: sl.check_ref_seconds(31, "audio_sample"), "audio_sample", "Reference audio too long (31.0s)"),
        (lambda: sl.check_embedding([]), "speaker_embedding", "non-empty list"),
        (lambda: sl.check_embedding([1.0, float("nan")]), "speaker_embedding", "finite"),
        (lambda: sl.check_embedding(["a"]), "speaker_embedding", "numeric"),
        (lambda: sl.check_embedding([0.0] * 8193), "speaker_embedding", "8192"),
        (lambda: sl.check_embedding([0.0] * 3, dim=4), "speaker_embedding", "has 3 values"),
    ],
)
def test_bounds_raise_typed_errors_naming_the_field(call, param, message):
    with pytest.raises(InvalidRequestError) as info:
        call()
    assert info.value.param == param and message in info.value.message


def test_requests_are_checked_by_the_same_bounds():
    with pytest.raises(InvalidRequestError, match="cannot exceed 4096"):
        SpeechRequest("hi", max_new_tokens=5000)
    with pytest.raises(InvalidRequestError, match=r"max 500 characters"):
        SpeechRequest("hi", instructions="x" * 501)
    with pytest.raises(InvalidRequestError, match="cannot be empty"):
        SpeechRequest("  ")
    assert SpeechRequest("hi").max_new_tokens is None  # the budget is the family's default


def test_context_fit_shrinks_the_default_budget_and_names_the_right_field():
    assert sl.fit_context(100, 50, 4096, explicit=True) == 50
    assert sl.fit_context(4000, 500, 4096, explicit=False) == 96  # the default budget shrinks to the room left
    with pytest.raises(InvalidRequestError) as info:
        sl.fit_context(4000, 500, 4096, explicit=True)
    assert info.value.param == "max_new_tokens" and "at most 96" in info.value.message
    with pytest.raises(InvalidRequestError) as info:
        sl.fit_context(4096, 10, 4096, explicit=False)
    assert info.value.param == "input"  # the text itself leaves no room: not max_new_tokens's fault


def test_unsupported_task_words():
    assert unsupported_task_message("Qwen3-TTS", "CustomVoice", "Base") == (
        "Qwen3-TTS CustomVoice checkpoint does not support task_type='Base'. "
        "Use task_type='CustomVoice' or load the matching Base checkpoint."
    )
    many = unsupported_task_message("Synthetic", "CustomVoice", "Base", ("CustomVoice", "VoiceDesign"))
    assert "task_type='Base'" in many and "Supported: CustomVoice, VoiceDesign" in many


def test_threads_leave_the_event_loop_a_core():
    assert [intra_op_threads(n) for n in (1, 2, 4, 16, 128)] == [1, 1, 3, 15, 127]


async def test_the_worker_sets_torch_threads_when_it_starts():
    before = torch.get_num_threads()
    worker = DeviceWorker(threads=2).start()
    try:
        assert await worker.submit(torch.get_num_threads) == 2
    finally:
        await worker.aclose()
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory):
    return embedded_default_checkpoint(tmp_path_factory.mktemp("cache"))


async def test_one_sentence_on_the_embedded_default_stops_at_its_frame_budget(embedded):
    text = "Hello there, this is my first request."
    budget = sl.frame_budget(text)
    assert budget == 25 + 3 * len(text) < 200  # seconds on a CPU, not the 2048 frames of a runaway
    async with await AsyncEngine.from_pretrained(embedded, progress=False) as engine:
        async with engine.speech(text, seed=0) as stream:  # no voice, no max_new_tokens: the defaults
            samples = sum([a.n_samples async for a in stream])
            frames = stream.usage.output_tokens
    # random weights never end on their own: the budget ends it (N code-0 samples give at most N - 1 frames)
    assert 0 < frames <= budget and samples == frames * 1920
    assert frames == budget - 1, frames  # it ran to the budget: the budget is what stopped it


async def test_a_task_the_checkpoint_cannot_do_is_refused_before_anything_else(embedded):
    async with await AsyncEngine.from_pretrained(embedded, progress=False) as engine:
        with pytest.raises(UnsupportedTaskError) as info:
            # the reference audio is far too short: the task is what the answer names
            engine.speech("hi", task_type=TaskType.BASE, ref_audio=np.zeros(10, np.float32))
        assert info.value.param == "task_type"
        assert "Qwen3-TTS CustomVoice checkpoint does not support task_type='Base'" in info.value.message
        with pytest.raises(InvalidRequestError) as info:
            await anyio.to_thread.run_sync(lambda: engine.speech("x" * 1002))
        assert info.value.param == "input"


@pytest.fixture(scope="module")
def small_context(tmp_path_factory: pytest.TempPathFactory):
    """A tiny CustomVoice checkpoint whose talker holds 256 positions: limits derived from it show."""
    import json

    from omni_stream.models.qwen3_tts.checkpoint import write_tiny_checkpoint

    path = write_tiny_checkpoint(tmp_path_factory.mktemp("small"), "custom_voice", "0.6b", seed=4)
    config = json.loads((path / "config.json").read_text())
    config["talker_config"]["max_position_embeddings"] = 256
    (path / "config.json").write_text(json.dumps(config))
    return path


async def test_limits_follow_the_models_context_and_name_the_right_field(small_context):
    async with await AsyncEngine.from_pretrained(small_context, progress=False) as engine:
        family = engine.models.speech()
        assert family.runner.max_len == 256 and family.max_input_chars == sl.max_input_chars(256) == 41
        with pytest.raises(InvalidRequestError) as info:
            engine.speech("x" * 42, voice="ryan")
        assert info.value.param == "input" and "max 41 characters" in info.value.message
        with pytest.raises(InvalidRequestError) as info:  # the client's own max_new_tokens does not fit
            async with engine.speech("Hello.", voice="ryan", max_new_tokens=400) as stream:
                async for _ in stream:
                    pass
        assert info.value.param == "max_new_tokens" and "leaving room for at most" in info.value.message
        text = "A sentence of exactly forty-one chars...."
        assert len(text) == 41
        async with engine.speech(text, voice="ryan", seed=0) as stream:  # the default budget fits by construction
            async for _ in stream:
                pass
        assert 0 < stream.usage.output_tokens <= sl.frame_budget(text)
