"""The batched runner: mixed batches equal solo runs, newcomers join mid-run, length/EOS rules, seeds, cleanup;
stepping ahead (each decode step launched before the last one's frames are handed out) gives the same codes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from reference_qwen import tiny_checkpoint

from omni_stream.batch_model import Batch, Sequence
from omni_stream.chunks import CodecFrames
from omni_stream.errors import InvalidRequestError
from omni_stream.models.qwen3_tts.checkpoint import load_lm
from omni_stream.models.qwen3_tts.config import load_config
from omni_stream.models.qwen3_tts.options import Qwen3TTSOptions
from omni_stream.models.qwen3_tts.prompt import prepare_request
from omni_stream.models.qwen3_tts.runner import Qwen3TTSRunner
from omni_stream.models.qwen3_tts.tokenizer import TextTokenizer
from omni_stream.requests import SamplingParams, SpeechRequest, VoicePrompt

GREEDY = SamplingParams(do_sample=False, temperature=1.0, top_k=0, repetition_penalty=1.05)
SUB_GREEDY = SamplingParams(do_sample=False, temperature=1.0, top_k=0)


@pytest.fixture(scope="module")
def cv(tmp_path_factory):
    path = tiny_checkpoint(tmp_path_factory, "custom_voice", "0.6b")
    cfg = load_config(path)
    return cfg, TextTokenizer(path), load_lm(path, dtype=torch.float32)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = tiny_checkpoint(tmp_path_factory, "base", "0.6b")
    cfg = load_config(path)
    return cfg, TextTokenizer(path), load_lm(path, dtype=torch.float32)


def make(model, *, non_streaming=None, **kw):
    cfg, tok, _ = model
    kw.setdefault("sampling", GREEDY)
    sub = kw.pop("subtalker_sampling", SUB_GREEDY)  # the code predictor's sampler: Qwen3-TTS's own option
    options = Qwen3TTSOptions(subtalker_sampling=sub)
    return prepare_request(SpeechRequest(**kw, options=options), cfg, tok, non_streaming=non_streaming)


def runner(model, slots=4, max_len=256, ahead=False) -> Qwen3TTSRunner:
    return Qwen3TTSRunner(model[2], max_batch_size=slots, max_len=max_len, ahead=ahead)


AHEAD = pytest.mark.parametrize("ahead", [False, True], ids=["synchronous", "ahead"])


@AHEAD
def test_mixed_batch_equals_solo_with_newcomers(cv, ahead) -> None:
    reqs = [
        make(cv, text="Hello world, this is a test.", voice="ryan", language="English", max_new_tokens=14),
        make(cv, text="Good.", voice="dylan", language="Auto", max_new_tokens=9, non_streaming=False),
        make(cv, text="The voice is warm.", voice="sohee", language="Korean", max_new_tokens=12, non_streaming=False),
        make(cv, text="This is the speech test of a voice.", voice="eric", language="Chinese", max_new_tokens=11),
        make(cv, text="Hello.", voice="serena", language="Auto", max_new_tokens=6),
    ]
    r = runner(cv, slots=3, ahead=ahead)
    solo = [r.generate_codes([q])[0] for q in reqs]
    # 3 slots for 5 requests: two join while others decode (at steps 2 and 5), the rest wait for free slots.
    batched = r.generate_codes(reqs, join_steps=[0, 2, 0, 5, 1])
    for i, (a, b) in enumerate(zip(solo, batched, strict=True)):
        assert torch.equal(a, b), i
    assert [len(c) for c in solo] == [13, 8, 11, 10, 5]
    assert r.num_active == 0


@AHEAD
def test_base_batch_mixes_icl_and_x_vector(base, ahead) -> None:
    cfg = base[0]
    rng = np.random.default_rng(1)
    xv = rng.standard_normal(cfg.talker.decoder.hidden_size).astype(np.float32)
    vp = VoicePrompt(x_vector=xv, ref_codes=rng.integers(0, 2048, (4, 16)), ref_text="Hello.")
    reqs = [
        make(base, text="This is a test of the voice.", voice_prompt=vp, max_new_tokens=10),
        make(base, text="Hello world.", voice_prompt=vp, x_vector_only_mode=True, max_new_tokens=8),
        make(base, text="Good.", voice_prompt=vp, language="English", max_new_tokens=9, non_streaming=True),
    ]
    r = runner(base, ahead=ahead)
    solo = [r.generate_codes([q])[0] for q in reqs]
    batched = r.generate_codes(reqs, join_steps=[0, 3, 1])
    assert all(torch.equal(a, b) for a, b in zip(solo, batched, strict=True))


def test_frames_stream_one_per_step_with_final_flag(cv) -> None:
    r = runner(cv)
    seq = Sequence(seq_id=7, payload=make(cv, text="Hello.", voice="ryan", max_new_tokens=4), slot=2)
    outs = r.step(Batch(prefill=(seq,)))
    frames = [outs[0].item]
    while not outs[0].finished:
        outs = r.step(Batch(decode=(seq,)))
        frames.append(outs[0].item)
    assert all(isinstance(f, CodecFrames) for f in frames)
    assert [f.start_frame for f in frames] == [0, 1, 2]
    assert [f.final for f in frames] == [False, False, True]
    assert all(
        f.codes.shape == (1, 16) and f.codes.dtype == torch.int64 and f.codes.device.type == "cpu" for f in frames
    )
    r.release(seq)
    assert r.num_active == 0 and seq.model_state is None


@AHEAD
def test_one_token_gives_no_frames_and_ignore_eos_gives_n(cv, ahead) -> None:
    r = runner(cv, ahead=ahead)
    out = r.generate_codes([make(cv, text="Hello.", voice="ryan", max_new_tokens=1)])[0]
    assert out.shape == (0, 16)
    out = r.generate_codes([make(cv, text="Hello.", voice="ryan", max_new_tokens=7, ignore_eos=True)])[0]
    assert out.shape == (7, 16)
    assert (out[:, 0] < 2048).all()


def test_request_too_long_for_context_is_rejected_cleanly(cv) -> None:
    r = runner(cv, max_len=32)
    ok = Sequence(seq_id=1, payload=make(cv, text="Hello.", voice="ryan", max_new_tokens=4), slot=0)
    bad = Sequence(seq_id=2, payload=make(cv, text="Hello.", voice="ryan", max_new_tokens=100), slot=1)
    outs = r.step(Batch(prefill=(ok, bad)))
    assert outs[0].error is None and outs[0].item is not None
    assert isinstance(outs[1].error, InvalidRequestError) and outs[1].error.param == "max_new_tokens"
    assert outs[1].finished and bad.model_state is None
    assert r.num_active == 1
    r.release(ok)
    assert r.num_active == 0
    with pytest.raises(InvalidRequestError):
        r.generate_codes([bad.payload])
    assert r.num_active == 0


def _sampled(model, seed, **kw):
    kw = dict(text="Hello world, this is a test.", voice="ryan", max_new_tokens=10, seed=seed) | kw
    return make(
        model,
        sampling=SamplingParams(do_sample=True, temperature=0.9, top_k=50, repetition_penalty=1.05),
        subtalker_sampling=SamplingParams(do_sample=True, temperature=0.9, top_k=50),
        **kw,
    )


@AHEAD
def test_seed_reproduces_and_batching_keeps_per_row_streams(cv, ahead) -> None:
    r = runner(cv, ahead=ahead)
    a1 = r.generate_codes([_sampled(cv, 1)])[0]
    a2 = r.generate_codes([_sampled(cv, 1)])[0]
    b = r.generate_codes([_sampled(cv, 2)])[0]
    assert torch.equal(a1, a2)
    assert not torch.equal(a1, b)
    greedy = make(cv, text="Hello.", voice="vivian", max_new_tokens=8)
    g_solo = r.generate_codes([greedy])[0]
    hot = _sampled(
        cv, 3, voice="aiden",
    )  # fmt: skip
    hot_solo = r.generate_codes([hot])[0]
    mixed = r.generate_codes([_sampled(cv, 1), greedy, hot], join_steps=[0, 2, 1])
    assert torch.equal(mixed[0], a1) and torch.equal(mixed[1], g_solo) and torch.equal(mixed[2], hot_solo)


def _drive(r: Qwen3TTSRunner, joins: dict[int, list[Sequence]], steps: int = 64) -> tuple[dict, dict]:
    """Step ``r`` by hand: ``joins[k]`` are prefilled at step ``k``; returns (codes, errors) by seq_id."""
    frames: dict[int, list[torch.Tensor]] = {}
    errors: dict[int, BaseException] = {}
    running: list[Sequence] = []
    for k in range(steps):
        newcomers = joins.get(k, [])
        if not newcomers and not running:
            if k > max(joins):
                break
            continue
        outs = r.step(Batch(prefill=tuple(newcomers), decode=tuple(running)))
        running = [*running, *newcomers]
        for out in outs:
            seq = next(s for s in running if s.seq_id == out.seq_id)
            if out.item is not None:
                frames.setdefault(out.seq_id, []).append(out.item.codes)
            if out.error is not None:
                errors[out.seq_id] = out.error
            if out.finished:
                r.release(seq)
                running.remove(seq)
    codes = {i: torch.cat(f) for i, f in frames.items()}
    return codes, errors


@AHEAD
def test_a_failing_newcomer_ends_alone_and_running_rows_keep_their_codes(cv, monkeypatch, ahead) -> None:
    from omni_stream.models.qwen3_tts import runner as runner_mod

    running_req = make(cv, text="Hello world, this is a test.", voice="ryan", max_new_tokens=10)
    good_req = make(cv, text="Good.", voice="dylan", max_new_tokens=6)
    raises_req = make(cv, text="Hello.", voice="serena", max_new_tokens=6)
    misshapen_req = make(cv, text="The voice is warm.", voice="sohee", max_new_tokens=6)
    r = runner(cv, slots=4, ahead=ahead)
    solo_running = r.generate_codes([running_req])[0]
    solo_good = r.generate_codes([good_req])[0]
    real_embed = runner_mod.embed_prompts
    calls: list[int] = []

    def embed(talker, cfg, prompts):
        calls.append(len(prompts))
        if any(p is raises_req.prompt for p in prompts):
            raise RuntimeError("embedding failed")
        out = real_embed(talker, cfg, prompts)
        # Admitted, but fails the batched prefill (and its own solo prefill) on its hidden width.
        return [(x[:, :-1], t) if p is misshapen_req.prompt else (x, t) for p, (x, t) in zip(prompts, out, strict=True)]

    monkeypatch.setattr(runner_mod, "embed_prompts", embed)
    seqs = [Sequence(seq_id=i, payload=q, slot=i) for i, q in enumerate([running_req, raises_req, misshapen_req])]
    seqs.append(Sequence(seq_id=3, payload=good_req, slot=3))
    codes, errors = _drive(r, {0: [seqs[0]], 3: seqs[1:]})
    assert set(errors) == {1, 2}
    assert isinstance(errors[1], RuntimeError) and "embedding failed" in str(errors[1])
    assert not isinstance(errors[2], InvalidRequestError)
    assert torch.equal(codes[0], solo_running)
    assert torch.equal(codes[3], solo_good)
    assert 1 not in codes and 2 not in codes
    assert r.num_active == 0 and all(s.model_state is None for s in seqs)
    # the running row's prompt alone, then the three newcomers together, which failed, so each alone
    assert calls == [1, 3, 1, 1, 1]


@AHEAD
def test_a_failing_lone_newcomer_does_not_touch_the_running_row(cv, monkeypatch, ahead) -> None:
    from omni_stream.models.qwen3_tts import runner as runner_mod

    running_req = make(cv, text="Hello world, this is a test.", voice="ryan", max_new_tokens=8)
    bad_req = make(cv, text="Hello.", voice="serena", max_new_tokens=6)
    r = runner(cv, slots=2, ahead=ahead)
    solo = r.generate_codes([running_req])[0]
    real_embed = runner_mod.embed_prompts

    def embed(talker, cfg, prompts):
        out = real_embed(talker, cfg, prompts)
        return [(x[:, :-1], t) if p is bad_req.prompt else (x, t) for p, (x, t) in zip(prompts, out, strict=True)]

    monkeypatch.setattr(runner_mod, "embed_prompts", embed)
    ok, bad = Sequence(seq_id=0, payload=running_req, slot=0), Sequence(seq_id=1, payload=bad_req, slot=1)
    codes, errors = _drive(r, {0: [ok], 2: [bad]})
    assert set(errors) == {1} and torch.equal(codes[0], solo)
    assert r.num_active == 0 and bad.model_state is None


def test_newcomers_of_one_step_get_their_own_slot_state(cv) -> None:
    from omni_stream.requests import SamplingParams

    hot = SamplingParams(do_sample=True, temperature=0.7, top_k=30, top_p=0.8, repetition_penalty=1.2)
    reqs = [  # any 64-bit seed: the runner takes it mod 2**63
        make(cv, text="Hello world, this is a test.", voice="ryan", max_new_tokens=6, seed=-(1 << 63) + 5),
        make(cv, text="Good.", voice="dylan", max_new_tokens=6, ignore_eos=True, sampling=hot, seed=7),
        make(cv, text="A third one, unseeded.", voice="sohee", max_new_tokens=6, non_streaming=False),
    ]
    r = runner(cv, slots=4)
    seqs = [Sequence(seq_id=i, payload=q, slot=slot) for i, (q, slot) in enumerate(zip(reqs, (2, 0, 3), strict=True))]
    r.step(Batch(prefill=tuple(seqs)))
    slots = [s.slot for s in seqs]
    assert r.steps[slots].tolist() == [1, 1, 1]  # reset at admission, then the step's frame
    assert r.lengths[slots].tolist() == [q.prompt.prefill_len + 1 for q in reqs]
    assert r.trailing_len[slots].tolist() == [q.prompt.trailing_len for q in reqs] and reqs[2].prompt.trailing_len > 0
    assert r.no_eos[slots].tolist() == [False, True, False]
    assert r.seeds[slots].tolist()[:2] == [5, 7]
    assert r.talker_params.do_sample[slots].tolist() == [False, True, False]
    assert r.talker_params.top_k[slots].tolist() == [GREEDY.top_k, 30, GREEDY.top_k]
    temperatures = torch.tensor([GREEDY.temperature, 0.7, GREEDY.temperature])
    assert torch.allclose(r.talker_params.temperature[slots], temperatures)
    assert torch.allclose(r.talker_params.repetition_penalty[slots][1], torch.tensor(1.2))
    assert r.cp_params.top_p[slots].tolist() == [SUB_GREEDY.top_p] * 3
    for s in seqs:
        r.release(s)


def _codes_by_hand(
    r: Qwen3TTSRunner, joins: dict[int, list[Sequence]], paused: dict[int, range] | None = None, calls: int = 40
) -> dict[int, list]:
    """Step ``r`` by hand: ``joins[k]`` are prefilled at call ``k``; a row whose ``paused`` range holds ``k`` is left
    out of call ``k``; finished rows leave (not released). Every output of every call, by seq_id."""
    outs: dict[int, list] = {}
    running: list[Sequence] = []
    for k in range(calls):
        decode = [s for s in running if k not in (paused or {}).get(s.seq_id, ())]
        newcomers = joins.get(k, [])
        if not newcomers and not decode:
            continue
        for out in r.step(Batch(prefill=tuple(newcomers), decode=tuple(decode))):
            outs.setdefault(out.seq_id, []).append(out)
            if out.finished:
                running = [s for s in running if s.seq_id != out.seq_id]
        running += [s for s in newcomers if not outs[s.seq_id][-1].finished]
    return outs


def test_ahead_hands_each_frame_out_with_the_call_after_its_launch(cv) -> None:
    req = make(cv, text="Hello.", voice="ryan", max_new_tokens=4)
    expected = runner(cv).generate_codes([req])[0]
    r = runner(cv, ahead=True)
    seq = Sequence(seq_id=7, payload=req, slot=2)
    outs = [r.step(Batch(prefill=(seq,)))[0]]
    assert outs[0].item is None and not outs[0].finished and r._inflight is not None  # launched, not handed out
    while not outs[-1].finished:
        outs.append(r.step(Batch(decode=(seq,)))[0])
    frames = [o.item for o in outs[1:]]
    assert [f.start_frame for f in frames] == [0, 1, 2] and [f.final for f in frames] == [False, False, True]
    assert torch.equal(torch.cat([f.codes for f in frames]), expected)
    assert r._inflight is None  # the final frame's row was not launched again
    r.release(seq)
    assert r.num_active == 0


def test_ahead_keeps_a_paused_row_s_frame_until_it_is_stepped_again(cv) -> None:
    """A row the scheduler leaves out (paused on backpressure) after its step was launched gets that frame when
    it comes back, and is not stepped meanwhile; its codes and its neighbour's equal their solo runs."""
    a_req = make(cv, text="Hello world, this is a test.", voice="ryan", max_new_tokens=9)
    b_req = make(cv, text="The voice is warm.", voice="sohee", max_new_tokens=7)
    solo = runner(cv).generate_codes([a_req, b_req])
    r = runner(cv, ahead=True)
    a, b = Sequence(seq_id=0, payload=a_req, slot=0), Sequence(seq_id=1, payload=b_req, slot=1)
    outs = _codes_by_hand(r, {0: [a, b]}, paused={1: range(3, 6)})
    b_items = [o.item for o in outs[1]]
    assert b_items[3] is not None and b_items[3].start_frame == 2  # the frame launched before the pause
    assert r.lengths[1].item() == b_req.prompt.prefill_len + 6  # no step while paused, none after the last
    for seq, expected in zip((a, b), solo, strict=True):
        got = [o.item.codes for o in outs[seq.seq_id] if o.item is not None]
        assert torch.equal(torch.cat(got), expected), seq.seq_id
        assert sum(o.finished for o in outs[seq.seq_id]) == 1 and outs[seq.seq_id][-1].finished


