"""The CUDA-graph decode step's logic, checked on any device: buckets, in-graph noise, idle rows, padded shapes."""

from __future__ import annotations

import pytest
import torch
from graph_standins import EagerGraphs
from reference_qwen import tiny_checkpoint

from omni_stream.batch_model import Batch, Sequence
from omni_stream.models.qwen3_tts.checkpoint import load_lm
from omni_stream.models.qwen3_tts.config import load_config
from omni_stream.models.qwen3_tts.options import Qwen3TTSOptions
from omni_stream.models.qwen3_tts.prompt import prepare_request
from omni_stream.models.qwen3_tts.runner import Qwen3TTSRunner
from omni_stream.models.qwen3_tts.tokenizer import TextTokenizer
from omni_stream.requests import SamplingParams, SpeechRequest
from omni_stream.runtime import rng
from omni_stream.runtime.cuda_graphs import batch_buckets, length_buckets, pick

GREEDY = SamplingParams(do_sample=False, temperature=1.0, top_k=0, repetition_penalty=1.05)
SUB_GREEDY = SamplingParams(do_sample=False, temperature=1.0, top_k=0)
HOT = SamplingParams(do_sample=True, temperature=0.9, top_k=50, repetition_penalty=1.05)
SUB_HOT = SamplingParams(do_sample=True, temperature=0.9, top_k=50)


def test_buckets_and_pick() -> None:
    assert batch_buckets(1) == (1,)
    assert batch_buckets(8) == (1, 2, 4, 8)
    assert batch_buckets(12) == (1, 2, 4, 8, 12)
    assert batch_buckets(32, fine=True) == (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
    assert batch_buckets(12, fine=True) == (1, 2, 3, 4, 6, 8, 12) and batch_buckets(2, fine=True) == (1, 2)
    assert length_buckets(4096) == (512, 1024, 2048, 4096)
    assert length_buckets(640) == (512, 640)
    assert length_buckets(300) == (300,)
    assert pick((1, 2, 4, 8), 3) == 4 and pick((1, 2, 4, 8), 8) == 8 and pick((1, 2, 4, 8), 9) is None
    with pytest.raises(ValueError):
        batch_buckets(0)


def test_counter_noise_is_exponential_per_row_and_deterministic() -> None:
    seeds = torch.tensor([1, 2, 1, (1 << 62) + 5])
    counters = torch.tensor([0, 0, 1, 0])
    keys = rng.row_keys(seeds, counters)
    e = rng.exponential(keys, 50_000)
    assert e.shape == (4, 50_000) and e.dtype == torch.float32 and bool((e > 0).all())
    # Exponential(1): mean 1, variance 1, P(E > 1) = e^-1.
    assert abs(e.mean().item() - 1) < 0.02 and abs(e.var().item() - 1) < 0.05
    assert abs((e > 1).float().mean().item() - 0.3679) < 0.01
    # Rows differ with seed and counter; a row does not depend on its batch neighbours.
    assert not torch.equal(e[0], e[1]) and not torch.equal(e[0], e[2]) and not torch.equal(e[0], e[3])
    alone = rng.exponential(rng.row_keys(seeds[2:3], counters[2:3]), 50_000)
    assert torch.equal(alone[0], e[2])
    # Neighbouring columns are uncorrelated.
    c = torch.corrcoef(torch.stack((e[0, :-1], e[0, 1:])))[0, 1].item()
    assert abs(c) < 0.02


@pytest.fixture(scope="module")
def cv(tmp_path_factory):
    path = tiny_checkpoint(tmp_path_factory, "custom_voice", "0.6b")
    return load_config(path), TextTokenizer(path), load_lm(path, dtype=torch.float32)


def _req(cv, text: str, voice: str, n: int, *, hot: bool = False, seed: int = 0):
    cfg, tok, _ = cv
    req = SpeechRequest(text=text, voice=voice, max_new_tokens=n, ignore_eos=True, seed=seed,
                        sampling=HOT if hot else GREEDY,
                        options=Qwen3TTSOptions(subtalker_sampling=SUB_HOT if hot else SUB_GREEDY))  # fmt: skip
    return prepare_request(req, cfg, tok)


def test_idle_rows_keep_their_state(cv) -> None:
    r = Qwen3TTSRunner(cv[2], max_batch_size=4, max_len=128)
    a = Sequence(seq_id=0, payload=_req(cv, "Hello world.", "ryan", 8), slot=0)
    b = Sequence(seq_id=1, payload=_req(cv, "Good.", "vivian", 8, hot=True), slot=2)
    r.step(Batch(prefill=(a, b)))
    n = b.model_state.length
    saved = {name: getattr(r, name)[2].clone() for name in ("hidden", "seen", "steps", "lengths")}
    k_rows = r.kv.k[:, 2, :, :n].clone()
    for _ in range(3):  # b is paused (held, not scheduled) while a decodes past it in slot order
        r.step(Batch(decode=(a,)))
    for name, value in saved.items():
        assert torch.equal(getattr(r, name)[2], value), name
    assert torch.equal(r.kv.k[:, 2, :, :n], k_rows)
    assert int(r.lengths[0]) == a.model_state.length
    r.release(a)
    r.release(b)


def test_padded_bucket_shapes_give_the_exact_shape_codes(cv) -> None:
    reqs = [
        _req(cv, "Hello world, this is a test.", "ryan", 9),
        _req(cv, "Good.", "dylan", 7, hot=True, seed=3),
        _req(cv, "The voice is warm.", "sohee", 8, hot=True, seed=4),
    ]
    exact = Qwen3TTSRunner(cv[2], max_batch_size=8, max_len=96)
    padded = Qwen3TTSRunner(cv[2], max_batch_size=8, max_len=96)
    padded.pad_eager = True
    padded.length_buckets = (48, 96)
    a = exact.generate_codes(reqs, join_steps=[0, 2, 1])
    b = padded.generate_codes(reqs, join_steps=[0, 2, 1])
    assert [x.shape[0] for x in a] == [9, 7, 8]
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)
    assert not exact.use_graphs and exact.graphs is None and exact.capture_graphs() == 0.0


