"""The voice-agent session driver on a real engine, without a transport: run-ahead pacing on a fake clock.

Why the synthetic TTS and echo LM (``tests/synthetic``): the run-ahead test needs an answer longer than the bound
and chunks of known length, produced faster than real time; the transcript bound runs the tiny Whisper."""

from __future__ import annotations

import contextlib

import anyio
import numpy as np
import pytest
from realtime_fixtures import agent_checkpoints, agent_loader

from omni_stream.realtime.agent.events import (
    InputAudioAppend,
    InputAudioCommit,
    ItemCreate,
    NewItem,
    NewPart,
    PartType,
    ResponseCancel,
    ResponseCreate,
)
from omni_stream.realtime.agent.session import RealtimeSession, SessionClose
from omni_stream.realtime.settings import Settings

LONG = " ".join(["Here is one more sentence of the answer, spoken slowly."] * 20)


class FakeClock:
    """A clock that moves only when the test says so; sleepers wake when it passes their time."""

    def __init__(self) -> None:
        self.t = 0.0
        self.sleepers: list[tuple[float, anyio.Event]] = []
        self._changed = anyio.Event()

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        entry = (self.t + seconds, anyio.Event())
        self.sleepers.append(entry)
        self._changed.set()
        try:
            await entry[1].wait()
        finally:
            self.sleepers.remove(entry)

    def advance(self, seconds: float) -> None:
        self.t += seconds
        for target, event in self.sleepers:
            if target <= self.t + 1e-9:
                event.set()

    async def sleeper_within(self, seconds: float) -> None:
        """Return once something sleeps until at most ``seconds`` from now."""
        while not any(target - self.t <= seconds and not ev.is_set() for target, ev in self.sleepers):
            self._changed = anyio.Event()
            await self._changed.wait()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return agent_checkpoints(tmp_path_factory.mktemp("session"))


async def drain(session: RealtimeSession, into: list, done: anyio.Event) -> None:
    async for event in session.outgoing:
        into.append(event)
        if event.type == "response.done":
            done.set()


def sent_seconds(session: RealtimeSession) -> float:
    r = session.protocol.response
    return 0.0 if r is None else r.samples / 24000


async def test_response_audio_runs_ahead_of_playback_by_the_bound_only(checkpoints):
    engine = await agent_loader(checkpoints)()
    clock = FakeClock()
    events: list = []
    try:
        session = RealtimeSession(engine, Settings(realtime_run_ahead_seconds=2.0), clock=clock)
        async with session, anyio.create_task_group() as tg:
            finished = anyio.Event()
            tg.start_soon(drain, session, events, finished)
            user = NewItem("user", (NewPart(PartType.INPUT_TEXT, text=LONG),))
            await session.client_event(ItemCreate(None, user))
            await session.client_event(ResponseCreate(None))
            largest_chunk = 8 * 1920 / 24000  # the synthetic codec's largest window (0.64 s)
            for step in range(4):
                await clock.sleeper_within(2.0)  # the pacer holds the next chunk
                lead = sent_seconds(session) - clock.now()
                assert 2.0 - 1e-6 <= lead <= 2.0 + largest_chunk, (step, lead)
                clock.advance(1.0)
            rid = session.protocol.response.id
            before = sent_seconds(session)
            await session.client_event(ResponseCancel(None))
            assert session.live()["engine_requests"] == 0  # aborted at once, before any other task ran
            await finished.wait()
            tg.cancel_scope.cancel()
        assert before < 2.0 + 4 * 1.0 + largest_chunk
        done = [e for e in events if e.type == "response.done"]
        assert done and done[0].body["response"]["status"] == "cancelled"
        after = events[events.index(done[0]) :]
        assert not [e for e in after if e.type == "response.output_audio.delta" and e.body["response_id"] == rid]
        assert not any(session.live().values())
        for _ in range(2):  # the worker frees released slots before its next step: let it get there
            await engine.worker.submit(lambda: None)
        assert not any(engine.models.text().scheduler.live().values())
        assert not any(engine.models.speech().scheduler.live().values())
    finally:
        await engine.aclose()