def test_ahead_drops_a_released_row_s_frame_and_its_slot_s_next_owner_decodes_as_alone(cv) -> None:
    first = make(cv, text="Hello world, this is a test.", voice="ryan", max_new_tokens=9)
    second = make(cv, text="Good.", voice="dylan", max_new_tokens=6, non_streaming=False)
    expected = runner(cv).generate_codes([second])[0]
    r = runner(cv, ahead=True)
    gone = Sequence(seq_id=0, payload=first, slot=0)
    _codes_by_hand(r, {0: [gone]}, calls=3)
    assert r._inflight is not None and r._inflight.states[0] is gone.model_state
    r.release(gone)  # while its third step is in flight
    nxt = Sequence(seq_id=1, payload=second, slot=0)
    outs = _codes_by_hand(r, {0: [nxt]})
    assert 0 not in outs and outs[1][-1].finished
    assert torch.equal(torch.cat([o.item.codes for o in outs[1] if o.item is not None]), expected)


@AHEAD
def test_an_eos_ends_the_row_without_another_step(cv, ahead) -> None:
    """EOS is known when its frame is collected: the row ends there and no step is launched for it after."""
    req = make(cv, text="Hello world, this is a test.", voice="ryan", max_new_tokens=12)
    free = runner(cv).generate_codes([req])[0]
    r = runner(cv, ahead=ahead)
    r.eos = int(free[4, 0])  # a code 0 the greedy run draws at its fifth frame stands in for EOS
    assert int(free[2, 0]) != r.eos and int(free[3, 0]) != r.eos
    codes = r.generate_codes([req])[0]
    cut = next(i for i in range(2, len(free)) if int(free[i, 0]) == r.eos)
    assert torch.equal(codes, free[:cut])
    assert r.graph_steps + r.eager_steps == cut + 1 and r._inflight is None
