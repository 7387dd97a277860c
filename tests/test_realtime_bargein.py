"""Barge-in, proved by the models' step logs: speech during a response releases its TTS and LLM requests before
their next step, and no audio of the response follows its ``response.done``.

Why the doubles (``realtime_doubles``, ``tests/synthetic``): the answer must still be generating when the user
speaks (forty sentences the echo LM is told to say) and the interruption's onset must be exact (the energy VAD on
tones). A barge-in on the real families is in ``test_realtime_agent_real.py``."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from openai import AsyncOpenAI
from realtime_doubles import spoken_words
from realtime_fixtures import agent_checkpoints, agent_loader, vad_factory
from serving_helpers import running_server

from omni_stream.engine import RequestStream
from omni_stream.realtime.settings import Settings

# Forty long sentences before the echo: when the user speaks, the LLM is still generating (paused at its
# watermark), and a sentence's speech request (about 45 frames) usually is too.
PREFIX = " ".join(f"Sentence {i} is right here, and it goes on for quite a while before it ends." for i in range(40))


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    checkpoints = agent_checkpoints(tmp_path_factory.mktemp("bargein"), reply_prefix=PREFIX)
    with running_server(None, Settings(vad_factory=vad_factory()), load=agent_loader(checkpoints)) as live:
        speech, text = live.engine.models.speech(), live.engine.models.text()
        speech.talker.record = text.model.record = True
        yield live


def b64(samples: np.ndarray) -> str:
    return base64.b64encode(samples.astype("<i2").tobytes()).decode()


def released_before_next_step(log: list, since: int, seqs: set[int]) -> None:
    """Each of ``seqs`` is released after ``since``, with at most one step (the one in flight) before that."""
    for seq in seqs:
        later = log[since:]
        release = later.index(("release", seq))
        steps_before = [e for e in later[:release] if e[0] == "step" and seq in (*e[1], *e[2])]
        steps_after = [e for e in later[release:] if e[0] == "step" and seq in (*e[1], *e[2])]
        assert len(steps_before) <= 1 and not steps_after, (seq, steps_before, steps_after)


async def test_speech_during_a_response_releases_its_tts_and_llm_before_their_next_step(agent, monkeypatch):
    speech, text = agent.engine.models.speech(), agent.engine.models.text()
    worker = agent.engine.worker
    snapshots: list[tuple[int, set[int], int, set[int]]] = []
    original = RequestStream.abort
    armed = False  # aborts before the answer speaks (a speculative transcript dropped at a pause) are not barge-in

    def abort(self, exc=None):
        with worker.cond:  # the state of both models at the instant of the abort
            if armed and self.pipeline != "transcription":
                snapshots.append(
                    (len(speech.talker.log), set(speech.talker.live), len(text.model.log), set(text.model.live))
                )
        original(self, exc)

    monkeypatch.setattr(RequestStream, "abort", abort)
    client = AsyncOpenAI(api_key="x", base_url=f"{agent.url}/v1", websocket_base_url=f"{agent.ws_url}/v1")
    async with client.realtime.connect(model="synthetic-lm") as conn:
        assert (await conn.recv()).type == "session.created"
        samples = spoken_words(["three"])
        for i in range(0, samples.size, 2400):
            await conn.input_audio_buffer.append(audio=b64(samples[i : i + 2400]))
        rid = None
        async for event in conn:
            if event.type == "response.output_audio.delta":
                rid = event.response_id
                break
        armed = True
        interruption = spoken_words(["four"], lead_ms=0)
        for i in range(0, interruption.size, 2400):
            await conn.input_audio_buffer.append(audio=b64(interruption[i : i + 2400]))
        events = []
        async for event in conn:
            events.append(event)
            if event.type == "input_audio_buffer.speech_stopped":
                break
    types = [e.type for e in events]
    started = types.index("input_audio_buffer.speech_started")
    done = next(i for i, e in enumerate(events) if e.type == "response.done" and e.response.id == rid)
    assert started < done and events[done].response.status == "cancelled"
    assert events[done].response.status_details.reason == "turn_detected"
    late_audio = [
        e
        for e in events[done:]
        if e.type.startswith("response.output_audio") and getattr(e, "response_id", None) == rid
    ]
    assert not late_audio
    talker_at, talker_live, lm_at, lm_live = snapshots[0]
    # The LLM is still writing the forty sentences; the TTS may be between units (the first is a short clause and
    # the next waits for the player), so it may hold no request at that instant.
    assert lm_live, "no text request was live at the barge-in"
    worker_barrier = agent.wait_idle()
    assert not any(worker_barrier.values())
    released_before_next_step(speech.talker.log, talker_at, talker_live)
    released_before_next_step(text.model.log, lm_at, lm_live)
    # The second turn may have started its own response before the connection closed: wait (bounded) for the
    # session's end to release it too.
    assert not any(agent.wait_idle(kind="text").values())