async def test_the_session_expires_on_its_clock(checkpoints):
    engine = await agent_loader(checkpoints)()
    clock = FakeClock()
    events: list = []
    try:
        session = RealtimeSession(engine, Settings(realtime_session_seconds=60.0), clock=clock)
        async with session:
            await clock.sleeper_within(60.0)
            clock.advance(60.0)
            async for event in session.outgoing:
                events.append(event)
                if isinstance(event, SessionClose):
                    break
        assert events[-2].body["error"]["code"] == "session_expired"
        assert events[-1] == SessionClose(1000, "session expired")
    finally:
        await engine.aclose()


@pytest.mark.parametrize("cap", [3, 5])
async def test_a_transcript_stops_at_the_configured_token_bound(tmp_path, cap):
    from omni_stream.models.whisper.checkpoint import write_tiny_checkpoint

    checkpoints = {**agent_checkpoints(tmp_path), "asr": write_tiny_checkpoint(tmp_path / "whisper")}
    engine = await agent_loader(checkpoints)()
    speech = (np.random.default_rng(0).standard_normal(24000) * 3000).astype("<i2")  # 1 s; random weights never stop
    try:
        settings = Settings(vad_factory=None, realtime_transcription_max_tokens=cap)
        async with RealtimeSession(engine, settings) as session:
            await session.client_event(InputAudioAppend(None, speech.tobytes()))
            await session.client_event(InputAudioCommit(None))
            async for event in session.outgoing:
                assert getattr(event, "type", None) != "error", event
                if event.type == "conversation.item.input_audio_transcription.completed":
                    break
        assert event.body["usage"]["output_tokens"] == cap
    finally:
        await engine.aclose()


async def test_transcript_tokens_that_waited_for_the_session_go_out_as_one_delta(tmp_path):
    """A session behind its transcription (its lock held, as by a busy event loop) sends the tokens that waited for
    it as one delta event, not one each: the deltas still join into the transcript."""
    import asyncio

    from omni_stream.family import ModelKind
    from omni_stream.models.whisper.checkpoint import write_tiny_checkpoint

    checkpoints = {**agent_checkpoints(tmp_path), "asr": write_tiny_checkpoint(tmp_path / "whisper")}
    engine = await agent_loader(checkpoints)()
    speech = (np.random.default_rng(1).standard_normal(24000) * 3000).astype("<i2")
    runner, loop, finished = (
        engine.models.get(ModelKind.TRANSCRIPTION).runner,
        asyncio.get_running_loop(),
        anyio.Event(),
    )
    step = runner.step

    def watched(batch):  # the worker's step: tell the loop when the transcript's last token is made
        outs = step(batch)
        if any(o.finished for o in outs):
            loop.call_soon_threadsafe(finished.set)
        return outs

    runner.step = watched
    cap = 20
    try:
        settings = Settings(vad_factory=None, realtime_transcription_max_tokens=cap)
        async with RealtimeSession(engine, settings) as session:
            await session.client_event(InputAudioAppend(None, speech.tobytes()))
            await session.client_event(InputAudioCommit(None))
            async with session._lock:  # the session reads nothing until the model has made every token
                with anyio.fail_after(30):
                    await finished.wait()
            deltas = []
            async for event in session.outgoing:
                assert getattr(event, "type", None) != "error", event
                if event.type == "conversation.item.input_audio_transcription.delta":
                    deltas.append(event.body["delta"])
                if event.type == "conversation.item.input_audio_transcription.completed":
                    break
        assert event.body["usage"]["output_tokens"] == cap
        assert "".join(deltas).strip() == event.body["transcript"]
        assert 1 <= len(deltas) <= cap // 2  # the tokens that fit the stages' channels, then what waited, together
    finally:
        await engine.aclose()


