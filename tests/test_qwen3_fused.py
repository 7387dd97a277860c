"""The fused layer path: the same function as the modules, weights shared not copied, Triton kernels = torch ones."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from reference_qwen import tiny_checkpoint

from omni_stream.models.qwen3_tts.checkpoint import load_lm
from omni_stream.models.qwen3_tts.config import load_config
from omni_stream.models.qwen3_tts.options import Qwen3TTSOptions
from omni_stream.models.qwen3_tts.prompt import prepare_request
from omni_stream.models.qwen3_tts.runner import Qwen3TTSRunner
from omni_stream.models.qwen3_tts.tokenizer import TextTokenizer
from omni_stream.requests import SamplingParams, SpeechRequest
from omni_stream.runtime import decoder_kernels as fused
from omni_stream.runtime.decoder import DecoderLayer, RMSNorm, run_layers
from omni_stream.runtime.kv_cache import attention

GREEDY = SamplingParams(do_sample=False, temperature=1.0, top_k=0, repetition_penalty=1.05)


@pytest.fixture(scope="module")
def cv(tmp_path_factory):
    path = tiny_checkpoint(tmp_path_factory, "custom_voice", "1.7b")
    return load_config(path), TextTokenizer(path), path


def _stack(cfg, n: int = 3) -> tuple[torch.nn.ModuleList, RMSNorm]:
    d = cfg.talker.decoder
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(DecoderLayer(d) for _ in range(n)).eval()
    norm = RMSNorm(d.hidden_size, d.rms_norm_eps)
    for p in [*layers.parameters(), *norm.parameters()]:
        p.data.normal_(0, 0.3)
    return layers, norm


def _run(layers, norm, b: int, t: int, cfg) -> torch.Tensor:
    d = cfg.talker.decoder
    gen = torch.Generator().manual_seed(b * 100 + t)
    x = torch.randn(b, t, d.hidden_size, generator=gen)
    angles = torch.rand(b, t, d.head_dim // 2, generator=gen) * 6.0
    emb = torch.cat((angles, angles), -1)
    causal = torch.ones(t, t, dtype=torch.bool).tril()

    def attend(_layer: int, q, k, v):
        return attention(q, k, v, causal)

    with torch.no_grad():
        return run_layers(layers, norm, x, emb.cos(), emb.sin(), attend)


SHAPES = ((1, 1), (3, 1), (2, 7), (3, 7))  # 1, 3 and 14 rows are a small batch, 21 are not


def _counting_small(calls: list[tuple[str, int]]) -> fused.SmallRows:
    """The torch small-row projections, recording (form, output width) of each call."""

    def linear(x, weight, bias=None):
        calls.append(("linear", weight.shape[0]))
        return torch.nn.functional.linear(x, weight, bias)

    def embed_linear(table, ids, weight, bias):
        calls.append(("embed", weight.shape[0]))
        return fused.embed_linear(table, ids, weight, bias)

    return fused.SmallRows(linear, embed_linear)


def test_small_batches_route_every_projection_through_the_kernels_linear(cv) -> None:
    cfg = cv[0]
    layers, norm = _stack(cfg)
    ref = [_run(layers, norm, b, t, cfg) for b, t in SHAPES]
    calls: list[tuple[str, int]] = []
    kernels = dataclasses.replace(fused.TORCH, small=_counting_small(calls), small_rows=16)
    for layer in layers:
        layer.use_kernels(kernels)
    d = cfg.talker.decoder
    per_layer = [(d.num_attention_heads + 2 * d.num_key_value_heads) * d.head_dim, d.hidden_size,
                 2 * d.intermediate_size, d.hidden_size]  # fmt: skip
    for (b, t), want in zip(SHAPES, ref, strict=True):
        calls.clear()
        torch.testing.assert_close(_run(layers, norm, b, t, cfg), want, rtol=1e-5, atol=1e-5)
        assert calls == ([("linear", w) for w in per_layer] * 3 if b * t <= 16 else [])


def test_code_predictor_takes_its_own_row_limit_and_reads_its_inputs_from_the_tables(cv) -> None:
    """At small batch the predictor's next input is its projection reading the embedding table; with a
    predictor row limit of 1 a two-row frame goes the cuBLAS way in the predictor while the talker keeps 16;
    the codes are the module path's in every case."""
    cfg, tok, path = cv
    lm = load_lm(path, dtype=torch.float32)
    reqs = []
    for t, v in (("Hello there, a first test.", "ryan"), ("Good.", "dylan")):
        req = SpeechRequest(text=t, voice=v, language="English", max_new_tokens=6, sampling=GREEDY,
                            options=Qwen3TTSOptions(subtalker_sampling=GREEDY))  # fmt: skip
        reqs.append(prepare_request(req, cfg, tok))
    expected = Qwen3TTSRunner(lm, max_batch_size=2, max_len=256).generate_codes(reqs)
    assert cfg.talker.decoder.hidden_size != cfg.code_predictor.hidden_size  # the predictor has an input projection
    cp = lm.talker.code_predictor
    sizes: list[int] = []
    generate = cp.generate

    def recording(hidden, *args):
        sizes.append(hidden.shape[0])
        return generate(hidden, *args)

    cp.generate = recording
    try:
        for predictor_rows in (None, 1):
            calls: list[tuple[str, int]] = []
            sizes.clear()
            kernels = dataclasses.replace(fused.TORCH, small=_counting_small(calls), small_rows=16,
                                          predictor_rows=predictor_rows)  # fmt: skip
            runner = Qwen3TTSRunner(lm, max_batch_size=2, max_len=256, fused=kernels)
            assert cp.kernels is not None and cp.kernels.small_rows == (16 if predictor_rows is None else 1)
            assert lm.talker.model.layers[0].kernels is kernels and lm.talker.kernels is kernels
            got = runner.generate_codes(reqs)
            assert all(torch.equal(g, e) for g, e in zip(got, expected, strict=True))
            small = sum(1 for b in sizes if b <= cp.kernels.small_rows)  # frames the predictor ran the small way
            assert 2 in sizes and (small == len(sizes)) == (predictor_rows is None)
            embeds = sum(1 for form, _ in calls if form == "embed")
            heads = sum(1 for form, width in calls if form == "linear" and width == cfg.code_predictor.vocab_size)
            assert (embeds, heads) == (14 * small, 15 * small)
    finally:
        del cp.generate
    lm.talker.use_kernels(None)


