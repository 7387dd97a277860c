"""session.truncation: a conversation never outgrows the text model. The policy over long random conversations,
counted and checked with the tiny Qwen3's own tokenizer and chat template; the wire values and their errors; and
end to end on the real tiny families, where turns of noise (a random Whisper writes at length) keep being answered."""

from __future__ import annotations

import base64
import json
import random

import numpy as np
import pytest
from openai import AsyncOpenAI
from serving_helpers import running_server

from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.family import ModelKind
from omni_stream.models.causal_lm.tokenizer import ChatTokenizer
from omni_stream.realtime.agent.events import RealtimeError, parse_client_event
from omni_stream.realtime.agent.truncation import (
    ContextExceeded,
    Truncation,
    TruncationType,
    fit,
    reply_room,
    token_bound,
)
from omni_stream.realtime.settings import Settings
from omni_stream.requests import ChatMessage, Role, TextRequest

CONTEXT = 1024  # the tiny Qwen3's positions


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    from omni_stream.models.causal_lm.checkpoint import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("lm"))


@pytest.fixture(scope="module")
def tokenizer(lm_dir) -> ChatTokenizer:
    return ChatTokenizer(lm_dir)


def babble(rng: random.Random, words: int) -> str:
    return " ".join(
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 9))) for _ in range(words)
    )


@pytest.mark.parametrize(
    "truncation",
    [Truncation(), Truncation(TruncationType.RETENTION_RATIO, 0.5), Truncation(TruncationType.RETENTION_RATIO, 0.0)],
)
def test_long_random_conversations_always_fit_and_keep_the_instructions(tokenizer, truncation):
    rng = random.Random(7)
    instructions = ChatMessage(Role.SYSTEM, "You are a helpful voice assistant. " + babble(rng, 20))
    history: list[ChatMessage] = []
    dropped_turns = 0
    for turn in range(60):
        role = Role.USER if turn % 2 == 0 else Role.ASSISTANT
        history.append(ChatMessage(role, babble(rng, rng.randint(1, 60))))
        messages = [instructions, *history]
        max_tokens = rng.choice([None, 16, 100])
        kept = fit(messages, [tokenizer.count(m.content) for m in messages], CONTEXT, max_tokens, truncation)
        assert kept[0] is instructions and kept[-1] is history[-1]
        assert kept[1:] == history[len(history) - len(kept) + 1 :]  # the oldest went first, order kept
        prompt = len(tokenizer.encode(TextRequest(messages=tuple(kept))))
        assert prompt + reply_room(max_tokens, CONTEXT) <= CONTEXT, (turn, prompt)
        dropped_turns = max(dropped_turns, len(messages) - len(kept))
    assert dropped_turns > 10  # the conversation did outgrow the context, many times over


def test_the_token_bound_is_never_below_the_tokenizers_count(tokenizer):
    """What lets a prompt be fitted on the loop without tokenizing: the bound holds for random text and for the
    characters that normalization grows most (U+FDFA, ligatures, combining marks, emoji, CJK)."""
    rng = random.Random(3)
    hard = ["\ufdfa", "\ufb01", "e\u0301", "\U0001f600", "\u4e2d\u6587", "\u3300", "\u00bd", " ", ""]
    texts = [babble(rng, rng.randint(0, 40)) for _ in range(50)]
    texts += ["".join(rng.choice(hard) for _ in range(rng.randint(1, 30))) for _ in range(50)]
    texts += [chr(rng.randint(0x20, 0x2FFFF)) * rng.randint(1, 5) for _ in range(200)]
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            continue  # a lone surrogate: no wire text carries one
        assert tokenizer.count(text) <= token_bound(text), repr(text)


