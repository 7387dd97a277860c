"""The turn detector on the real models: Silero VAD (its wheel) with Smart Turn v3.2 (pipecat-ai's wheel) for
``semantic_vad``, and ``server_vad``'s silence counted in stream samples. Speech is espeak-ng's."""

from __future__ import annotations

import numpy as np
import pytest
from realtime_doubles import energy_vad, spoken_words
from realtime_fixtures import espeak

from omni_stream.models.silero_vad import SileroVad
from omni_stream.models.smart_turn import load_smart_turn
from omni_stream.turns.detector import TurnDetector, feed_many, judge_many
from omni_stream.turns.rules import EAGERNESS, PAUSE_MS, QUIET_MS, Eagerness, TurnRule
from omni_stream.turns.vad import VadEvent, VadEventKind, VadParams

RATE = 24000
CHUNK = RATE // 10  # 100 ms feeds, as a client appends


def run(detector: TurnDetector, audio: np.ndarray) -> list[tuple[str, int, int]]:
    """(event kind, position, samples fed when it came) for ``audio`` fed 100 ms at a time."""
    out = []
    for i in range(0, audio.size, CHUNK):
        for event in [*detector.feed(audio[i : i + CHUNK]), *detector.judge()]:
            out.append((event.kind.value, event.position, detector.fed))
    return out


