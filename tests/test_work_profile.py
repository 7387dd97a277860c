"""The device worker's time by piece of work (omni_stream.runtime.work_profile): sums over hand-made logs, and the
log of a real engine (the tiny Qwen3-TTS) whose pieces tile the window with the worker's idle time."""

from __future__ import annotations

import pytest

from omni_stream.device_policy import WorkClass
from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.models.qwen3_tts.checkpoint import write_tiny_checkpoint
from omni_stream.requests import SpeechRequest
from omni_stream.runtime.work_profile import work_profile
from omni_stream.worker import WorkRecord

RT = WorkClass.REALTIME


def log(*entries: tuple[float, str, str]) -> list[WorkRecord]:
    return [WorkRecord(seq, kind, name, RT, (), at) for seq, (at, kind, name) in enumerate(entries)]


LOG = log((0.0, "idle", ""), (1.0, "step", "talker"), (1.5, "batch", "codec"), (2.0, "idle", ""), (3.0, "step", "lm"))


def test_each_piece_lasts_until_the_next_entry_and_the_last_until_the_windows_end():
    profile = work_profile(LOG, 0.0, 4.0)
    seconds = {(s.kind, s.name): s.seconds for s in profile.shares}
    assert seconds == {("idle", ""): 2.0, ("step", "talker"): 0.5, ("batch", "codec"): 0.5, ("step", "lm"): 1.0}
    assert profile.span_s == 4.0 and profile.idle_s == 2.0 and profile.busy_fraction == 0.5
    assert profile.shares[0].kind == "idle"  # the longest first
    summary = profile.summary()
    assert summary["seconds"] == {"idle": 2.0, "step:lm": 1.0, "batch:codec": 0.5, "step:talker": 0.5}
    assert summary["counts"]["idle"] == 2


def test_a_window_cuts_the_pieces_at_its_edges():
    profile = work_profile(LOG, 1.25, 2.5)  # inside talker's step to inside the second idle
    seconds = {(s.kind, s.name): s.seconds for s in profile.shares}
    assert seconds == {("step", "talker"): 0.25, ("batch", "codec"): 0.5, ("idle", ""): 0.5}
    assert profile.span_s == 1.25


def test_a_window_before_the_first_entry_begins_at_it_and_an_empty_one_is_empty():
    later = log((2.0, "step", "lm"), (3.0, "idle", ""))
    profile = work_profile(later, 0.0, 4.0)  # nothing known before 2.0
    assert profile.span_s == 2.0 and profile.busy_fraction == 0.5
    assert work_profile(later, 0.0, 1.0).shares == ()
    with pytest.raises(ValueError):
        work_profile(later, 2.0, 1.0)


def test_a_window_after_a_previous_one_says_whether_the_log_dropped_entries_between():
    assert work_profile(LOG[3:], 2.0, 4.0, after_seq=2).complete
    assert not work_profile(LOG[4:], 2.0, 4.0, after_seq=2).complete  # entry 3 fell out of the log
    assert {s.name for s in work_profile(LOG, 0.0, 4.0, after_seq=2).shares} == {"", "lm"}  # read ones skipped


@pytest.mark.asyncio
async def test_a_real_engines_log_tiles_a_speech_requests_window_with_its_steps_and_idle_time(tmp_path):
    import time

    checkpoint = write_tiny_checkpoint(tmp_path / "tts", "custom_voice", "0.6b", seed=1)
    async with await AsyncEngine.load({"tts": ModelSource(checkpoint)}, progress=False, record=True) as engine:
        start = time.perf_counter()
        request = SpeechRequest("Hello there.", max_new_tokens=6, ignore_eos=True)
        async with engine.speech(request) as stream:
            async for _ in stream:
                pass
        end = time.perf_counter()
        profile = work_profile(engine.worker.log, start, end)
    counts = {(s.kind, s.name): s.count for s in profile.shares}
    assert counts[("step", "talker")] >= 6  # a step per frame, at least
    assert ("idle", "") in counts  # idle before the request came (the piece running at the window's start)
    assert sum(s.seconds for s in profile.shares) == pytest.approx(profile.span_s)
    assert 0.0 < profile.busy_fraction < 1.0 and profile.complete
    steps = [r.rows for r in engine.worker.log if r.kind == "step" and r.name == "talker" and start <= r.at <= end]
    assert steps[0] == (1, 0)  # the request's prefill, alone ...
    assert all(rows == (0, 1) for rows in steps[1:6])  # ... then its frames, one running row each


def test_the_benchmarks_longest_pieces_are_cut_at_the_window_and_leave_idle_out():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from worklog import longest_pieces

    pieces = longest_pieces(LOG, 1.25, 3.5, top=2)  # talker 0.25 (cut), codec 0.5, idle 1.0 (left out), lm 0.5 (cut)
    assert [p["piece"] for p in pieces] == ["batch:codec", "step:lm"]
    assert [p["ms"] for p in pieces] == [500.0, 500.0] and [p["at_ms"] for p in pieces] == [250.0, 1750.0]
    assert longest_pieces(LOG, 1.25, 3.5)[-1] == {"piece": "step:talker", "class": "realtime", "ms": 250.0,
                                                  "at_ms": 0.0}  # fmt: skip


def test_the_benchmarks_step_sequence_lists_the_pieces_in_order_with_each_steps_batch():
    import dataclasses
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from worklog import step_sequence, step_sequence_line

    steps = [dataclasses.replace(r, rows=(2, 5)) if r.name == "talker" else r for r in LOG]
    pieces = step_sequence(steps, 1.25, 3.5)
    assert pieces == [["step:talker", 250.0, 2, 5], ["batch:codec", 500.0, None, None], ["idle", 1000.0, None, None],
                      ["step:lm", 500.0, None, None]]  # fmt: skip
    assert step_sequence_line(pieces) == "talker+2/5 250.0, batch:codec 500.0, idle 1000.0, lm 500.0"
    assert step_sequence(steps, 1.25, 3.5, most=2) == pieces[:2]