def test_only_a_newest_turn_too_long_for_the_context_fails_and_disabled_fails_at_once(tokenizer):
    rng = random.Random(1)
    system = ChatMessage(Role.SYSTEM, "Be brief.")
    old = [ChatMessage(Role.USER, babble(rng, 150)) for _ in range(4)]
    huge = ChatMessage(Role.USER, babble(rng, 900))

    def count(ms):
        return [tokenizer.count(m.content) for m in ms]

    with pytest.raises(ContextExceeded, match="newest turn alone"):
        fit([system, *old, huge], count([system, *old, huge]), CONTEXT, None, Truncation())
    small = ChatMessage(Role.USER, "hello")
    assert fit([system, *old, small], count([system, *old, small]), CONTEXT, None, Truncation())[-1] is small
    with pytest.raises(ContextExceeded, match="disabled"):
        fit([system, *old, small], count([system, *old, small]), CONTEXT, None, Truncation(TruncationType.DISABLED))
    # the tools' schemas take their part of the context, and the message says how much of it
    with pytest.raises(ContextExceeded, match=f"context of {CONTEXT} tokens, {CONTEXT - 40} of which the tools'"):
        fit([system, small], count([system, small]), CONTEXT, None, Truncation(), tools=CONTEXT - 40)


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ("sometimes", "session.truncation"),
        ({"type": "oldest"}, "session.truncation.type"),
        ({"type": "retention_ratio", "retention_ratio": 1.5}, "session.truncation.retention_ratio"),
        ({"type": "retention_ratio"}, "session.truncation.retention_ratio"),
        ({"type": "retention_ratio", "retention_ratio": 0.5, "token_limits": {}}, "session.truncation.token_limits"),
    ],
)
def test_bad_truncation_values_are_errors_naming_the_field(value, param):
    with pytest.raises(RealtimeError) as err:
        parse_client_event(json.dumps({"type": "session.update", "session": {"truncation": value}}))
    assert err.value.code == "invalid_value" and err.value.param == param


def test_truncation_values_parse():
    for value, expected in [
        ("auto", Truncation()),
        ("disabled", Truncation(TruncationType.DISABLED)),
        ({"type": "retention_ratio", "retention_ratio": 0.25}, Truncation(TruncationType.RETENTION_RATIO, 0.25)),
    ]:
        event = parse_client_event(json.dumps({"type": "session.update", "session": {"truncation": value}}))
        assert event.patch.truncation == expected and expected.wire() == value


# --- end to end ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def agent(tmp_path_factory, lm_dir):
    from omni_stream.models.qwen3_tts.checkpoint import write_tiny_checkpoint as tiny_tts
    from omni_stream.models.whisper.checkpoint import write_tiny_checkpoint as tiny_whisper

    root = tmp_path_factory.mktemp("truncation")
    tts, asr = tiny_tts(root / "tts"), tiny_whisper(root / "asr")

    async def load() -> AsyncEngine:
        sources = {
            "tts": ModelSource(tts),
            "lm": ModelSource(lm_dir, kind=ModelKind.TEXT),
            "asr": ModelSource(asr, kind=ModelKind.TRANSCRIPTION),
        }
        return await AsyncEngine.load(sources, progress=False)

    with running_server(None, Settings(enable_benchmark_fields=True), load=load) as live:  # default bounds
        yield live


async def turn(conn, noise: np.ndarray) -> object:
    await conn.input_audio_buffer.append(audio=base64.b64encode(noise.astype("<i2").tobytes()).decode())
    await conn.input_audio_buffer.commit()
    await conn.response.create()
    async for event in conn:
        assert event.type != "error", event
        if event.type == "response.done":
            return event.response
    raise AssertionError("closed")