def test_graph_replay_path_matches_eager_on_cpu(cv) -> None:
    reqs = [
        _req(cv, "Hello world, this is a test.", "ryan", 9),
        _req(cv, "Good.", "dylan", 7, hot=True, seed=3),
        _req(cv, "The voice is warm.", "sohee", 8, hot=True, seed=4),
    ]
    eager = Qwen3TTSRunner(cv[2], max_batch_size=4, max_len=96)
    graphed = Qwen3TTSRunner(cv[2], max_batch_size=4, max_len=96)
    graphed.graphs = EagerGraphs(graphed._graph_step)
    graphed.length_buckets = (40, 96)
    graphed.capture_graphs()
    assert len(graphed.graphs) == 3 * 2
    a = eager.generate_codes(reqs, join_steps=[0, 2, 1])
    b = graphed.generate_codes(reqs, join_steps=[0, 2, 1])
    assert graphed.graph_steps > 0 and graphed.eager_steps == 0
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


@pytest.fixture(scope="module")
def codec(tmp_path_factory):
    from omni_stream.models.qwen3_tts.codec import load_speech_tokenizer
    from omni_stream.models.qwen3_tts.codec_checkpoint import write_tiny_speech_tokenizer

    path = tmp_path_factory.mktemp("codec")
    write_tiny_speech_tokenizer(path, seed=0)
    return load_speech_tokenizer(path, with_encoder=False).decoder


