"""Speculative work at pauses, in a session driven against a real engine (the tiny random Whisper; Silero VAD from
its wheel): the turn is transcribed at each pause; the transcript the client gets for the committed turn is a
transcription of exactly the committed audio, and nothing speculative reaches the client before the commit."""

from __future__ import annotations

import anyio
import numpy as np
import pytest
from realtime_fixtures import espeak

from omni_stream.chunks import TextDelta
from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.family import ModelKind
from omni_stream.realtime.agent.events import InputAudioAppend, SessionPatch, SessionType, SessionUpdate, TurnDetection
from omni_stream.realtime.agent.outputs import CancelTranscription, Transcribe
from omni_stream.realtime.agent.session import RealtimeSession, _asr_input
from omni_stream.realtime.settings import Settings
from omni_stream.runtime.settings import Tuning
from omni_stream.transcription.spec import TranscriptionRequest
from omni_stream.turns.vad import VadParams

RATE = 24000
MAX_TOKENS = 24  # a random Whisper never ends a transcript on its own


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory):
    from omni_stream.models.whisper.checkpoint import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("whisper"))


def silence(ms: int) -> np.ndarray:
    return np.zeros(RATE * ms // 1000, np.int16)


async def transcribe(engine: AsyncEngine, samples: np.ndarray) -> str:
    """A transcription of ``samples`` (int16 at 24 kHz) on its own, as the session asks for one."""
    rate = engine.models.get(ModelKind.TRANSCRIPTION).info.sample_rate
    request = TranscriptionRequest(_asr_input(samples, rate), rate, max_tokens=MAX_TOKENS)
    parts = []
    async with engine.generate(request) as stream:
        async for out in stream:
            if isinstance(out.chunk, TextDelta):
                parts.append(out.chunk.text)
    return "".join(parts).strip()


@pytest.mark.parametrize("window_ms", [None, 4000], ids=["whole-window", "short-windows"])
async def test_the_committed_transcript_is_the_speculation_at_the_pause_and_equals_a_whole_transcription(
    whisper_dir, window_ms
):
    """Also with shorter encoder windows (``transcription_window_ms``): the speculation, the commit and a whole
    transcription are each encoded in the turn's own window, so they still agree."""
    tuning = Tuning(transcription_window_ms=window_ms)
    sources = {"asr": ModelSource(whisper_dir, kind=ModelKind.TRANSCRIPTION)}
    engine = await AsyncEngine.load(sources, progress=False, tuning=tuning)
    settings = Settings(realtime_transcription_max_tokens=MAX_TOKENS)
    audio = np.concatenate(
        [silence(300), espeak("What is the weather like in"), silence(600), espeak("Paris today?"), silence(1500)]
    )
    async with engine:
        async with RealtimeSession(engine, settings, session_type=SessionType.TRANSCRIPTION) as session:
            commands: list = []
            committed: list[np.ndarray] = []
            execute, commit = session._execute, session.protocol._commit_samples

            def record_commands(cmds):
                commands.extend(cmds)
                return execute(cmds)

            def record_commit(samples, item_id, spec=None):
                committed.append(samples.copy())
                return commit(samples, item_id, spec)

            session._execute = record_commands  # type: ignore[method-assign]
            session.protocol._commit_samples = record_commit  # type: ignore[method-assign]
            vad = TurnDetection(
                VadParams(silence_duration_ms=1000)
            )  # the gap inside the sentence is a pause, not an end
            await session.client_event(SessionUpdate(None, SessionPatch(turn_detection=vad)))
            events = []
            with anyio.fail_after(60):
                for i in range(0, audio.size, RATE // 10):
                    await session.client_event(InputAudioAppend(None, audio[i : i + RATE // 10].tobytes()))
                    while True:  # what the client has been sent so far
                        try:
                            events.append(session.outgoing.receive_nowait())
                        except anyio.WouldBlock:
                            break
                async for event in session.outgoing:
                    events.append(event)
                    if event.type == "conversation.item.input_audio_transcription.completed":
                        break
            live = session.live()
        types = [e.type for e in events]
        assert types.count("input_audio_buffer.committed") == 1
        commit_at = types.index("input_audio_buffer.committed")
        assert not any("transcription" in t for t in types[:commit_at])  # nothing speculative before the commit
        item_id = events[commit_at].body["item_id"]
        assert all(e.body.get("item_id", item_id) == item_id for e in events)  # no speculation's id ever went out
        specs = [c for c in commands if isinstance(c, Transcribe)]
        assert len(specs) >= 2 and all(c.item_id != item_id for c in specs)  # the item itself was never sent to ASR
        assert CancelTranscription(specs[0].item_id) in commands  # the pause inside the sentence was not the end
        [samples] = committed
        assert np.array_equal(specs[-1].samples, samples)  # the last pause's speculation heard exactly the turn
        completed = events[-1].body["transcript"]
        assert completed and completed == await transcribe(engine, samples)
        assert live["engine_requests"] == 0 and live["transcriptions"] == 0
        windows = engine.models.get(ModelKind.TRANSCRIPTION).runner.encoder_windows
        # the turn (~4 s) and its margin fit 8 s: every pass ran at a short window (at the whole one when unset)
        assert set(windows) == {1500} if window_ms is None else windows and set(windows) <= {200, 400}


async def test_semantic_vad_speculates_at_the_quiet_and_its_pause_keeps_that_work(whisper_dir):
    """``semantic_vad``: the turn's transcript starts when the speech has been quiet ``QUIET_MS``, at the position
    the pause will have; the pause there keeps it (no second transcription of the same audio), and the committed
    transcript is that speculation, equal to a transcription of the whole committed audio. The session's timeline
    (benchmarks' ``realtime_trace``) marks those steps in the order they happened."""
    from omni_stream.realtime.agent.trace import SessionTraces
    from omni_stream.turns.detector import TurnEventKind
    from omni_stream.turns.rules import Eagerness, TurnType

    engine = await AsyncEngine.load({"asr": ModelSource(whisper_dir, kind=ModelKind.TRANSCRIPTION)}, progress=False)
    traces = SessionTraces()
    settings = Settings(realtime_transcription_max_tokens=MAX_TOKENS, realtime_trace=traces)
    audio = np.concatenate([silence(300), espeak("What is the weather like in Paris today?"), silence(2500)])
    audio = audio[: audio.size - audio.size % (RATE // 10)]  # whole appends
    async with engine:
        async with RealtimeSession(engine, settings, session_type=SessionType.TRANSCRIPTION) as session:
            log: list = []  # commands and turn events, in the order they happened
            committed: list[np.ndarray] = []
            execute, commit, turn_events = (
                session._execute,
                session.protocol._commit_samples,
                session.protocol.turn_events,
            )

            def record_commands(cmds):
                log.extend(("command", c) for c in cmds)
                return execute(cmds)

            def record_commit(samples, item_id, spec=None):
                committed.append(samples.copy())
                return commit(samples, item_id, spec)

            def record_turns(epoch, events, heard):
                log.extend(("turn", e) for e in events)
                return turn_events(epoch, events, heard)

            session._execute = record_commands  # type: ignore[method-assign]
            session.protocol._commit_samples = record_commit  # type: ignore[method-assign]
            session.protocol.turn_events = record_turns  # type: ignore[method-assign]
            heard_send, heard = anyio.create_memory_object_stream[int](100)
            feed_turns = session._feed_turns

            async def feed_and_tell(epoch, position, samples):
                await feed_turns(epoch, position, samples)
                heard_send.send_nowait(position + samples.size)

            session._feed_turns = feed_and_tell  # type: ignore[method-assign]
            vad = TurnDetection(type=TurnType.SEMANTIC_VAD, eagerness=Eagerness.HIGH)
            await session.client_event(SessionUpdate(None, SessionPatch(turn_detection=vad)))
            events = []
            with anyio.fail_after(60):
                for i in range(0, audio.size, RATE // 10):
                    await session.client_event(InputAudioAppend(None, audio[i : i + RATE // 10].tobytes()))
                    end = min(audio.size, i + RATE // 10)
                    # as a live client: each append heard before the next one comes (events of one feed each)
                    while await heard.receive() < end:
                        pass
                    while True:
                        try:
                            events.append(session.outgoing.receive_nowait())
                        except anyio.WouldBlock:
                            break
                done = "conversation.item.input_audio_transcription.completed"
                while events[-1].type != done:
                    events.append(await session.outgoing.receive())
            live = session.live()
        turns = [e for kind, e in log if kind == "turn"]
        kinds = [e.kind for e in turns]
        assert kinds[-3:] == [TurnEventKind.QUIET, TurnEventKind.PAUSED, TurnEventKind.STOPPED], kinds
        quiet, pause, stop = turns[-3:]
        assert quiet.position == pause.position == stop.position
        at_quiet = log.index(("turn", quiet))
        at_pause = log.index(("turn", pause))
        specs = [(i, c) for i, (kind, c) in enumerate(log) if kind == "command" and isinstance(c, Transcribe)]
        last_at, last = specs[-1]
        assert at_quiet < last_at < at_pause  # started at the quiet, before the pause
        cancelled = [c.item_id for kind, c in log if kind == "command" and isinstance(c, CancelTranscription)]
        assert last.item_id not in cancelled
        [samples] = committed
        assert np.array_equal(last.samples, samples)
        assert sum(np.array_equal(c.samples, samples) for _, c in specs) == 1  # the pause did not transcribe it again
        completed = events[-1].body["transcript"]
        assert completed and completed == await transcribe(engine, samples)
        assert live["engine_requests"] == 0 and live["transcriptions"] == 0
        [timeline] = traces.take()
        assert timeline.session_id == session.protocol.session_id and not traces.take()
        names = [name for name, _ in timeline.marks]
        times = [at for name, at in timeline.marks if name != "judge:queued"]
        assert times == sorted(times)  # marked as they happened (the judgement's queueing is back-dated)
        turn = names[len(names) - 1 - names[::-1].index("vad:quiet") :]  # from the turn's quiet on
        first = {name: turn.index(name) for name in reversed(turn)}
        steps = ["vad:quiet", "transcribe:spec", "vad:paused", "judge:stopped",
                 "event:input_audio_buffer.speech_stopped", "event:input_audio_buffer.committed"]  # fmt: skip
        assert [first[n] for n in steps] == sorted(first[n] for n in steps), turn
        done = "event:conversation.item.input_audio_transcription.completed"
        assert first["transcribe:spec"] < first["asr:spec:submitted"] < first["asr:spec:done"] <= first[done], turn
        assert "transcribe:item" not in turn  # the committed turn kept the speculation