def silence(ms: int) -> np.ndarray:
    return np.zeros(RATE * ms // 1000, np.int16)


@pytest.fixture(scope="module")
def question() -> np.ndarray:
    return espeak("What is the weather like in Paris today?")


def semantic(eagerness: Eagerness = Eagerness.AUTO) -> TurnDetector:
    rule = TurnRule.semantic_vad(eagerness)
    return TurnDetector(rule, SileroVad(rule.vad), load_smart_turn())


def test_a_finished_question_ends_at_its_pause_without_waiting(question):
    detector = semantic()
    events = run(detector, np.concatenate([silence(300), question, silence(3000)]))
    kinds = [k for k, _, _ in events]
    assert kinds == ["started", "quiet", "paused", "stopped"], events
    _, (_, quiet, quiet_fed), (_, pause, noticed), (_, stop, decided) = events
    assert detector.probabilities[0] >= EAGERNESS[Eagerness.AUTO].threshold
    assert stop == pause  # the turn's audio ends at the pause: what was computed there is what the turn needs
    # ... and the quiet said where, a feed before the pause came: speculative work starts there
    assert quiet == pause and quiet_fed < noticed
    # the clip's last audible sample (espeak ends it with ~300 ms of near-silence): the turn keeps QUIET_MS after
    # Silero's last speech chunk, whose probability decays for a few chunks
    speech_end = (300 * RATE) // 1000 + int(np.nonzero(np.abs(question) > 300)[0][-1])
    assert QUIET_MS * RATE // 1000 < pause - speech_end < 400 * RATE // 1000
    assert decided == noticed  # the model decided at the pause, in the same feed: no waiting for more silence
    assert not detector.speaking


@pytest.fixture(scope="module")
def unfinished() -> np.ndarray:
    return espeak("What is the weather like in")


def test_an_unfinished_sentence_waits_for_the_eagerness_maximum_pause(unfinished):
    detector = semantic(Eagerness.HIGH)
    events = run(detector, np.concatenate([silence(300), unfinished, silence(3000)]))
    assert [k for k, _, _ in events] == ["started", "quiet", "paused", "stopped"], events
    assert detector.probabilities[0] < EAGERNESS[Eagerness.HIGH].threshold
    (_, _, _), (_, _, _), (_, pause, noticed), (_, stop, decided) = events
    assert stop == pause
    waited = decided - noticed
    target = (EAGERNESS[Eagerness.HIGH].max_pause_ms - PAUSE_MS) * RATE // 1000
    assert target <= waited < target + CHUNK  # counted in samples, decided at the first feed past it


def test_speech_after_a_pause_resumes_the_same_turn(unfinished):
    detector = semantic(Eagerness.MEDIUM)
    audio = np.concatenate([silence(300), unfinished, silence(700), espeak("Paris today?"), silence(4500)])
    events = run(detector, audio)
    kinds = ["started", "quiet", "paused", "resumed", "quiet", "paused", "stopped"]
    assert [k for k, _, _ in events] == kinds, events
    assert detector.probabilities[0] < 0.5  # the unfinished sentence did not end the turn
    assert events[-1][1] == events[-2][1]


def test_server_vad_ends_the_turn_after_its_silence_counted_in_samples():
    params = VadParams(silence_duration_ms=700)
    rule = TurnRule.server_vad(params)
    assert rule.pause_ms == PAUSE_MS and rule.max_pause_ms == 700 and rule.vad.silence_duration_ms == PAUSE_MS
    detector = TurnDetector(rule, energy_vad(rule.vad))
    events = run(detector, spoken_words(["three", "five"], tail_ms=1500))
    # the 200 ms gap between the words is a pause (speculation may start there), not the end of the turn
    assert [k for k, _, _ in events] == ["started", "paused", "resumed", "paused", "stopped"]
    (_, pause, noticed), (_, stop, decided) = events[-2:]
    assert stop == pause and decided - noticed >= (700 - PAUSE_MS) * RATE // 1000
    # the same audio, reset: positions restart where the stream is said to be
    detector.reset(10 * RATE)
    again = run(detector, spoken_words(["three", "five"], tail_ms=1500))
    assert [(k, p - 10 * RATE) for k, p, _ in again] == [(k, p) for k, p, _ in events]


class ScriptedVad:
    """A VAD that reports the events it is given, each after the feed of the 20 ms slice it names."""

    sample_rate = RATE

    def __init__(self, script: dict[int, list]) -> None:
        self.script, self.slices = script, 0

    def feed(self, samples):
        self.slices += 1
        return self.script.get(self.slices, [])

    def reset(self) -> None:
        self.slices = 0


def test_speech_after_a_quiet_drops_it_and_a_quiet_without_a_turn_is_ignored():
    S = RATE // 50  # one 20 ms slice
    script = {
        1: [VadEvent(VadEventKind.SPEECH_QUIET, 0)],  # no turn open: nothing
        2: [VadEvent(VadEventKind.SPEECH_STARTED, 0)],
        5: [VadEvent(VadEventKind.SPEECH_QUIET, 4 * S)],
        6: [VadEvent(VadEventKind.SPEECH_STARTED, 5 * S)],  # the quiet did not hold
        9: [VadEvent(VadEventKind.SPEECH_QUIET, 8 * S)],
        14: [VadEvent(VadEventKind.SPEECH_STOPPED, 8 * S)],
    }
    rule = TurnRule.server_vad(VadParams(silence_duration_ms=300))
    detector = TurnDetector(rule, ScriptedVad(script))
    kinds = [(e.kind.value, e.position // S) for e in detector.feed(np.zeros(16 * S, np.int16))]
    assert kinds == [("started", 0), ("quiet", 4), ("resumed", 5), ("quiet", 8), ("paused", 8)]
    detector = TurnDetector(rule, ScriptedVad(script))
    detector.feed(np.zeros(9 * S, np.int16))
    detector.reset(0)  # a reset forgets the open quiet: speech now starts a turn
    detector.vad.script = {1: [VadEvent(VadEventKind.SPEECH_STARTED, 0)]}
    assert [e.kind.value for e in detector.feed(np.zeros(S, np.int16))] == ["started"]


def test_a_semantic_rule_needs_a_model():
    rule = TurnRule.semantic_vad(Eagerness.AUTO)
    with pytest.raises(ValueError, match="end-of-turn model"):
        TurnDetector(rule, energy_vad(rule.vad))


def test_detectors_fed_together_give_each_the_events_it_gets_alone(question):
    """A server's sessions' appends of one loop pass go to ``feed_many``: their Silero VADs in one network call.
    Each session (its speech at its own offset, one of them with two appends in the same pass) gets exactly the
    events, positions and state it gets when fed alone; an energy-detector session rides along, fed its own way."""
    rule = TurnRule.server_vad(VadParams(silence_duration_ms=500))
    # ms of silence before each one's question: not whole appends, so one network call sees streams with 3 and 4
    # whole chunks (and their LSTMs stepping apart)
    offsets = [0, 330, 710, 1250, 2010]
    streams = [np.concatenate([silence(ms), question, silence(1500)]) for ms in offsets]
    streams.append(spoken_words(["three", "five"], tail_ms=1500))
    alone = [TurnDetector(rule, SileroVad(rule.vad)) for _ in offsets] + [TurnDetector(rule, energy_vad(rule.vad))]
    together = [TurnDetector(rule, SileroVad(rule.vad)) for _ in offsets] + [TurnDetector(rule, energy_vad(rule.vad))]
    expected: list[list] = [[] for _ in streams]
    got: list[list] = [[] for _ in streams]
    longest = max(s.size for s in streams)
    for i in range(0, longest, CHUNK):
        feeds = []
        for k, stream in enumerate(streams):
            if i < stream.size:
                expected[k] += alone[k].feed(stream[i : i + CHUNK])
                feeds.append((k, stream[i : i + CHUNK]))
        # session 0 sends its 100 ms as two appends of the same pass
        batch = [(together[k], piece) for k, piece in feeds if k != 0]
        if feeds and feeds[0][0] == 0:
            half = feeds[0][1].size // 2
            batch = [(together[0], feeds[0][1][:half]), *batch, (together[0], feeds[0][1][half:])]
        for (detector, _), events in zip(batch, feed_many(batch), strict=True):
            got[together.index(detector)] += events
    assert got == expected
    assert all(
        [e.kind.value for e in events][:1] == ["started"] and events[-1].kind.value == "stopped" for events in got
    )
    assert [d.fed for d in together] == [d.fed for d in alone]


def test_pauses_judged_together_get_each_ones_own_answer_from_one_call(question):
    """``judge_many``: the open pauses of detectors that share a model go to one ``probabilities`` call, and each
    detector gets the events and probability that judging it alone gives (a detector with no open pause gets none)."""

    class Counting:
        def __init__(self, inner) -> None:
            self.inner, self.calls = inner, []
            self.sample_rate, self.batches = inner.sample_rate, True

        def probabilities(self, turns):
            self.calls.append(len(turns))
            return self.inner.probabilities(turns)

        def probability(self, turn):
            return float(self.probabilities([turn])[0])

    rule = TurnRule.semantic_vad(Eagerness.AUTO)
    shared = Counting(load_smart_turn())
    together = [TurnDetector(rule, SileroVad(rule.vad), shared) for _ in range(3)]
    alone = [TurnDetector(rule, SileroVad(rule.vad), load_smart_turn()) for _ in range(3)]
    audio = [np.concatenate([silence(ms), question, silence(1500)]) for ms in (0, 0, 300)]
    expected: list[list] = [[] for _ in audio]
    got: list[list] = [[] for _ in audio]
    for i in range(0, max(a.size for a in audio), CHUNK):
        for k, a in enumerate(audio):
            expected[k] += [*alone[k].feed(a[i : i + CHUNK]), *alone[k].judge()]
            got[k] += together[k].feed(a[i : i + CHUNK])
        for k, events in enumerate(judge_many(together)):
            got[k] += events
    assert got == expected and all(events[-1].kind.value == "stopped" for events in got)
    for a, b in zip(together, alone, strict=True):  # batched or alone: the same answers (float rounding aside)
        np.testing.assert_allclose(a.probabilities, b.probabilities, atol=1e-5)
    assert 2 in shared.calls  # the two that paused at once shared a call (the third paused later, alone)
    assert sum(shared.calls) == sum(len(d.probabilities) for d in together)


def test_the_tail_buffer_keeps_the_last_samples_across_its_moves():
    from omni_stream.turns.detector import _Tail

    rng = np.random.default_rng(5)
    tail, whole = _Tail(100, np.int16), np.zeros(0, np.int16)
    for size in rng.integers(0, 130, 200):  # past the buffer's end many times; some appends longer than it keeps
        x = rng.integers(-1000, 1000, size).astype(np.int16)
        tail.append(x)
        whole = np.concatenate((whole, x))
        assert tail.end == whole.size
        lo = int(rng.integers(max(0, whole.size - 100), whole.size + 1))
        assert np.array_equal(tail.span(lo, whole.size), whole[lo:])
    assert np.array_equal(tail.span(0, whole.size), whole[-tail._n :])  # clipped to what it holds


def test_the_model_hears_the_vads_resampled_stream_as_a_resampling_of_the_turn_would_give_it(question):
    """The end-of-turn model reads 16 kHz audio, as Silero does: the detector keeps the stream it resampled for the
    VAD instead of resampling the pause's 8 s again. It is what resampling the turn's audio at once gives, up to the
    edges (the one-shot resampler sees silence before the window; the stream's last ~20 ms, still in the resampler's
    lookahead when the pause is noticed, are resampled at once)."""
    from omni_stream.codecs.resample import resample

    heard: list[np.ndarray] = []

    class Recording:
        def __init__(self, inner) -> None:
            self.inner, self.sample_rate, self.batches = inner, inner.sample_rate, False

        def probabilities(self, turns):
            heard.extend(turns)
            return self.inner.probabilities(turns)

        def probability(self, turn):
            return float(self.probabilities([turn])[0])

    rule = TurnRule.semantic_vad(Eagerness.AUTO)
    detector = TurnDetector(rule, SileroVad(rule.vad), Recording(load_smart_turn()))
    stream = np.concatenate([silence(300), question, silence(1000)])
    noticed = start = None
    for i in range(0, stream.size, RATE // 50):  # 20 ms feeds: the pause is noticed at the end of a feed, its last
        for event in detector.feed(stream[i : i + RATE // 50]):  # ~20 ms still in the VAD resampler's lookahead
            if event.kind.value == "started":
                start = event.position
            if event.kind.value == "paused":
                noticed = detector.fed
        detector.judge()
    [turn] = heard
    assert start is not None and noticed is not None
    whole = resample(stream[start:noticed].astype(np.float32) / 32768.0, RATE, 16000)
    assert whole.size == turn.size
    edge = 64
    np.testing.assert_allclose(turn[edge:-edge], whole[edge:-edge], atol=1e-4)
    np.testing.assert_allclose(turn[-320:], whole[-320:], atol=1e-3)  # the part resampled at once