@pytest.mark.parametrize("graph_path", [False, True])
def test_codec_window_pool_streams_like_private_states(codec, graph_path) -> None:
    from omni_stream.models.qwen3_tts.codec_graphs import CodecWindows
    from omni_stream.models.qwen3_tts.codec_stage import SlotWindow, decode_slot_windows
    from omni_stream.models.qwen3_tts.codec_stream import CodecStreamState, decode_window

    pool = CodecWindows(codec, capacity=4, graphs=False, windows=(2, 4))
    if graph_path:
        pool.graphs = EagerGraphs(pool._graph_step)
        pool.capture_graphs()
        assert len(pool.graphs) == 3 * 2
    gen = torch.Generator().manual_seed(0)
    codes = [torch.randint(0, 2048, (11, 16), generator=gen) for _ in range(3)]
    slots = [pool.acquire() for _ in range(3)]
    assert slots == [0, 1, 2]
    got: list[list] = [[], [], []]
    # Streams 0 and 2 decode together, stream 1 alone; windows 2, 4, then a 5-frame tail (eager in any case).
    for lo, hi in ((0, 2), (2, 6), (6, 11)):
        for group in ((0, 2), (1,)):
            jobs = [SlotWindow(slots[i], codes[i][lo:hi], lo == 0) for i in group]
            for i, audio in zip(group, decode_slot_windows(pool, jobs), strict=True):
                got[i].append(audio)
    for i in range(3):
        state = CodecStreamState.zeros(codec, 1)
        want = [decode_window(codec, codes[i][lo:hi].T[None], state)[0].numpy() for lo, hi in ((0, 2), (2, 6), (6, 11))]
        for g, w in zip(got[i], want, strict=True):
            assert g.shape == w.shape and float(abs(g - w).max()) < 1e-5
    if graph_path:
        assert pool.graph_jobs == 4 and pool.eager_jobs == 2
    pool.release(slots[1])
    assert pool.acquire() == slots[1]


@pytest.mark.parametrize(
    ("n", "windows", "final", "plan"),
    [
        (4, (1, 2, 4), False, [4]),
        (3, (1, 2, 4), False, [2, 1]),
        (3, (1, 2, 4), True, [4]),
        (19, (1, 2, 4, 8, 16, 25), False, [16, 2, 1]),
        (19, (1, 2, 4, 8, 16, 25), True, [25]),
        (30, (1, 2, 4, 8, 16, 25), True, [25, 8]),
        (50, (1, 2, 4, 8, 16, 25), False, [25, 25]),
        (5, (2, 4), False, None),
        (5, (2, 4), True, [4, 2]),
        (1, (2, 4), True, [2]),
    ],
)
def test_window_plan_covers_any_length_with_graph_windows(n, windows, final, plan) -> None:
    from omni_stream.models.qwen3_tts.codec_graphs import window_plan

    assert window_plan(n, windows, final) == plan
    if plan is not None:
        assert all(w in windows for w in plan)
        assert sum(plan) == n if not final else n <= sum(plan) < n + min(windows) + max(windows)


def test_windows_of_no_graph_size_replay_split_or_padded_exactly(codec) -> None:
    """Odd windows (a fixed first window of 3, its ramp, a 3-frame tail) and ICL priming of 7 frames replay graph
    windows only, and stream exactly what private states give."""
    from omni_stream.models.qwen3_tts.codec_graphs import CodecWindows
    from omni_stream.models.qwen3_tts.codec_stage import SlotWindow, decode_slot_windows
    from omni_stream.models.qwen3_tts.codec_stream import CodecStreamState, decode_window, prime

    pool = CodecWindows(codec, capacity=4, graphs=False, windows=(1, 2, 4))
    pool.graphs = EagerGraphs(pool._graph_step)
    pool.capture_graphs()
    gen = torch.Generator().manual_seed(2)
    context = torch.randint(0, 2048, (7, 16), generator=gen)
    codes = [torch.randint(0, 2048, (12, 16), generator=gen) for _ in range(2)]
    bounds = ((0, 3), (3, 9), (9, 12))  # 3 -> [2, 1], 6 -> [4, 2], the last 3 -> [4] padded
    slots = [pool.acquire(), pool.acquire()]
    got: list[list] = [[], []]
    for lo, hi in bounds:
        jobs = [
            SlotWindow(slots[i], codes[i][lo:hi], lo == 0, context if (i == 1 and lo == 0) else None, final=hi == 12)
            for i in range(2)
        ]
        for i, audio in enumerate(decode_slot_windows(pool, jobs)):
            got[i].append(audio)
    assert pool.eager_jobs == 0 and pool.planned_jobs == 3 + 1  # three odd windows, the 7-frame prime
    assert pool.graph_jobs == 2 + 2 + 1 + 3  # replays: [2, 1], [4, 2], [4], and the prime's [4, 2, 1]
    for i in range(2):
        state = CodecStreamState.zeros(codec, 1)
        if i == 1:
            prime(codec, context.T.unsqueeze(0), state)
        want = [decode_window(codec, codes[i][lo:hi].T[None], state)[0].numpy() for lo, hi in bounds]
        for g, w in zip(got[i], want, strict=True):
            assert g.shape == w.shape and float(abs(g - w).max()) < 1e-5


