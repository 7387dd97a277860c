"""benchmarks/voice_bench.py --smoke end to end on CPU: its own server process, real WebSocket sessions, JSON out."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "voice_bench.py"


def test_the_smoke_run_measures_voice_to_voice_its_split_and_barge_in(tmp_path):
    out = tmp_path / "voice.json"
    out_args = ["--append-ms", "40", "--out", str(out)]  # appends of 40 ms, not the default 100: a WebRTC-like client
    env = {**os.environ, "GIT_COMMIT": "test", "OMNI_STREAM_TRANSCRIPTION_WINDOW_MS": "8000"}
    proc = subprocess.run(
        # benchmark fields on (a bounded reply), and the first spoken unit bounded at 3 of the synthetic LM's word
        # tokens (its reply's first clause, "Here is sentence 0 of the answer,", has 7)
        [sys.executable, str(BENCH), "--smoke", "--max-output-tokens", "300", "--first-unit-tokens", "3", *out_args],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["mode"] == "cpu" and report["smoke"] and report["git_commit"] == "test"
    assert report["complete"]  # rewritten after every level; the last write marks the run whole
    assert report["settings"]["append_ms"] == 40
    assert "transcription_window_ms=8000" in report["settings"]["tuning"].split()  # the server's switches, recorded
    matrix = {(lv["turns"], lv["arrivals"], lv["concurrency"], lv["round"]) for lv in report["levels"]}
    assert matrix == {
        (t, a, n, r)
        for t in ("server_vad", "semantic_vad")
        for a in ("at-once", "random")
        for n in (1, 2)
        for r in ("cold", "warm")
    }
    for level in report["levels"]:
        assert level["answered"] == level["sessions"] and level["interrupted"] == level["sessions"], level
        assert not level["failures"] and not level["error_events"], level
        v2v = level["voice_to_voice_ms"]
        if level["turns"] == "server_vad":
            # the detector needs silence_duration_ms of silence before it ends a turn: no answer can come sooner
            assert report["settings"]["silence_duration_ms"] <= v2v["p50"] <= v2v["max"]
        assert level["server_voice_to_voice_ms"]["p50"] < v2v["p50"]
        parts = level["split_ms"]
        assert all(parts[p]["p50"] is not None and parts[p]["p50"] >= 0 for p in parts)
        # the parts are consecutive: at one session they add up to the whole delay
        if level["concurrency"] == 1:
            assert abs(sum(parts[p]["p50"] for p in parts) - v2v["p50"]) < 1.0, level
        assert level["barge_in_ms"]["p50"] is not None
        assert level["first_clause_words"]["p50"] == level["first_clause_words"]["max"] == 3, level
        assert 0 <= level["mic_late_ms"]["p50"] <= level["mic_late_ms"]["max"], level
        lag = level["work"]["loop_lag"]
        assert lag["mean_ms"] is not None and 0 <= lag["mean_ms"] <= lag["max_ms"], lag
        work = level["work"]  # the server's worker while the level ran: the talker stepped, the LM too
        assert work["complete"] and 0 < work["busy_fraction"] < 1, work
        assert work["counts"]["step:talker"] > 0 and any(
            k.startswith("step:") and k != "step:talker" for k in work["counts"]
        )
        assert abs(sum(work["seconds"].values()) - work["span_s"]) < 0.01 * len(work["seconds"])  # rounded to ms
        turns = work["turns"]  # the feeds of turn detection ran on their own threads
        assert turns["jobs"] > 0 and turns["wait_ms_mean"] >= 0 and turns["run_ms_mean"] >= 0, turns
        assert turns["wait_ms_max"] >= turns["wait_ms_mean"], turns
        assert work["prepare"]["jobs"] >= 0  # the prompts' threads (the synthetic LM builds none there)
        encoder = work["asr_encoder"]  # the doubles' ASR has no encoder: none counted (the GPU mode's Whisper does)
        assert encoder == {"calls": 0, "utterances": 0}, encoder
        turn_model = level["turn_model"]  # semantic_vad: every turn ended at a pause the model judged
        if level["turns"] == "semantic_vad":
            assert turn_model["judged"] >= level["sessions"], turn_model
            assert all(turn_model[f"{p}_ms_mean"] >= 0 for p in ("wait", "run", "cpu")), turn_model
            # a bucket bound over the mean (95 % of the calls fall under it)
            assert turn_model["run_ms_p95_under"] >= turn_model["run_ms_mean"], turn_model
            assert turn_model["wait_ms_p95_under"] >= turn_model["wait_ms_mean"], turn_model
        else:
            assert turn_model == {"judged": 0, "wait_ms_mean": None, "run_ms_mean": None, "cpu_ms_mean": None,
                                  "wait_ms_p95_under": None, "run_ms_p95_under": None}  # fmt: skip
        # the server's timeline of the answered turn, placed against the client's marks: every session's turn was
        # stopped, committed and answered, the answer's audio queued before the client got it
        timeline = level["timeline"]
        for name in ("event:input_audio_buffer.speech_stopped", "event:input_audio_buffer.committed",
                     "lm:submitted", "engine:audio", "audio:queued", "client:first_audio"):  # fmt: skip
            assert timeline[name]["sessions"] == level["sessions"], (name, timeline)
        order = list(timeline)  # by median
        assert order.index("event:input_audio_buffer.speech_stopped") < order.index("audio:queued"), order
        assert timeline["audio:queued"]["p50"] <= timeline["client:first_audio"]["p50"] == v2v["p50"], timeline
        phases = level["phases"]  # what the worker did between the turn's steps: consecutive windows from speech end
        assert phases and phases[0]["from"] == "speech_end" and phases[-1]["to"] == "engine:audio", phases
        assert all(a["to"] == b["from"] for a, b in itertools.pairwise(phases)), phases
        assert all(0 <= p["busy_fraction"] <= 1 and 1000 * p["span_s"] <= p["ms"] + 1 for p in phases), phases
        # Each phase's pieces in order; the models' steps carry their batch (newcomers, running rows): the
        # answer's first step admits it.
        answer = next(p for p in phases if p["from"] == "lm:submitted")["steps"]
        steps = [s for s in answer if s[0].startswith("step:")]
        assert steps and all(s[2] is not None and s[2] + s[3] >= 1 for s in steps), answer
        assert any(s[2] >= 1 for s in steps) and {s[0] for s in steps} >= {"step:lm", "step:talker"}, answer
    assert "barge p50" in proc.stdout and "semantic_vad" in proc.stdout and "worker busy" in proc.stdout
    assert "pauses judged" in proc.stdout and "turn detection threads" in proc.stdout and "ASR encoder" in proc.stdout
    assert (
        "first spoken unit: 3 words" in proc.stdout
        and "server loop late by" in proc.stdout
        and report["settings"]["first_unit_tokens"] == 3
        and "server timeline, ms after speech end" in proc.stdout
        and "the device worker in each phase" in proc.stdout
    )


def test_the_recorded_utterances_are_one_turn_each_for_the_silero_vad():
    """GPU mode speaks benchmarks/speech/*.wav to silero (it hears no speech in the doubles' tones)."""
    import numpy as np

    from omni_stream.models.silero_vad import SileroVad
    from omni_stream.turns.vad import VadEventKind, VadParams

    sys.path.insert(0, str(BENCH.parent))
    import importlib

    from voice_bench import CHUNK, RATE, SILERO, recorded

    module, _, attr = SILERO.partition(":")  # what the GPU runs pass the server as its VAD factory
    assert getattr(importlib.import_module(module), attr) is SileroVad

    for name in ("question", "interruption"):
        speech = recorded(name)
        assert 0.5 < speech.size / RATE < 3.0
        audio = np.concatenate([np.zeros(3 * CHUNK, np.int16), speech, np.zeros(RATE, np.int16)])
        vad = SileroVad(VadParams(silence_duration_ms=500, prefix_padding_ms=300), RATE)
        events = [e for i in range(0, audio.size, CHUNK) for e in vad.feed(audio[i : i + CHUNK])]
        assert [e.kind for e in events] == [VadEventKind.SPEECH_STARTED, VadEventKind.SPEECH_STOPPED], name


def test_a_levels_rounds_are_one_cold_then_warm_ones():
    sys.path.insert(0, str(BENCH.parent))
    from voice_bench import round_names

    assert round_names(1) == ["cold"]
    assert round_names(2) == ["cold", "warm"]
    assert round_names(4) == ["cold", "warm", "warm2", "warm3"]
    with pytest.raises(SystemExit, match="--rounds"):
        round_names(0)


def test_a_levels_rounds_are_summarised_by_their_v2v_p95():
    sys.path.insert(0, str(BENCH.parent))
    from voice_bench import round_summary, summary_lines

    def level(n: int, p95: float | None) -> dict:
        return {"turns": "semantic_vad", "arrivals": "at-once", "concurrency": n, "voice_to_voice_ms": {"p95": p95}}

    levels = [level(1, 310.0), level(16, 700.0), level(16, 600.0), level(16, 530.0), level(32, None), level(32, 9.0)]
    summary = round_summary(levels)
    # one round of 1 session, and a level with an unanswered round (no p95), are not summarised
    assert summary == [{"turns": "semantic_vad", "arrivals": "at-once", "sessions": 16, "rounds": 3,
                        "v2v_p95_mean_ms": 610.0, "v2v_p95_min_ms": 530.0, "v2v_p95_max_ms": 700.0}]  # fmt: skip
    assert "16 sessions: v2v p95 over 3 rounds mean 610.0 ms (min 530.0, max 700.0)" in summary_lines(summary)
