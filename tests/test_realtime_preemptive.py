"""Preemptive responses on the real tiny families (Silero VAD, Whisper, Qwen3, Qwen3-TTS), at random: answers start
at pauses on the speculative transcript; a turn that goes on, a clear, a barge-in or the session's end drops them
with nothing emitted, and every model slot and session table is empty afterwards. The turn's own answer is the
held one when the turn ends at its pause."""

from __future__ import annotations

import random

import anyio
import numpy as np
import pytest
from realtime_fixtures import espeak

from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.family import ModelKind
from omni_stream.realtime.agent.events import (
    InputAudioAppend,
    InputAudioClear,
    ResponseCancel,
    SessionPatch,
    SessionUpdate,
    TurnDetection,
)
from omni_stream.realtime.agent.outputs import AdoptResponse, CancelResponse, StartResponse
from omni_stream.realtime.agent.session import RealtimeSession, SessionClose
from omni_stream.realtime.settings import Settings
from omni_stream.turns.vad import VadParams

RATE = 24000
CHUNK = RATE // 10
ROUNDS = 8


@pytest.fixture(scope="module")
def paths():
    from tiny_models import tiny_asr, tiny_lm, tiny_tts

    return {"tts": tiny_tts(), "lm": tiny_lm(), "asr": tiny_asr()}  # the embedded defaults, built once per machine


@pytest.fixture(scope="module")
def words() -> list[np.ndarray]:
    return [espeak(w) for w in ("Hello there", "what is the weather", "like in Paris", "today")]


def silence(ms: int) -> np.ndarray:
    return np.zeros(RATE * ms // 1000, np.int16)


async def load(paths) -> AsyncEngine:
    sources = {
        "tts": ModelSource(paths["tts"]),
        "lm": ModelSource(paths["lm"], kind=ModelKind.TEXT),
        "asr": ModelSource(paths["asr"], kind=ModelKind.TRANSCRIPTION),
    }
    return await AsyncEngine.load(sources, progress=False)


async def until(condition, seconds: float) -> None:
    """Poll ``condition()`` (state worker threads change) every 10 ms for at most ``seconds``."""
    for _ in range(int(seconds * 100)):
        if condition():
            return
        await anyio.sleep(0.01)
    raise AssertionError("timed out")


async def settle(session: RealtimeSession) -> None:
    """Until the turn detector has heard (and judged) everything sent, no speculative transcript is being written and
    every held answer has read what it may read."""
    p = session.protocol

    def busy() -> bool:
        detector = session.detector
        behind = p._heard < p.buffer.end or (detector is not None and detector.judging)
        return behind or bool(session._transcriptions) or any(not h.holding.is_set() for h in session._held.values())

    await until(lambda: not busy(), 60)


@pytest.mark.parametrize("seed", [0, 1])
async def test_random_turns_drop_preemptive_answers_unseen_and_free_everything(paths, words, seed):
    rng = random.Random(seed)
    engine = await load(paths)
    settings = Settings(enable_benchmark_fields=True, realtime_transcription_max_tokens=16)
    commands: list = []
    events: list = []
    async with engine:
        session = RealtimeSession(engine, settings)
        execute = session._execute

        def spy(cmds):
            commands.extend(cmds)
            return execute(cmds)

        session._execute = spy  # type: ignore[method-assign]
        async with session, anyio.create_task_group() as tg:

            async def read() -> None:
                async for event in session.outgoing:
                    if isinstance(event, SessionClose):
                        return
                    events.append(event)

            tg.start_soon(read)

            async def say(audio: np.ndarray) -> None:
                for i in range(0, audio.size, CHUNK):
                    await session.client_event(InputAudioAppend(None, audio[i : i + CHUNK].tobytes()))

            td = TurnDetection(VadParams(silence_duration_ms=1000))  # gaps of up to 700 ms are pauses
            await session.client_event(SessionUpdate(None, SessionPatch(turn_detection=td, max_output_tokens=6)))
            for _ in range(ROUNDS):
                await say(silence(300))
                for _ in range(rng.randint(1, 3)):
                    await say(rng.choice(words))
                    await say(silence(rng.randint(300, 700)))
                    await settle(session)
                ending = rng.choice(["turn", "turn", "clear", "barge", "cancel"])
                if ending == "clear":
                    await session.client_event(InputAudioClear(None))
                    continue
                await say(silence(1200))  # the turn ends at its last pause
                await until(lambda: not session.protocol.pending, 60)
                if ending == "cancel":
                    await session.client_event(ResponseCancel(None))
                elif ending == "barge":
                    await say(rng.choice(words))
                    await say(silence(1200))
                await until(lambda: session.protocol.response is None, 120)
            await say(rng.choice(words))
            await say(silence(400))
            await settle(session)  # the session ends while an answer may be held
            tg.cancel_scope.cancel()
        live = session.live()
    starts = [c for c in commands if isinstance(c, StartResponse)]
    preemptive = {c.response_id for c in starts if c.preemptive}
    adopted = {c.preemptive_id for c in commands if isinstance(c, AdoptResponse)}
    cancelled = {c.response_id for c in commands if isinstance(c, CancelResponse)} & preemptive
    assert adopted and cancelled, (len(preemptive), adopted, cancelled)  # both happened
    assert adopted | cancelled <= preemptive and not adopted & cancelled
    # nothing of a preemptive run ever reached the client under its own id
    for event in events:
        ids = {event.body.get("response_id"), (event.body.get("response") or {}).get("id")}
        assert not ids & preemptive, event.type
    # every response the client heard of was created, after a commit, before any of its output
    created: set[str] = set()
    committed = 0
    for event in events:
        if event.type == "input_audio_buffer.committed":
            committed += 1
        elif event.type == "response.created":
            assert committed, "a response before any committed turn"
            created.add(event.body["response"]["id"])
        elif "response_id" in event.body and event.type.startswith("response."):
            assert event.body["response_id"] in created, event.type
    assert all(v == 0 for v in live.values()), live
    models = engine.models
    for kind in (ModelKind.SPEECH, ModelKind.TEXT, ModelKind.TRANSCRIPTION):
        scheduler = models.get(kind).scheduler
        await until(lambda s=scheduler: not any(s.live().values()), 10)
    assert models.text().runner.num_active == 0