async def test_turn_detection_runs_on_the_loops_preparation_threads(checkpoints):
    """Every session's VAD feed goes to the loop's few turn-detection threads (with the other appends of the same
    pass), not to a thread of its own."""
    import threading

    from realtime_doubles import energy_vad

    threads: list[str] = []
    fed = threading.Event()

    class RecordingVad:
        def __init__(self, params) -> None:
            self.inner = energy_vad(params)
            self.sample_rate = self.inner.sample_rate

        def feed(self, samples):
            threads.append(threading.current_thread().name)
            fed.set()
            return self.inner.feed(samples)

        def reset(self) -> None:
            self.inner.reset()

    engine = await agent_loader(checkpoints)()
    try:
        session = RealtimeSession(engine, Settings(vad_factory=RecordingVad))
        async with session:
            for _ in range(3):
                await session.client_event(InputAudioAppend(None, np.zeros(2400, np.int16).tobytes()))
            assert await anyio.to_thread.run_sync(fed.wait, 30)
        assert threads and all(name.startswith("omni-stream-turns") for name in threads), threads
    finally:
        await engine.aclose()


@pytest.mark.parametrize("batched", [True, False], ids=["gpu-style", "onnxruntime"])
async def test_sessions_that_pause_together_share_one_end_of_turn_call_when_the_model_batches(checkpoints, batched):
    """semantic_vad with Silero and Smart Turn: a model that batches (its graph by torch, as on the GPU) is called on
    the judgement thread, where the pauses that reach it in one pass share a call (how many do depends on
    the loop's order: ``test_turn_detector`` and ``test_offload`` check the grouping itself); onnxruntime's (CPU)
    judges each pause in a call of its own, on a thread of its own. Every session's turn ends either way."""
    import threading

    from realtime_fixtures import espeak

    from omni_stream.models.silero_vad import SileroVad
    from omni_stream.models.smart_turn.graph import SmartTurnTorch
    from omni_stream.models.smart_turn.model import SmartTurn, model_path
    from omni_stream.realtime.agent.events import SessionPatch, SessionUpdate, TurnDetection
    from omni_stream.turns.rules import TurnType

    inner = SmartTurnTorch(model_path(), "cpu") if batched else SmartTurn(threads=1)
    calls: list[tuple[int, str]] = []

    class Spy:
        sample_rate, batches = inner.sample_rate, inner.batches

        def probabilities(self, turns):
            calls.append((len(turns), threading.current_thread().name))
            return inner.probabilities(turns)

        def probability(self, turn):
            return float(self.probabilities([turn])[0])

    spy = Spy()
    question = np.concatenate([espeak("What is the weather like in Paris today?"), np.zeros(2 * 24000, np.int16)])
    engine = await agent_loader(checkpoints)()
    try:
        settings = Settings(vad_factory=SileroVad, turn_model_factory=lambda: spy)
        sessions = [RealtimeSession(engine, settings) for _ in range(3)]
        stopped: set[int] = set()
        all_stopped = anyio.Event()
        async with contextlib.AsyncExitStack() as stack:
            for session in sessions:
                await stack.enter_async_context(session)
            async with anyio.create_task_group() as tg:
                for k, session in enumerate(sessions):

                    async def read(session=session, k=k) -> None:
                        async for event in session.outgoing:
                            if getattr(event, "type", "") == "input_audio_buffer.speech_stopped":
                                stopped.add(k)
                                if len(stopped) == len(sessions):
                                    all_stopped.set()

                    tg.start_soon(read)
                td = TurnDetection(type=TurnType.SEMANTIC_VAD, create_response=False)
                for session in sessions:
                    await session.client_event(SessionUpdate(None, SessionPatch(turn_detection=td)))
                for i in range(0, question.size, 2400):  # every session's 100 ms append in the same pass
                    chunk = question[i : i + 2400].tobytes()
                    async with anyio.create_task_group() as appends:
                        for session in sessions:
                            appends.start_soon(session.client_event, InputAudioAppend(None, chunk))
                with anyio.fail_after(60):
                    await all_stopped.wait()
                tg.cancel_scope.cancel()
    finally:
        await engine.aclose()
    judged = sum(n for n, _ in calls if n)
    assert judged >= 3, calls
    if batched:
        # on the judgement's own thread: never queued behind the sessions' feeds
        assert all(name.startswith("omni-stream-judge") for _, name in calls), calls
    else:
        assert all(n == 1 and not name.startswith("omni-stream") for n, name in calls), calls
