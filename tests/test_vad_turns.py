"""The server_vad turn rule as a pure function over per-chunk speech probabilities (no model)."""

from __future__ import annotations

import itertools
import random

import pytest

from omni_stream.errors import InvalidRequestError
from omni_stream.models.silero_vad.turns import TurnRule, TurnState, advance, turns
from omni_stream.turns.vad import VadEvent, VadEventKind, VadParams

STARTED, STOPPED, QUIET = VadEventKind.SPEECH_STARTED, VadEventKind.SPEECH_STOPPED, VadEventKind.SPEECH_QUIET
# 10 samples a chunk keeps the arithmetic readable: prefix 2 chunks, silence 3 chunks.
RULE = TurnRule(threshold=0.5, prefix=20, silence=30, chunk=10)


def probs(pattern: str) -> list[float]:
    """``"..##.."``: ``#`` a speech chunk (0.9), ``.`` a quiet one (0.1), ``=`` exactly the threshold."""
    return [{"#": 0.9, ".": 0.1, "=": 0.5}[c] for c in pattern]


def test_a_turn_starts_prefix_before_its_first_speech_chunk_and_stops_silence_after_its_last():
    events = turns(probs(".....###......"), RULE)
    # Speech in chunks 5-7 (samples 50-80); the turn claims 20 samples before, stops 30 after sample 80.
    assert events == [VadEvent(STARTED, 30), VadEvent(STOPPED, 110)]


def test_the_prefix_never_reaches_before_the_stream_or_the_previous_turn():
    assert turns(probs("#...."), RULE)[0] == VadEvent(STARTED, 0)
    events = turns(probs("#...#"), RULE)
    # First turn stops at 10 + 30 = 40; the second's prefix (40 - 20 = 20) is clamped to that stop.
    assert events == [VadEvent(STARTED, 0), VadEvent(STOPPED, 40), VadEvent(STARTED, 40)]


def test_dips_shorter_than_the_silence_duration_keep_the_turn_open():
    events = turns(probs("##..##..##...."), RULE)
    assert events == [VadEvent(STARTED, 0), VadEvent(STOPPED, 100 + 30)]


def test_a_chunk_at_exactly_the_threshold_is_speech():
    assert turns(probs("..=...."), RULE) == [VadEvent(STARTED, 0), VadEvent(STOPPED, 60)]


def test_zero_silence_stops_at_the_first_quiet_chunk():
    rule = TurnRule(0.5, prefix=0, silence=0, chunk=10)
    assert turns(probs("..##.#"), rule) == [
        VadEvent(STARTED, 20),
        VadEvent(STOPPED, 40),
        VadEvent(STARTED, 50),
    ]


def test_a_quiet_reports_where_the_stop_will_put_the_turns_end_before_the_silence_is_over():
    """``quiet`` (a semantic rule's): the turn's audio ends ``quiet`` after its last speech chunk; that position is
    reported once that much has passed, and the stop comes at the same position after the full silence."""
    rule = TurnRule(threshold=0.5, prefix=20, silence=30, chunk=10, quiet=10)
    state, events = advance(TurnState(), probs(".....###."), rule)
    # Speech in chunks 5-7 ends at sample 80; one quiet chunk (80-90) reaches the quiet: reported at 80 + 10.
    assert events == [VadEvent(STARTED, 30), VadEvent(QUIET, 90)]
    assert state.quieted and state.speaking
    state, events = advance(state, probs(".."), rule)
    assert events == [VadEvent(STOPPED, 90)]  # after the silence, at the quiet's position
    assert not state.quieted and state.floor == 90  # the next turn may start there


def test_speech_after_a_quiet_reports_a_start_and_the_next_quiet_moves_on():
    rule = TurnRule(threshold=0.5, prefix=20, silence=30, chunk=10, quiet=10)
    events = turns(probs("##..##...."), rule)
    # quiet at 20 + 10; speech again at chunk 4 (sample 40): the turn goes on; speech ends at 60, quiet at 70
    assert events == [VadEvent(STARTED, 0), VadEvent(QUIET, 30), VadEvent(STARTED, 40), VadEvent(QUIET, 70),
                      VadEvent(STOPPED, 70)]  # fmt: skip
    # without a quiet the same audio has one turn that stops its silence after the speech
    assert turns(probs("##..##...."), RULE) == [VadEvent(STARTED, 0), VadEvent(STOPPED, 90)]


def test_a_quiet_must_be_shorter_than_the_silence():
    VadParams(silence_duration_ms=200, quiet_ms=100)
    for quiet in (0, 200, 300):
        with pytest.raises(ValueError, match="quiet_ms"):
            VadParams(silence_duration_ms=200, quiet_ms=quiet)


def test_a_turn_still_open_at_the_end_has_no_stop_and_the_state_says_so():
    state, events = advance(TurnState(), probs("..###."), RULE)
    assert events == [VadEvent(STARTED, 0)]
    assert state == TurnState(position=60, speaking=True, speech_end=50, floor=0)


def test_judging_in_pieces_equals_judging_the_whole_stream():
    rng = random.Random(7)
    pattern = "".join(rng.choice("..#") for _ in range(400))
    whole = turns(probs(pattern), RULE)
    assert len(whole) > 10
    state, pieces = TurnState(), []
    i = 0
    while i < len(pattern):
        n = rng.randint(0, 9)
        state, events = advance(state, probs(pattern[i : i + n]), RULE)
        pieces += events
        i += n
    assert pieces == whole


def test_events_alternate_and_never_go_backwards():
    rng = random.Random(11)
    events = turns([rng.random() for _ in range(2000)], TurnRule(0.6, prefix=25, silence=15, chunk=10))
    assert [e.kind for e in events[:2]] == [STARTED, STOPPED]
    assert all(a.kind != b.kind for a, b in itertools.pairwise(events))
    assert all(a.sample <= b.sample for a, b in itertools.pairwise(events))


def test_params_convert_to_samples_at_the_model_rate():
    rule = TurnRule.of(VadParams(threshold=0.4, prefix_padding_ms=300, silence_duration_ms=500), 16000, 512)
    assert rule == TurnRule(0.4, prefix=4800, silence=8000, chunk=512)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [({"threshold": 1.0}, "threshold"), ({"prefix_padding_ms": -1}, "prefix_padding_ms"),
     ({"silence_duration_ms": 20_000}, "silence_duration_ms")],
)  # fmt: skip
def test_params_out_of_range_name_their_field(kwargs, param):
    with pytest.raises(InvalidRequestError) as err:
        VadParams(**kwargs)
    assert err.value.param == param