def test_fused_layers_write_k_and_v_into_a_cache_attend_target(cv) -> None:
    """The kernel that makes k writes k and v into the cache (no copies); the result equals the copying path."""
    from omni_stream.runtime.kv_cache import KVShape, SlotKVCache

    cfg = cv[0]
    d = cfg.talker.decoder
    layers, norm = _stack(cfg)
    calls = []

    def counting(*args):
        calls.append(args[-1])
        return fused.qk_norm_rope_kv(*args)

    reads = []

    def reading(q, src):
        reads.append((src.slots, src.last, src.span))
        return fused.read_one(q, src)

    kernels = dataclasses.replace(fused.TORCH, qk_norm_rope_kv=counting, decode_attention=reading)
    for layer in layers:
        layer.use_kernels(kernels)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 1, d.hidden_size, generator=gen)
    lengths = torch.tensor([4, 6])
    angles = lengths[:, None, None].float() * torch.rand(1, 1, d.head_dim // 2, generator=gen)
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    out = []
    for direct in (True, False):
        cache = SlotKVCache(KVShape(3, 2, d.num_key_value_heads, 9, d.head_dim), dtype=torch.float32, device="cpu")
        cache.k.normal_(generator=torch.Generator().manual_seed(4))  # earlier positions: some history
        cache.v.normal_(generator=torch.Generator().manual_seed(5))
        attend = cache.decode_rows(torch.arange(2), lengths, lengths, 8)
        if not direct:  # a plain callable: the layer hands k and v to it and it copies them
            attend = attend.__call__
        with torch.no_grad():
            out.append((run_layers(layers, norm, x, cos, sin, attend), cache.k.clone(), cache.v.clone()))
    assert len(calls) == 3 and all(c.slots.shape == (2,) for c in calls)  # three layers, direct run only
    # and the one-token read went to the decode-attention function: each row up to its own length, no mask
    assert len(reads) == 3 and all(torch.equal(last, lengths) and span == 8 for _, last, span in reads)
    for a, b in zip(*out, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_fused_stack_equals_module_stack_and_shares_weights(cv) -> None:
    cfg = cv[0]
    layers, norm = _stack(cfg)
    before = {k: v.clone() for k, v in layers.state_dict().items()}
    ref = [_run(layers, norm, b, t, cfg) for b, t in SHAPES]
    for layer in layers:
        layer.use_kernels(fused.TORCH)
    out = [_run(layers, norm, b, t, cfg) for b, t in SHAPES]
    for r, o in zip(ref, out, strict=True):
        assert o.abs().max() > 0.1
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)
    # The state dict is unchanged and the projections read the concatenations (no second copy of the weights).
    after = layers.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    layer = layers[0]
    a = layer.self_attn
    assert a.q_proj.weight.data_ptr() == layer.qkv_weight.data_ptr()
    assert a.v_proj.weight.untyped_storage().data_ptr() == layer.qkv_weight.untyped_storage().data_ptr()
    assert layer.mlp.up_proj.weight.untyped_storage().data_ptr() == layer.gate_up_weight.untyped_storage().data_ptr()
    assert a.k_norm.weight.untyped_storage().data_ptr() == layer.qk_norm_weight.untyped_storage().data_ptr()
    # Weights loaded in place afterwards reach the fused path; None returns to the modules.
    with torch.no_grad():
        a.k_proj.weight.add_(0.5)
        a.k_norm.weight.mul_(2.0)
    for lyr in layers:
        lyr.use_kernels(None)
    changed = _run(layers, norm, 2, 7, cfg)
    assert not torch.allclose(changed, ref[2])
    for lyr in layers:
        lyr.use_kernels(fused.TORCH)
    torch.testing.assert_close(_run(layers, norm, 2, 7, cfg), changed, rtol=1e-5, atol=1e-5)


def test_runner_with_fused_layers_gives_the_module_codes(cv) -> None:
    cfg, tok, path = cv
    lm = load_lm(path, dtype=torch.float32)
    texts = (("Hello there, a first test.", "ryan"), ("Good.", "dylan"), ("A third, longer one.", "sohee"))
    reqs = []
    for t, v in texts:
        req = SpeechRequest(text=t, voice=v, language="English", max_new_tokens=10, sampling=GREEDY,
                            options=Qwen3TTSOptions(subtalker_sampling=GREEDY))  # fmt: skip
        reqs.append(prepare_request(req, cfg, tok))
    plain = Qwen3TTSRunner(lm, max_batch_size=4, max_len=256)
    assert plain.kernels is None and all(layer.kernels is None for layer in lm.talker.model.layers)
    expected = plain.generate_codes(reqs, join_steps=[0, 1, 0])
    fast = Qwen3TTSRunner(lm, max_batch_size=4, max_len=256, fused=fused.TORCH)
    assert all(layer.kernels is fused.TORCH for layer in lm.talker.code_predictor.model.layers)
    got = fast.generate_codes(reqs, join_steps=[0, 1, 0])
    assert all(len(g) == 9 for g in got)
    assert all(torch.equal(g, e) for g, e in zip(got, expected, strict=True))
    with pytest.raises(ValueError, match="CUDA"):
        Qwen3TTSRunner(lm, max_batch_size=2, max_len=64, fused=True)


_TRITON_CHECK = textwrap.dedent(
    """
    import torch
    from omni_stream.runtime import decoder_kernels as fused
    from omni_stream.runtime import triton_kernels as tk

    g = torch.Generator().manual_seed(0)
    def r(*s):
        return torch.randn(*s, generator=g)

    for rows, h in ((1, 96), (5, 200)):
        x, d, w = r(rows, 1, h), r(rows, 1, h), r(h)
        for delta in (None, d):
            got, want = tk.add_rms_norm(x, delta, w, 1e-6), fused.add_rms_norm(x, delta, w, 1e-6)
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for b, t, hq, hkv, dim in ((1, 1, 4, 2, 16), (3, 2, 6, 2, 8)):
        qkv, nw = r(b, t, (hq + 2 * hkv) * dim), r(2, dim)
        ang = torch.rand(b, t, dim // 2, generator=g) * 6
        emb = torch.cat((ang, ang), -1)
        cos, sin = emb.cos(), emb.sin()
        if b > 1:  # the code predictor passes batch-broadcast tables
            cos, sin = cos[:1].expand(b, -1, -1), sin[:1].expand(b, -1, -1)
        got = tk.qk_norm_rope(qkv, nw, cos, sin, 1e-6, hq, hkv)
        want = fused.qk_norm_rope(qkv, nw, cos, sin, 1e-6, hq, hkv)
        for a, c in zip(got, want):
            assert a.shape == c.shape
            torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)
    for shape in ((1, 1, 2 * 40), (3, 2, 2 * 1500)):
        gu = r(*shape)
        torch.testing.assert_close(tk.silu_mul(gu), fused.silu_mul(gu), rtol=1e-5, atol=1e-5)
    from omni_stream.requests import SamplingParams
    from omni_stream.runtime.sampling import SamplingTensors, sample

    kinds = [
        SamplingParams(do_sample=False), SamplingParams(temperature=0.9, top_k=50), SamplingParams(top_k=5, top_p=0.8),
        SamplingParams(top_k=0, top_p=0.5), SamplingParams(top_k=1), SamplingParams(temperature=1.3, top_k=0),
        SamplingParams(top_k=5000, top_p=0.95), SamplingParams(temperature=0.5, top_k=20, top_p=0.3),
    ]
    for vocab in (300,):  # the interpreter sorts slowly (~1 s a row); the GPU suite covers the real vocabularies
        params = SamplingTensors.from_params(kinds)
        b = len(kinds)
        noise = torch.empty(b, 3, vocab).exponential_(generator=g)[:, 1]  # a strided view, as the loop passes
        for scale in (1.0, 8.0):
            logits = r(b, vocab) * scale
            assert torch.equal(tk.sample(logits, params, noise), sample(logits, params, noise))
            assert torch.equal(tk.sample(logits, params, None), logits.argmax(-1))
        # many ties (whole-number logits) at the top-k cut-off: every tie kept, as the torch version keeps them
        tied = [p for p in kinds if p.top_p >= 1.0]
        params = SamplingTensors.from_params(tied)
        logits = (r(len(tied), vocab) * 3).round()
        assert torch.equal(tk.sample(logits, params, noise[: len(tied)]), sample(logits, params, noise[: len(tied)]))
    for m, n, k in ((1, 40, 96), (5, 200, 72), (16, 33, 300)):
        w, bias, x = r(n, k), r(n), r(m, 1, k)
        for bb in (None, bias):
            want = torch.nn.functional.linear(x, w, bb)
            torch.testing.assert_close(tk.linear(x, w, bb), want, rtol=1e-5, atol=1e-4)
    # the embedding lookup read by the projection (with a bias); a row alone = the same row among others, in bits
    for m, n, k in ((1, 40, 96), (5, 200, 72), (16, 33, 300)):
        w, table, bias, ids = r(n, k), r(50, k), r(n), torch.randint(0, 50, (m,), generator=g)
        got = tk.embed_linear(table, ids, w, bias)
        torch.testing.assert_close(got, fused.embed_linear(table, ids, w, bias), rtol=1e-5, atol=1e-4)
        assert torch.equal(tk.embed_linear(table, ids[-1:], w, bias)[0], got[-1])
    from omni_stream.runtime.kv_cache import KVWrite

    hq, hkv, dim = 4, 2, 16
    for b, t, start in ((3, 2, torch.tensor([1, 5, 0])), (3, 1, torch.tensor([7]).expand(3))):
        qkv, nw = r(b, t, (hq + 2 * hkv) * dim), r(2, dim)
        ang = torch.rand(1, t, dim // 2, generator=g) * 6
        emb = torch.cat((ang, ang), -1)
        cos, sin = emb.cos().expand(b, -1, -1), emb.sin().expand(b, -1, -1)
        caches = []
        for fn in (tk.qk_norm_rope_kv, fused.qk_norm_rope_kv):
            kc, vc = torch.zeros(4, hkv, 10, dim), torch.zeros(4, hkv, 10, dim)
            q = fn(qkv, nw, cos, sin, 1e-6, hq, hkv, KVWrite(kc, vc, torch.tensor([2, 0, 3]), start))
            caches.append((q, kc, vc))
        for a, c in zip(*caches):
            torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)
        assert caches[0][1].abs().sum() > 0 and caches[0][2][1].abs().sum() == 0  # slot 1 untouched
    from omni_stream.runtime.kv_cache import KVRead, read_one

    # decode attention: GQA groups of 2 and 3 (padded to 4), rows at different lengths, one past the span,
    # a stride-0 length (the code predictor's), keys over several 32-position blocks
    for hq, hkv, dim, pos, span, last in (
        (4, 2, 16, 12, 9, torch.tensor([0, 5, 40])),
        (6, 2, 8, 80, 70, torch.tensor([66]).expand(3)),
        (2, 2, 16, 80, 80, torch.tensor([31, 32, 79])),
    ):
        kc, vc = r(4, hkv, pos, dim), r(4, hkv, pos, dim)
        slots = torch.tensor([2, 0, 3])
        q = r(3, 1, hq, dim)
        src = KVRead(kc, vc, slots, last, span)
        got, want = tk.decode_attention(q, src), read_one(q, src)
        assert got.shape == (3, 1, hq * dim)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        alone = tk.decode_attention(q[1:2], KVRead(kc, vc, slots[1:2], last[1:2], span))
        assert torch.equal(alone[0], got[1])  # a row's result does not depend on its batch
    assert tk.SMALL_ROWS == fused.SMALL_ROWS  # the layer routes at most the kernel's row tile to it
    for too_many in (lambda: tk.linear(r(17, 8), r(4, 8)),
                     lambda: tk.embed_linear(r(20, 8), torch.zeros(17, dtype=torch.long), r(4, 8), None)):  # fmt: skip
        try:
            too_many()
        except ValueError as e:
            assert "at most 16 rows" in str(e)
        else:
            raise AssertionError("17 rows accepted")
    print("triton kernels ok")
    """
)


def test_triton_kernels_equal_the_torch_versions(tmp_path: Path) -> None:
    """Run through Triton's interpreter on the CPU (fp32; the GPU suite checks bf16 on the device)."""
    pytest.importorskip("triton")
    script = tmp_path / "check.py"
    script.write_text(_TRITON_CHECK)
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "triton kernels ok" in done.stdout


def test_the_code_predictor_takes_its_own_row_limit() -> None:
    kernels = dataclasses.replace(fused.TORCH, small_rows=16, predictor_rows=4)
    assert kernels.for_predictor().small_rows == 4 and kernels.for_predictor().small is kernels.small
    assert fused.TORCH.for_predictor() is fused.TORCH


_SPECIALIZATION_CHECK = textwrap.dedent(
    """
    import inspect, sys
    import torch
    from omni_stream.runtime import decoder_kernels as fused
    from omni_stream.models.qwen3_tts.checkpoint import load_lm
    from omni_stream.models.qwen3_tts.config import load_config
    from omni_stream.models.qwen3_tts.prompt import prepare_request
    from omni_stream.models.qwen3_tts.runner import Qwen3TTSRunner
    from omni_stream.models.qwen3_tts.tokenizer import TextTokenizer
    from omni_stream.models.qwen3_tts.options import Qwen3TTSOptions
    from omni_stream.requests import SamplingParams, SpeechRequest
    from omni_stream.runtime.settings import Tuning
    from omni_stream.runtime import triton_kernels as tk

    # What a launch compiles for, by Triton's rules: each tensor's dtype and 16-byte alignment, each integer's
    # class (1, a multiple of 16, other) unless the kernel leaves it unspecialized, and the constexprs.
    def kind(v, free):
        if free:
            return "free"
        if isinstance(v, torch.Tensor):
            return (str(v.dtype), v.data_ptr() % 16 == 0)
        if isinstance(v, bool) or not isinstance(v, int):
            return type(v).__name__
        return "1" if v == 1 else "16n" if v % 16 == 0 else "int"

    seen, phase = {}, ["start-up"]

    class Recording:
        def __init__(self, name):
            self.name, self.kernel = name, getattr(tk, name)
            self.params = list(inspect.signature(self.kernel.fn).parameters)
            self.free = set(tk.UNSPECIALIZED.get(name, ()))
        def __getitem__(self, grid):
            launch = self.kernel[grid]
            def run(*args, **kwargs):
                key = (self.name, tuple(kind(a, p in self.free) for p, a in zip(self.params, args)),
                       tuple(sorted((k, repr(v)) for k, v in kwargs.items())))
                seen.setdefault(key, phase[0])
                return launch(*args, **kwargs)
            return run

    names = [n for n in dir(tk) if n.startswith("_") and n.endswith("_kernel") and hasattr(getattr(tk, n), "fn")]
    assert len(names) >= 6, names
    for name in names:
        setattr(tk, name, Recording(name))
    path = sys.argv[1]
    cfg, tok, lm = load_config(path), TextTokenizer(path), load_lm(path, dtype=torch.float32)
    greedy = SamplingParams(do_sample=False)

    def requests(n):
        options = Qwen3TTSOptions(subtalker_sampling=greedy)
        return [prepare_request(SpeechRequest(text="Hello there.", voice="ryan", max_new_tokens=2, ignore_eos=True,
                                              sampling=greedy, options=options), cfg, tok)
                for _ in range(n)]

    # the code predictor on torch keeps the interpreter's time down: its projections take at most 16 rows
    rows = Tuning(small_rows=16, predictor_small_rows=0)
    runner = Qwen3TTSRunner(lm, max_batch_size=2, max_len=128, graphs=False, fused=fused.triton_kernels(rows))
    runner.pad_eager = True  # eager steps at the shapes CUDA graphs capture at start-up
    runner.prefill_batch_buckets = (1,)  # prefill graphs of one newcomer: two at once prefill eagerly
    length = requests(1)[0].prompt.prefill_len
    assert length % 16 and length < min(runner.prefill_buckets), length
    runner.generate_codes(requests(2), join_steps=[0, 1])  # bucketed prefills, decode at 1 and 2 rows
    phase[0] = "burst"
    runner.generate_codes(requests(2))  # two newcomers at once: one eager prefill at the prompt's own length
    assert runner.prefill_graph_calls == 0 and len(seen) > 10
    new = [key for key, first in seen.items() if first == "burst"]
    assert not new, new
    print("no new specialization")
    """
)


def test_the_compiled_kernels_leave_the_declared_arguments_unspecialized() -> None:
    """The jit decorators carry ``UNSPECIALIZED`` (which the interpreter run below cannot see)."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("interpreted kernels keep no specialization settings")
    from omni_stream.runtime import triton_kernels as tk

    assert tk.UNSPECIALIZED
    for name, args in tk.UNSPECIALIZED.items():
        assert {p.name for p in getattr(tk, name).params if p.do_not_specialize} == set(args), name


def test_a_burst_of_newcomers_compiles_no_kernel_start_up_did_not(tmp_path: Path, cv) -> None:
    """Newcomers beyond the prefill graphs prefill eagerly at their longest prompt; every Triton launch of that
    prefill has the argument classes of a launch the start-up shapes already made, so no request waits for a
    compile (the prompt-length argument of the rotary kernel is left unspecialized)."""
    pytest.importorskip("triton")
    script = tmp_path / "check.py"
    script.write_text(_SPECIALIZATION_CHECK)
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(script), str(cv[2])], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no new specialization" in done.stdout