def test_codec_jobs_larger_than_the_largest_graph_batch_replay_in_pieces(codec) -> None:
    from omni_stream.models.qwen3_tts.codec_graphs import CodecWindows
    from omni_stream.models.qwen3_tts.codec_stream import CodecStreamState, decode_window

    pool = CodecWindows(codec, capacity=8, graphs=False, windows=(2,), max_batch=2)
    pool.graphs = EagerGraphs(pool._graph_step)
    pool.capture_graphs()
    gen = torch.Generator().manual_seed(1)
    codes = [torch.randint(0, 2048, (2, 16), generator=gen) for _ in range(5)]
    slots = [pool.acquire() for _ in range(5)]
    got = pool.decode(slots, codes, [True] * 5)
    assert pool.graph_jobs == 3 and pool.eager_jobs == 0  # 5 windows, graph batches of at most 2
    for c, g in zip(codes, got, strict=True):
        want = decode_window(codec, c.T[None], CodecStreamState.zeros(codec, 1))[0].numpy()
        assert g.shape == want.shape and float(abs(g - want).max()) < 1e-5


def _admitted(runner: Qwen3TTSRunner, seqs: list[Sequence]) -> list[tuple[int, torch.Tensor]]:
    """Admit newcomers as a step does (checks and slots, then their prompts embedded together)."""
    for seq in seqs:
        runner._admit(seq)
    kept, admitted = runner._embed_all(seqs, {})
    assert kept == seqs
    return admitted