async def test_turns_of_noise_are_answered_turn_after_turn_and_disabled_truncation_fails_by_name(agent):
    rng = np.random.default_rng(0)
    model = agent.engine.models.text().info.model_name
    client = AsyncOpenAI(api_key="x", base_url=f"{agent.url}/v1", websocket_base_url=f"{agent.ws_url}/v1")
    async with client.realtime.connect(model=model) as conn:
        await conn.recv(), await conn.recv()
        session = {"type": "realtime", "output_modalities": ["text"], "max_output_tokens": 8}
        await conn.session.update(session={**session, "audio": {"input": {"turn_detection": None}}})
        assert (await conn.recv()).type == "session.updated"
        for _ in range(5):  # each turn: 1 s of noise, which the random Whisper writes up to its bound
            done = await turn(conn, rng.integers(-8000, 8000, 24000))
            assert done.status == "incomplete" and done.status_details.reason == "max_output_tokens", done
        await conn.session.update(session={"truncation": "disabled"})
        updated = await conn.recv()
        assert updated.type == "session.updated" and updated.session.truncation == "disabled"
        done = await turn(conn, rng.integers(-8000, 8000, 24000))
    assert done.status == "failed"
    assert done.status_details.error.code == "context_length_exceeded"
    assert "truncation is disabled" in done.status_details.error.message


async def counting_engine(lm_dir) -> tuple[AsyncEngine, list[str]]:
    """An engine on the tiny Qwen3 whose token counting notes every text it counts (in the list returned)."""
    engine = await AsyncEngine.load({"lm": ModelSource(lm_dir, kind=ModelKind.TEXT)}, progress=False)
    counted: list[str] = []
    count = engine.count_text_tokens

    def counting(text: str, kind: str = ModelKind.SPEECH) -> int:
        counted.append(text)
        return count(text, kind)

    engine.count_text_tokens = counting  # type: ignore[method-assign]
    return engine, counted


async def test_a_sessions_prompts_count_each_message_text_once(lm_dir, tokenizer):
    """Every response's prompt is fitted from every message's token count: a growing conversation's earlier messages
    are counted once per session, not once per response, and the counts are the tokenizer's."""
    from omni_stream.realtime.agent.outputs import StartResponse
    from omni_stream.realtime.agent.session import RealtimeSession

    rng = random.Random(7)
    engine, counted = await counting_engine(lm_dir)
    async with engine, RealtimeSession(engine, Settings()) as session:
        messages = [ChatMessage(Role.SYSTEM, "Be brief.")]
        for turn_no in range(6):
            messages += [ChatMessage(Role.USER, babble(rng, 12)), ChatMessage(Role.ASSISTANT, babble(rng, 6))]
            cmd = StartResponse(f"resp{turn_no}", tuple(messages), speak=False, voice=None, max_tokens=16)
            assert session._fit(cmd) == tuple(messages)  # all fit
        assert sorted(counted) == sorted({m.content for m in messages})  # each text once
        assert session._token_counts == {m.content: tokenizer.count(m.content) for m in messages}


async def test_a_prompt_that_fits_even_at_its_bounds_is_kept_without_tokenizing(lm_dir):
    """A new turn's answer does not wait for a thread to count its transcript when the conversation fits even with
    each uncounted text at its bound: the same messages as the exact fit, and nothing tokenized. Near the context
    the exact counts decide (None)."""
    from omni_stream.realtime.agent.outputs import StartResponse
    from omni_stream.realtime.agent.session import RealtimeSession

    engine, counted = await counting_engine(lm_dir)
    async with engine, RealtimeSession(engine, Settings()) as session:
        short = (ChatMessage(Role.SYSTEM, "Be brief."), ChatMessage(Role.USER, "What time is it?"))
        cmd = StartResponse("r1", short, speak=False, voice=None, max_tokens=16)
        assert session._fit_unread(cmd) == short and counted == []
        assert session._fit(cmd) == short  # the exact fit agrees
        counted.clear()
        rng = random.Random(5)
        long = (*short, ChatMessage(Role.USER, babble(rng, 40)))  # ~250 bytes: bounds past the 1024 positions
        cmd = StartResponse("r2", long, speak=False, voice=None, max_tokens=16)
        assert session._fit_unread(cmd) is None and counted == []
        assert session._fit(cmd) == long and counted == [long[-1].content]  # counted (the new text alone), it fits
        assert session._fit_unread(cmd) == long  # now every text has its exact count
