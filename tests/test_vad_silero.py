"""Silero VAD from the wheel: the stateless network equals the wheel's model; turns land on real speech."""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from spoken import needs_espeak, speak, spoken_span

from omni_stream.codecs.resample import resample
from omni_stream.errors import InvalidRequestError
from omni_stream.models.silero_vad import (
    CHUNK,
    PauseOptions,
    SileroPauseDetector,
    SileroState,
    SileroVad,
    load_silero_net,
)
from omni_stream.models.silero_vad.net import wheel_data_dir
from omni_stream.turns.vad import VadEventKind, VadParams, VoiceActivityDetector

pytestmark = needs_espeak

STARTED, STOPPED = VadEventKind.SPEECH_STARTED, VadEventKind.SPEECH_STOPPED
# Stated tolerance: speech_started + prefix_padding lands within START_TOL of the first spoken sample, and
# speech_stopped - silence_duration within STOP_TOL after the last (Silero's probability decays for a few
# chunks after speech ends; espeak's sentences measured 10-90 ms).
START_TOL = 0.10
STOP_TOL = (-0.05, 0.15)
LEAD, TAIL = 1.0, 2.0  # seconds of silence around the speech


@pytest.fixture(scope="module")
def sentence() -> tuple[np.ndarray, int]:
    return speak("The quick brown fox jumps over the lazy dog near the river bank.")


def padded(samples: np.ndarray, rate: int, lead: float = LEAD, tail: float = TAIL) -> np.ndarray:
    return np.concatenate([np.zeros(int(lead * rate)), samples, np.zeros(int(tail * rate))]).astype(np.float32)


def feed_in(vad: SileroVad, x: np.ndarray, piece: int) -> list:
    events = []
    for i in range(0, x.size, piece):
        events += vad.feed(x[i : i + piece])
    return events


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the wheel's own loader (reference only)
def test_the_stateless_network_equals_the_wheels_model_chunk_for_chunk(sentence):
    samples, rate = sentence
    x = torch.from_numpy(resample(padded(samples, rate, 0.5, 0.5), rate, 16000))
    n = x.numel() // CHUNK
    threads = torch.get_num_threads()
    from silero_vad import load_silero_vad  # the wheel's own API, for reference only

    torch.set_num_threads(threads)  # importing silero_vad set one thread
    wheel = load_silero_vad()
    with torch.no_grad():
        expected = torch.tensor([float(wheel(x[i * CHUNK : (i + 1) * CHUNK], 16000)) for i in range(n)])
    net = load_silero_net()
    chunks = x[: n * CHUNK].reshape(n, CHUNK)
    whole, _ = net.probabilities(chunks, SileroState.initial())
    head, state = net.probabilities(chunks[:37], SileroState.initial())
    tail, _ = net.probabilities(chunks[37:], state)
    assert torch.allclose(whole, expected, atol=1e-4)
    assert torch.allclose(torch.cat((head, tail)), whole, atol=1e-5)  # the state carries across calls
    assert (expected > 0.9).sum() > 30 and (expected < 0.1).sum() > 20  # speech and silence both present


def test_loading_reads_the_wheels_file_and_leaves_torch_threads_alone():
    assert (wheel_data_dir() / "silero_vad.jit").is_file()
    threads = torch.get_num_threads()
    if "silero_vad" not in sys.modules:  # this file may have imported it for the reference above
        load_silero_net()
        assert "silero_vad" not in sys.modules
    assert torch.get_num_threads() == threads
    assert load_silero_net() is load_silero_net()  # one shared copy


