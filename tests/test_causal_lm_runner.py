"""The batched LM runner on the real scheduler: mixed batches equal solo runs, seeds, stop strings, limits."""

from __future__ import annotations

import pytest
from lm_helpers import drive, load_tiny, tiny_lm_checkpoint

from omni_stream.errors import InvalidRequestError
from omni_stream.models.causal_lm.runner import GROUP_PREFILL_MAX_LEN, LMRequest
from omni_stream.requests import GREEDY, SamplingParams
from omni_stream.runtime import decoder_kernels as fused
from omni_stream.runtime.cuda_graphs import pick

SAMPLED = SamplingParams(do_sample=True, temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.1)
TEXTS = (
    "Hello there, how are you?", "Café 🎉", "The quick brown fox jumps over the lazy dog.", "hi", "What about you?",
)  # fmt: skip


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def lm(request, tmp_path_factory):
    return load_tiny(tiny_lm_checkpoint(tmp_path_factory, request.param))


def mixed(lm) -> list[LMRequest]:
    return [
        lm.request(TEXTS[0], max_tokens=14, sampling=GREEDY),
        lm.request(TEXTS[1], max_tokens=9, sampling=SAMPLED, seed=11),
        lm.request(TEXTS[2], max_tokens=12, sampling=GREEDY, ignore_eos=True),
        lm.request(TEXTS[3], max_tokens=11, sampling=SamplingParams(temperature=1.3, top_k=0), seed=5),
        lm.request(TEXTS[4], max_tokens=6, sampling=SAMPLED, seed=2, ignore_eos=True),
    ]


async def test_a_mixed_batch_with_newcomers_gives_each_request_its_solo_tokens(lm):
    requests = mixed(lm)
    runner = lm.runner(slots=3)
    solo = [(await drive(runner, [r]))[0] for r in requests]
    # 3 slots for 5 requests: two join while others decode (steps 2 and 5), the rest wait for a free slot
    batched = await drive(runner, requests, join_steps=[0, 2, 0, 5, 1])
    for s, b in zip(solo, batched, strict=True):
        assert b.error is None and b.tokens == s.tokens and b.text == s.text
        assert b.finish_reason == s.finish_reason
    assert runner.num_active == 0


async def test_seeded_sampling_repeats_and_does_not_depend_on_neighbours(lm):
    runner = lm.runner(slots=4)
    request = lm.request(TEXTS[0], max_tokens=20, sampling=SamplingParams(temperature=1.0, top_k=0), seed=123)
    (alone,) = await drive(runner, [request])
    (again,) = await drive(runner, [request])
    others = [lm.request(t, max_tokens=20, sampling=SAMPLED, seed=i) for i, t in enumerate(TEXTS[1:4])]
    crowded = await drive(runner, [*others, request], join_steps=[0, 0, 3, 1])
    assert alone.tokens == again.tokens == crowded[-1].tokens
    reseeded = [(await drive(runner, [LMRequest(request.prompt_ids, 20, request.sampling, seed)]))[0]
                for seed in (1, 2, 3)]  # fmt: skip
    assert any(r.tokens != alone.tokens for r in reseeded)
    assert len({tuple(r.tokens) for r in crowded[:3]}) == 3


async def test_tokens_stream_one_delta_each_and_join_to_the_decode(lm):
    (run,) = await drive(lm.runner(slots=1), [lm.request(TEXTS[1], max_tokens=30, sampling=SAMPLED, seed=4,
                                                         ignore_eos=True)])  # fmt: skip
    assert [d.index for d in run.deltas] == list(range(30)) == list(range(len(run.tokens)))
    assert [d.final for d in run.deltas] == [False] * 29 + [True] and run.finish_reason == "length"
    assert run.text == lm.tokenizer.decode(run.tokens)