def test_newcomers_prefill_together_as_they_would_alone(cv) -> None:
    reqs = [_req(cv, "Hello world, this is a longer prompt.", "ryan", 4), _req(cv, "Hi.", "vivian", 4)]
    together = Qwen3TTSRunner(cv[2], max_batch_size=2, max_len=96)
    seqs = [Sequence(seq_id=i, payload=r, slot=i) for i, r in enumerate(reqs)]
    together._prefill(_admitted(together, seqs))
    lengths = [s.model_state.length for s in seqs]
    assert lengths[0] > lengths[1]
    for i, req in enumerate(reqs):
        alone = Qwen3TTSRunner(cv[2], max_batch_size=2, max_len=96)
        seq = Sequence(seq_id=0, payload=req, slot=i)
        alone._prefill(_admitted(alone, [seq]))
        n = lengths[i]
        torch.testing.assert_close(together.hidden[i], alone.hidden[i], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(together.kv.k[:, i, :, :n], alone.kv.k[:, i, :, :n], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(together.kv.v[:, i, :, :n], alone.kv.v[:, i, :, :n], rtol=1e-5, atol=1e-5)


def test_newcomers_prefill_through_padded_buckets_with_exact_codes(cv) -> None:
    """The prefill graphs' function (prompts right-padded to a length bucket, newcomers padded to a count bucket
    with rows that write the scratch slot), replayed by a CPU stand-in: alone and together, the exact codes."""
    reqs = [
        _req(cv, "Hello world, this is a test.", "ryan", 6),
        _req(cv, "Good.", "dylan", 5, hot=True, seed=3),
        _req(cv, "The voice is warm and the sentence is a little longer than the others.", "sohee", 6),
    ]
    exact = Qwen3TTSRunner(cv[2], max_batch_size=4, max_len=256)
    graphed = Qwen3TTSRunner(cv[2], max_batch_size=4, max_len=256)
    graphed.prefill_graphs = EagerGraphs(graphed._padded_prefill)
    graphed.prefill_buckets = (16, 32, 64)
    graphed.capture_graphs()
    assert len(graphed.prefill_graphs) == 3 * 3  # newcomer counts 1, 2, 4 x prompt lengths 16, 32, 64
    lengths = [r.prompt.prefill_len for r in reqs]
    assert min(lengths) < 32 < max(lengths) <= 64  # buckets 32 and 64 both used, never at their exact size
    for r in reqs:  # alone, so each prefill takes the (1, length) graph
        assert torch.equal(graphed.generate_codes([r])[0], exact.generate_codes([r])[0])
    assert graphed.prefill_graph_calls == 3
    together = graphed.generate_codes(reqs)  # three newcomers: the (4, 64) graph, one padding row
    assert graphed.prefill_graph_calls == 4 and graphed.eager_steps > 0
    for got, r in zip(together, reqs, strict=True):
        assert torch.equal(got, exact.generate_codes([r])[0])
    # Nothing a sequence reads was touched by the padding row: a later solo run still gives the exact codes.
    assert torch.equal(graphed.generate_codes([reqs[1]])[0], exact.generate_codes([reqs[1]])[0])


def test_a_burst_past_one_graphs_positions_prefills_in_groups_at_captured_shapes_with_exact_codes(cv) -> None:
    """A burst of newcomers prefills in groups, longest prompts first, each group at a captured (count, length)
    shape of at most ``prefill_positions`` padded positions: never one eager forward over the whole burst (under
    load each of its launches waited for the interpreter). Each prompt's codes are those it gets alone."""
    long = "The voice is warm and the sentence is a little longer than the others."
    texts = [("Hi.", "vivian"), (long, "sohee"), ("Good.", "dylan"), ("Hello world, this is a test.", "ryan"),
             (long + " Even more so.", "aiden"), ("Yes.", "ryan")]  # fmt: skip
    reqs = [_req(cv, text, voice, 4) for text, voice in texts]
    lengths = [r.prompt.prefill_len for r in reqs]
    assert sorted(n > 32 for n in lengths) == [False] * 4 + [True] * 2 and max(lengths) <= 64, lengths
    exact = Qwen3TTSRunner(cv[2], max_batch_size=8, max_len=256)
    graphed = Qwen3TTSRunner(cv[2], max_batch_size=8, max_len=256)
    graphed.prefill_graphs = EagerGraphs(graphed._padded_prefill)
    graphed.prefill_buckets = (16, 32, 64)
    graphed.prefill_positions = 128
    graphed.capture_graphs()
    counts = graphed.prefill_batch_buckets
    assert set(graphed.prefill_graphs.graphs) == {(b, n) for b in counts for n in (16, 32, 64) if b * n <= 128}
    together = graphed.generate_codes(reqs)
    # the two long prompts as a (2, 64) group (128 positions), then the four short ones as a (4, 32) group
    assert graphed.prefill_graphs.replayed[:2] == [(2, 64), (4, 32)] and graphed.prefill_graph_calls == 2
    for got, r in zip(together, reqs, strict=True):
        assert torch.equal(got, exact.generate_codes([r])[0])


def test_padding_rows_of_a_prefill_bucket_write_only_the_scratch_slot(cv) -> None:
    r = Qwen3TTSRunner(cv[2], max_batch_size=4, max_len=96)
    r.pad_eager = True  # the bucket path without graphs: same function, same shapes
    assert r.scratch_slot == 4 and r.kv.k.shape[1] == 5 and r.hidden.shape[0] == 5
    r.kv.k[:, 2].fill_(3.0)
    r.kv.k[:, 4].fill_(3.0)
    r.hidden[2].fill_(3.0)
    texts = [("Hello world.", "ryan", 0), ("Good.", "vivian", 1), ("The voice is warm.", "aiden", 3)]
    seqs = [Sequence(seq_id=i, payload=_req(cv, t, v, 4), slot=s) for i, (t, v, s) in enumerate(texts)]
    r._prefill(_admitted(r, seqs))  # three newcomers: bucket 4, one padding row
    assert bool((r.kv.k[:, 2] == 3.0).all()) and bool((r.hidden[2] == 3.0).all())
    assert not bool((r.kv.k[:, 4, :, :1] == 3.0).any())  # the padding row's 1-position prompt went to the scratch slot
    for s in seqs:
        n = s.model_state.length
        alone = Qwen3TTSRunner(cv[2], max_batch_size=4, max_len=96)
        alone._prefill(_admitted(alone, [Sequence(seq_id=0, payload=s.payload, slot=s.slot)]))
        torch.testing.assert_close(r.hidden[s.slot], alone.hidden[s.slot], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(r.kv.k[:, s.slot, :, :n], alone.kv.k[:, s.slot, :, :n], rtol=1e-5, atol=1e-5)