@pytest.mark.parametrize("rate", [8000, 16000, 24000, 44100, 48000])
def test_turn_events_land_on_the_spoken_part_at_any_input_rate(sentence, rate):
    samples, source_rate = sentence
    onset, offset = spoken_span(samples, source_rate)
    x = padded(resample(samples, source_rate, rate), rate)
    params = VadParams(threshold=0.5, prefix_padding_ms=300, silence_duration_ms=500)
    vad = SileroVad(params, rate)
    events = feed_in(vad, x, rate // 50)  # 20 ms pieces, as a WebRTC track delivers them
    assert [e.kind for e in events] == [STARTED, STOPPED]
    start = events[0].sample / rate + 0.3 - LEAD
    stop = events[1].sample / rate - 0.5 - LEAD
    assert abs(start - onset) <= START_TOL, (start, onset)
    assert STOP_TOL[0] <= stop - offset <= STOP_TOL[1], (stop, offset)
    assert not vad.speaking


@pytest.mark.parametrize("voice", ["en+f3", "en-us"])
def test_two_utterances_make_two_turns_unless_the_pause_is_shorter_than_the_silence(voice):
    first, rate = speak("Good morning.", voice)
    second, _ = speak("How are you today?", voice)
    gap = np.zeros(int(1.2 * rate), np.float32)
    x = padded(np.concatenate([first, gap, second]), rate)
    two = SileroVad(VadParams(prefix_padding_ms=0, silence_duration_ms=500), rate).feed(x)
    assert [e.kind for e in two] == [STARTED, STOPPED, STARTED, STOPPED]
    second_onset = LEAD + first.size / rate + gap.size / rate + spoken_span(second, rate)[0]
    assert abs(two[2].sample / rate - second_onset) <= START_TOL
    one = SileroVad(VadParams(prefix_padding_ms=0, silence_duration_ms=2000), rate).feed(x)
    assert [e.kind for e in one] == [STARTED, STOPPED]


def test_events_do_not_depend_on_how_the_stream_is_cut(sentence):
    samples, rate = sentence
    x = padded(samples, rate)
    cuts = [feed_in(SileroVad(VadParams(), rate), x, piece) for piece in (x.size, 441, 160, 4096)]
    assert all(c == cuts[0] for c in cuts) and len(cuts[0]) == 2


def test_int16_and_stereo_input_read_as_the_same_speech(sentence):
    samples, rate = sentence
    x = padded(samples, rate)
    as_float = SileroVad(VadParams(), rate).feed(x)
    pcm = np.clip(np.round(x * 32767), -32768, 32767).astype(np.int16)
    assert SileroVad(VadParams(), rate).feed(pcm) == as_float
    assert SileroVad(VadParams(), rate).feed(np.stack([x, x], axis=1)) == as_float


def test_silence_and_low_noise_start_no_turn():
    rng = np.random.default_rng(0)
    vad = SileroVad(VadParams(), 24000)
    assert vad.feed(np.zeros(48000, np.float32)) == []
    assert vad.feed((rng.standard_normal(72000) * 0.003).astype(np.float32)) == []


def test_reset_forgets_the_stream_and_restarts_positions(sentence):
    samples, rate = sentence
    x = padded(samples, rate)
    vad = SileroVad(VadParams(), rate)
    first = vad.feed(x)
    vad.feed(x[:rate])  # part of another stream
    vad.reset()
    assert vad.feed(x) == first


def test_detectors_keep_their_own_state_while_sharing_one_network(sentence):
    samples, rate = sentence
    x = padded(samples, rate)
    alone = SileroVad(VadParams(), rate).feed(x)
    a, b = SileroVad(VadParams(), rate), SileroVad(VadParams(), rate)
    got_a, got_b = [], []
    for i in range(0, x.size, 882):  # interleaved: one stream of speech, one of silence
        got_a += a.feed(x[i : i + 882])
        got_b += b.feed(np.zeros(882, np.float32))
    assert got_a == alone and got_b == []


def test_bad_samples_are_refused_with_the_field_named():
    vad = SileroVad(VadParams(), 16000)
    with pytest.raises(InvalidRequestError) as err:
        vad.feed(np.array([0.0, np.nan], np.float32))
    assert err.value.param == "audio"
    with pytest.raises(InvalidRequestError):
        SileroVad(VadParams(), 0)


def test_it_is_a_voice_activity_detector():
    def use(vad: VoiceActivityDetector) -> int:  # statically: detector.py's TYPE_CHECKING block
        vad.reset()
        return vad.sample_rate

    assert use(SileroVad(sample_rate=24000)) == 24000


# --- fastrtc's PauseDetectionModel protocol -------------------------------------------------------------------


@dataclass
class FastrtcLikeOptions:
    """The fields of fastrtc's SileroVadOptions (fastrtc itself is not a dependency)."""

    threshold: float = 0.5
    min_speech_duration_ms: int = 250
    max_speech_duration_s: float = float("inf")
    min_silence_duration_ms: int = 100
    window_size_samples: int = 1024
    speech_pad_ms: int = 30


def test_pause_detector_measures_speech_in_fastrtc_windows(sentence):
    samples, rate = sentence
    onset, offset = spoken_span(samples, rate)
    pcm48 = (resample(padded(samples, rate, 0.5, 0.5), rate, 48000) * 32767).astype(np.int16)[None, :]  # (1, n)
    detector = SileroPauseDetector()
    detector.warmup()
    seconds, chunks = detector.vad((48000, pcm48), FastrtcLikeOptions())
    assert chunks and all(c["start"] < c["end"] for c in chunks)
    # Segments cover the spoken part (padded by 30 ms each side), in 16 kHz samples.
    assert abs(chunks[0]["start"] / 16000 - (0.5 + onset)) <= START_TOL
    assert abs(chunks[-1]["end"] / 16000 - (0.5 + offset)) <= 0.2
    assert 0.8 * (offset - onset) <= seconds <= offset - onset + 0.3
    # A 0.6 s window of silence has no speech: fastrtc reads that as the pause.
    assert detector.vad((48000, np.zeros((1, 28800), np.int16)), None) == (0.0, [])


def test_pause_detector_defaults_to_fastrtcs_options_and_serves_threads_at_once(sentence):
    samples, rate = sentence
    window = samples[int(0.5 * rate) : int(1.1 * rate)]  # 0.6 s inside the sentence
    detector = SileroPauseDetector()
    expected = detector.vad((rate, window), None)
    assert expected == detector.vad((rate, window), PauseOptions())
    assert expected[0] > 0.2  # fastrtc's started_talking threshold
    results: list = [None] * 8

    def run(i: int) -> None:
        results[i] = detector.vad((rate, window), None)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [expected] * 8


def test_feed_pieces_judges_as_feeding_the_pieces_one_by_one(sentence):
    """The turn detector's path: 20 ms pieces judged in one network call give each piece the events (and the
    stream the state) that feeding them one at a time gives."""
    audio, rate = sentence
    x = np.concatenate([np.zeros(int(LEAD * rate), np.int16), audio, np.zeros(int(TAIL * rate), np.int16)])
    step = rate // 50
    appends = [x[i : i + 5 * step] for i in range(0, x.size, 5 * step)]  # 100 ms appends of five pieces
    one_by_one, together = SileroVad(VadParams(), rate), SileroVad(VadParams(), rate)
    expected, got = [], []
    for append in appends:
        pieces = [append[i : i + step] for i in range(0, append.size, step)]
        expected += [one_by_one.feed(p) for p in pieces]
        got += together.feed_pieces(pieces)
    assert got == expected
    assert [e.kind for events in got for e in events] == [STARTED, STOPPED]


def test_the_network_runs_on_one_intra_op_thread_and_gives_the_caller_its_own_back(monkeypatch):
    net = load_silero_net()
    seen: list[int] = []
    real = net._probabilities

    def recording(streams):
        seen.append(torch.get_num_threads())
        return real(streams)

    monkeypatch.setattr(net, "_probabilities", recording)
    chunks = torch.zeros(2, CHUNK)
    result: dict[str, int] = {}

    def in_a_thread() -> None:
        torch.set_num_threads(2)  # per thread under OpenMP: a session's thread with a team of two
        net.probabilities(chunks, SileroState.initial())
        result["after"] = torch.get_num_threads()

    worker = threading.Thread(target=in_a_thread)
    worker.start()
    worker.join()
    assert seen == [1] and result["after"] == 2


def test_several_streams_in_one_network_call_equal_each_stream_alone(sentence):
    """``probabilities_many``: streams of 0 to 9 chunks at different points of the sentence, each with its own
    state, give the probabilities and states that one call per stream gives (float rounding of the batched products
    aside)."""
    samples, rate = sentence
    x = torch.from_numpy(resample(padded(samples, rate, 0.5, 0.5), rate, 16000))
    net = load_silero_net()
    chunks = x[: x.numel() // CHUNK * CHUNK].reshape(-1, CHUNK)
    starts, counts = [0, 10, 25, 40, 60, 61], [4, 0, 9, 1, 3, 5]
    states = []
    for start in starts:  # each stream's state after the chunks before its start
        _, state = net.probabilities(chunks[:start], SileroState.initial()) if start else (None, SileroState.initial())
        states.append(state)
    streams = [(chunks[s : s + n], state) for s, n, state in zip(starts, counts, states, strict=True)]
    together = net.probabilities_many(streams)
    for (part, state), (probs, after) in zip(streams, together, strict=True):
        alone, alone_after = net.probabilities(part, state)
        assert probs.shape == alone.shape
        torch.testing.assert_close(probs, alone, atol=1e-5, rtol=0)
        for a, b in ((after.h, alone_after.h), (after.c, alone_after.c)):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        assert torch.equal(after.context, alone_after.context)
    assert net.probabilities_many([]) == []


def test_silero_detectors_fed_together_give_what_each_gives_alone(sentence):
    audio, rate = sentence
    x = np.concatenate([np.zeros(int(LEAD * rate), np.int16), audio, np.zeros(int(TAIL * rate), np.int16)])
    step = rate // 50
    shifts = [0, 700, 1900]  # samples: the streams' chunks fall at different places of their appends
    alone = [SileroVad(VadParams(), rate) for _ in shifts]
    together = [SileroVad(VadParams(), rate) for _ in shifts]
    expected: list[list] = [[] for _ in shifts]
    got: list[list] = [[] for _ in shifts]
    streams = [np.concatenate([np.zeros(s, np.int16), x]) for s in shifts]
    for i in range(0, max(s.size for s in streams), 5 * step):
        items = []
        for k, stream in enumerate(streams):
            append = stream[i : i + 5 * step]
            pieces = [append[j : j + step] for j in range(0, append.size, step)]
            expected[k] += alone[k].feed_pieces(pieces)
            items.append((together[k], pieces))
        for k, events in enumerate(SileroVad.feed_many(items)):
            got[k] += events
    assert got == expected
    assert all([e.kind for events in g for e in events] == [STARTED, STOPPED] for g in got)
    with pytest.raises(TypeError, match="SileroVad"):
        SileroVad.feed_many([(object(), [])])  # type: ignore[list-item]