async def test_a_stop_string_ends_the_text_before_it(lm):
    runner = lm.runner(slots=2)
    base = lm.request(TEXTS[2], max_tokens=40, sampling=GREEDY, ignore_eos=True)
    (full,) = await drive(runner, [base])
    text = full.text
    start = next(k for k in range(len(text) // 3, len(text) - 2) if "\ufffd" not in text[k : k + 3])
    stop = text[start : start + 3]
    cut = text.index(stop)
    stopped = LMRequest(base.prompt_ids, 40, GREEDY, stop=("never-there", stop), ignore_eos=True)
    (run,) = await drive(runner, [stopped])
    assert run.text == text[:cut] and run.finish_reason == "stop"
    assert run.tokens == full.tokens[: len(run.tokens)] and len(run.tokens) < 40  # it ended there, early


async def test_max_tokens_past_the_context_fails_that_request_alone(lm):
    runner = lm.runner(slots=2, max_len=64)
    ok = lm.request(TEXTS[0], max_tokens=10, sampling=GREEDY, ignore_eos=True)
    too_long = lm.request(TEXTS[1], max_tokens=64, sampling=GREEDY)
    (solo,) = await drive(runner, [ok])
    runs = await drive(runner, [ok, too_long], join_steps=[0, 3])
    assert isinstance(runs[1].error, InvalidRequestError) and runs[1].error.param == "max_tokens"
    assert "context of 64" in str(runs[1].error) and runs[1].deltas == []
    assert runs[0].error is None and runs[0].tokens == solo.tokens
    assert runner.num_active == 0


@pytest.mark.parametrize(
    ("where", "join_steps"),
    [
        ("_prefill", [0, 2, 2]),  # its prefill fails: it ends alone, the newcomer beside it joins
        ("_write_newcomers", [0, 2, 3]),  # the write of its step's newcomers' state fails: that step's ones end
    ],
)
async def test_a_failing_newcomer_ends_without_the_running_rows(lm, monkeypatch, where, join_steps):
    runner = lm.runner(slots=3)
    requests = [lm.request(t, max_tokens=8, sampling=GREEDY, ignore_eos=True) for t in TEXTS[:3]]
    solo = [(await drive(runner, [r]))[0] for r in requests]
    real = getattr(runner, where)
    bad = len(requests[1].prompt_ids)

    def failing(items):  # (slot, prompt ids) pairs for _prefill, sequences for _write_newcomers
        lengths = [len(x[1]) if isinstance(x, tuple) else len(x.payload.prompt_ids) for x in items]
        if bad in lengths:
            raise RuntimeError(f"{where} failed")
        return real(items)

    assert len({len(r.prompt_ids) for r in requests}) == 3  # the failing one is told apart by its length
    monkeypatch.setattr(runner, where, failing)
    runs = await drive(runner, requests, join_steps=join_steps)
    assert isinstance(runs[1].error, RuntimeError) and runs[1].deltas == []
    assert [runs[0].tokens, runs[2].tokens] == [solo[0].tokens, solo[2].tokens]
    assert runner.num_active == 0


async def test_each_decode_step_computes_the_rows_up_to_the_highest_live_slot(lm, monkeypatch):
    runner = lm.runner(slots=4)
    widths: list[int] = []
    real = runner._run_rows

    def run_rows(b, span, full):
        widths.append(b)
        return real(b, span, full)

    monkeypatch.setattr(runner, "_run_rows", run_rows)
    lengths = (3, 9, 5)  # slot 0 ends first, then slot 2, slot 1 last
    requests = [lm.request(TEXTS[i], max_tokens=n, sampling=GREEDY, ignore_eos=True) for i, n in enumerate(lengths)]
    await drive(runner, requests)
    # three rows (slots 0..2) while all run; slot 0 done: still 0..2; slot 2 done: slots 0..1 (slot 1 alone)
    assert widths == [3] * 5 + [2] * 4


async def test_fused_layers_give_the_module_tokens(lm):
    requests = mixed(lm)
    plain = lm.runner(slots=3)
    assert plain.kernels is None
    expected = await drive(plain, requests, join_steps=[0, 2, 0, 5, 1])
    fast = lm.runner(slots=3)  # a fresh LM: use_kernels concatenates its weights in place
    fast.lm.use_kernels(fused.TORCH)
    fast.kernels = fused.TORCH
    got = await drive(fast, requests, join_steps=[0, 2, 0, 5, 1])
    assert [g.tokens for g in got] == [e.tokens for e in expected]
    layer = fast.lm.model.layers[0]
    assert layer.qkv_weight is not None and (layer.qk_norm_weight is not None) == fast.cfg.qk_norm


async def test_decode_steps_at_graph_bucket_shapes_give_the_exact_shape_tokens(lm):
    """The step a CUDA graph replays (padded to its batch and span buckets, idle rows along) changes no token."""
    requests = mixed(lm)
    exact = await drive(lm.runner(slots=6), requests, join_steps=[0, 2, 0, 5, 1])
    padded_runner = lm.runner(slots=6)
    padded_runner.pad_eager = True
    widths: list[tuple[int, int]] = []
    real = padded_runner._run_rows

    def run_rows(b, span, full):
        widths.append((b, span))
        return real(b, span, full)

    padded_runner._run_rows = run_rows  # type: ignore[method-assign]
    padded = await drive(padded_runner, requests, join_steps=[0, 2, 0, 5, 1])
    assert [p.tokens for p in padded] == [e.tokens for e in exact]
    assert {b for b, _ in widths} <= set(padded_runner.batch_buckets) and {s for _, s in widths} == {256}
    assert any(b == 4 for b, _ in widths)  # three live rows padded to the bucket of four


async def test_a_lone_newcomer_prefills_at_a_length_bucket_and_its_tokens_do_not_change(lm):
    """The prefill a CUDA graph replays for a lone newcomer (padded to its length bucket, padding masked) gives the
    exact-length prefill's tokens; every lone prefill runs at a bucket length, never at a new one."""
    requests = mixed(lm)
    joins = [0, 40, 80, 120, 160]  # one at a time: each is a lone newcomer
    exact = await drive(lm.runner(slots=3), requests, join_steps=joins)
    padded_runner = lm.runner(slots=3)
    padded_runner.pad_lone_prefill = True
    padded = await drive(padded_runner, requests, join_steps=joins)
    assert [p.tokens for p in padded] == [e.tokens for e in exact]
    log = padded_runner.prefill_log
    assert len(log) == len(requests) and all(n == 1 for n, _, _ in log)
    assert {t for _, t, _ in log} <= set(padded_runner.prefill_buckets)
    unbucketed = {len(r.prompt_ids) for r in requests} - set(padded_runner.prefill_buckets)
    assert unbucketed and not unbucketed & {t for _, t, _ in log}  # those prompts ran padded, at bucket shapes
    # several newcomers at once still prefill together, at the length bucket of the longest, with the same tokens
    group = [k for k, r in enumerate(requests) if len(r.prompt_ids) in unbucketed]
    assert len(group) >= 2
    together = lm.runner(slots=6)
    together.pad_lone_prefill = True
    got = await drive(together, [requests[k] for k in group])
    assert [p.tokens for p in got] == [exact[k].tokens for k in group]
    (n, t, kind), *_ = together.prefill_log
    longest = max(len(requests[k].prompt_ids) for k in group)
    assert (n, kind) == (len(group), "eager") and t == pick(together.prefill_buckets, longest) != longest


async def test_newcomers_together_prefill_at_static_bucket_shapes_and_their_tokens_do_not_change(lm):
    """``group_prefill`` (``Tuning.group_prefill_graphs``): newcomers that arrive together prefill from static
    buffers at a (batch bucket, length bucket) shape, the rows past them on a scratch slot; every request gets the
    tokens of the exact-shape prefill, the rows already running beside a group are untouched, and no group prefill
    runs at a shape outside the buckets (the shapes a CUDA graph per bucket covers)."""
    requests = mixed(lm)
    joins = [0, 0, 0, 3, 3]  # three together (batch bucket 4: one scratch row), then two beside three running rows
    exact = await drive(lm.runner(slots=6), requests, join_steps=joins)
    static = lm.runner(slots=6, group_prefill=True)
    assert static.kv.k[0].shape[0] == 7 and static.hidden.shape[0] == 7  # the scratch slot past the six
    got = await drive(static, requests, join_steps=joins)
    assert [g.tokens for g in got] == [e.tokens for e in exact]
    assert [(n, kind) for n, _, kind in static.prefill_log] == [(3, "eager"), (2, "eager")]
    assert static.group_batch_log == [4, 2]
    assert {t for _, t, _ in static.prefill_log} <= set(static.group_lengths)
    # a group whose longest prompt is past the static buffers prefills as before, eagerly at its own length
    long_prompt = tuple(3 + k % 400 for k in range(GROUP_PREFILL_MAX_LEN + 40))  # ids inside the tiny vocabulary
    pair = [LMRequest(long_prompt, 5, GREEDY, ignore_eos=True), requests[0]]
    alone = await drive(lm.runner(slots=2, max_len=1024), pair)
    wide = lm.runner(slots=2, max_len=1024, group_prefill=True)
    assert [r.tokens for r in await drive(wide, pair)] == [r.tokens for r in alone]
    assert wide.prefill_log == [(2, len(long_prompt), "eager")] and wide.group_batch_log == []


async def test_the_group_prefill_switch_reaches_the_text_models_runner(lm):
    from omni_stream.engine import AsyncEngine
    from omni_stream.runtime.settings import Tuning

    for on in (False, True):
        tuning = Tuning(group_prefill_graphs=on)
        async with await AsyncEngine.from_pretrained(llm=lm.path, progress=False, tuning=tuning) as engine:
            runner = engine.models.text().runner
            assert runner.group_prefill is on and bool(runner.group_batches) is on
    assert Tuning.from_env({"OMNI_STREAM_GROUP_PREFILL_GRAPHS": "on"}).group_prefill_graphs
    assert (
        Tuning().group_prefill_graphs
        and not Tuning.from_env({"OMNI_STREAM_GROUP_PREFILL_GRAPHS": "off"}).group_prefill_graphs
    )


@pytest.mark.parametrize("group_prefill", [True, False])
def test_admitting_newcomers_costs_the_same_torch_calls_for_two_as_for_seven(lm, group_prefill):
    """A step's newcomers get their device state together: the torch calls of a step (each one hands the
    interpreter to other threads and waits to get it back, which under a loaded server's event loop costs up to a
    switch interval) do not grow with the newcomers admitted."""
    from torch.overrides import TorchFunctionMode

    from omni_stream.batch_model import Batch, Sequence

    class Count(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    def calls_of_first_step(k: int) -> int:
        runner = lm.runner(slots=8, group_prefill=group_prefill)
        text = TEXTS[2]  # one length for all: the prefill's shape depends only on the count
        seqs = [Sequence(seq_id=i, payload=lm.request(text, sampling=SAMPLED, seed=i), slot=i) for i in range(k)]
        Count.calls = 0
        with Count():
            outs = runner.step(Batch(prefill=tuple(seqs)))
        assert len(outs) == k and all(o.error is None for o in outs)
        return Count.calls

    two, seven = calls_of_first_step(2), calls_of_first_step(7)
    assert seven == two, (two, seven)
    # A newcomer whose slot already holds its sampling parameters (the same session's next turn) writes none of
    # them: some twenty calls fewer (five fields, three or four calls each); its tokens are still its own.
    runner = lm.runner(slots=2, group_prefill=group_prefill)
    counts, tokens = [], []
    for i in range(2):
        seq = Sequence(seq_id=i, payload=lm.request(TEXTS[2], sampling=SAMPLED, seed=7), slot=0)
        Count.calls = 0
        with Count():
            (out,) = runner.step(Batch(prefill=(seq,)))
        assert out.error is None
        counts.append(Count.calls)
        tokens.append(runner.recorded[i])
        runner.release(seq)
    assert counts[1] <= counts[0] - 15 and tokens[0] == tokens[1], (counts, tokens)
