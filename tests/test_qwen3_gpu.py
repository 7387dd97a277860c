"""GPU-only: the code-predictor loop runs without host syncs and captures as one CUDA graph; the runner runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from omni_stream.models.qwen3_tts.checkpoint import hub_config, load_lm
from omni_stream.models.qwen3_tts.config import load_config
from omni_stream.models.qwen3_tts.options import Qwen3TTSOptions
from omni_stream.models.qwen3_tts.prompt import prepare_request
from omni_stream.models.qwen3_tts.runner import Qwen3TTSRunner
from omni_stream.requests import SamplingParams, SpeechRequest
from omni_stream.runtime.sampling import SamplingTensors
from omni_stream.runtime.settings import Tuning

pytestmark = pytest.mark.gpu


def _real_size(tmp_path: Path, size: str = "0.6b"):
    (tmp_path / "config.json").write_text(json.dumps(hub_config("custom_voice", size, tiny=False)))
    return load_lm(tmp_path, load_format="dummy", dtype=torch.bfloat16, device="cuda")


def test_code_predictor_loop_is_sync_free_and_graph_capturable(tmp_path) -> None:
    lm = _real_size(tmp_path)
    cp = lm.talker.code_predictor
    b, h = 4, lm.config.talker.decoder.hidden_size
    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(b, h, device="cuda", dtype=torch.bfloat16, generator=gen)
    c0 = torch.randn(b, h, device="cuda", dtype=torch.bfloat16, generator=gen)
    params = SamplingTensors.from_params(
        [SamplingParams(), SamplingParams(do_sample=False), SamplingParams(top_k=5), SamplingParams(top_p=0.7)], "cuda"
    )
    noise = torch.empty(b, 15, 2048, device="cuda").exponential_(generator=gen)
    with torch.no_grad():
        cp.generate(hidden, c0, params, noise)  # allocates the batch's scratch buffers
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            eager = cp.generate(hidden, c0, params, noise)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            cp.generate(hidden, c0, params, noise)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = cp.generate(hidden, c0, params, noise)
        graph.replay()
        assert torch.equal(static_out, eager)
        hidden.copy_(torch.randn(b, h, device="cuda", dtype=torch.bfloat16, generator=gen))
        noise.exponential_(generator=gen)
        graph.replay()
        assert torch.equal(static_out, cp.generate(hidden, c0, params, noise))
    assert eager.shape == (b, 15) and int(eager.max()) < 2048


def test_frame_kernel_equals_the_loop_at_real_size_in_fp32(tmp_path) -> None:
    """The code predictor's one-row frame as one persistent kernel over the full grid gives the fused loop's
    codes at the 1.7B sizes in fp32 (greedy, top-k, top-p), launched eagerly and replayed from a graph."""
    from omni_stream.runtime import decoder_kernels as fused

    (tmp_path / "config.json").write_text(json.dumps(hub_config("custom_voice", "1.7b", tiny=False)))
    lm = load_lm(tmp_path, load_format="dummy", dtype=torch.float32, device="cuda")
    cp = lm.talker.code_predictor
    cp.use_kernels(fused.triton_kernels(Tuning(predictor_kernel=True)))
    frame = cp.frame
    assert frame is not None and frame.programs > 1
    h = lm.config.talker.decoder.hidden_size
    gen = torch.Generator(device="cuda").manual_seed(0)
    kinds = [SamplingParams(do_sample=False), SamplingParams(top_k=50, temperature=0.9), SamplingParams(top_p=0.8)]
    with torch.no_grad():
        for p in kinds:
            params = SamplingTensors.from_params([p], "cuda")
            for _ in range(3):
                hidden = torch.randn(1, h, device="cuda", generator=gen)
                c0 = torch.randn(1, h, device="cuda", generator=gen)
                noise = torch.empty(1, 15, 2048, device="cuda").exponential_(generator=gen) if p.do_sample else None
                got = cp.generate(hidden, c0, params, noise)
                cp.frame = None
                want = cp.generate(hidden, c0, params, noise)
                cp.frame = frame
                assert torch.equal(got, want), (p, got.tolist(), want.tolist())
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            cp.generate(hidden, c0, params, noise)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = cp.generate(hidden, c0, params, noise)
        for _ in range(3):
            hidden.copy_(torch.randn(1, h, device="cuda", generator=gen))
            noise.exponential_(generator=gen)
            graph.replay()
            assert torch.equal(static_out, cp.generate(hidden, c0, params, noise))


def test_runner_on_gpu_real_size(tmp_path) -> None:
    from omni_stream.models.qwen3_tts.checkpoint import write_tokenizer
    from omni_stream.models.qwen3_tts.tokenizer import TextTokenizer

    lm = _real_size(tmp_path)
    write_tokenizer(tmp_path)
    cfg = load_config(tmp_path)
    tok = TextTokenizer(tmp_path)
    runner = Qwen3TTSRunner(lm, max_batch_size=4, max_len=256)
    reqs = [
        prepare_request(
            SpeechRequest(text="Hello world.", voice=v, max_new_tokens=9, ignore_eos=True, seed=i), cfg, tok
        )
        for i, v in enumerate(("ryan", "vivian", "aiden"))
    ]
    out = runner.generate_codes(reqs, join_steps=[0, 2, 3])
    assert [o.shape for o in out] == [(9, 16)] * 3
    assert runner.num_active == 0
    again = runner.generate_codes(reqs, join_steps=[0, 2, 3])
    assert all(torch.equal(a, b) for a, b in zip(out, again, strict=True))  # seeded sampling reproduces


# -- CUDA graphs of the decode step -------------------------------------------------------------------------

GREEDY = SamplingParams(do_sample=False, temperature=1.0, top_k=0, repetition_penalty=1.05)
SUB_GREEDY = SamplingParams(do_sample=False, temperature=1.0, top_k=0)
CONFIGS = Path(__file__).resolve().parent.parent / "benchmarks" / "configs"


def _from_config(tmp_path: Path, name: str, dtype: torch.dtype):
    from omni_stream.models.qwen3_tts.checkpoint import write_dummy_checkpoint
    from omni_stream.models.qwen3_tts.tokenizer import TextTokenizer

    write_dummy_checkpoint(CONFIGS / name, tmp_path, dtype=dtype, weights=False)
    lm = load_lm(tmp_path, load_format="dummy", dtype=dtype, device="cuda")
    return load_config(tmp_path), TextTokenizer(tmp_path), lm


def _requests(cfg, tok, *, sampled: bool):
    texts = [("Hello world, this is a test.", "ryan"), ("Good.", "vivian"), ("The voice is warm.", "aiden")]
    hot = SamplingParams(do_sample=True, temperature=0.9, top_k=50, repetition_penalty=1.05)
    sub_hot = SamplingParams(do_sample=True, temperature=0.9, top_k=50)
    out = []
    for i, (text, voice) in enumerate(texts):
        s = sampled and i == 1
        req = SpeechRequest(text=text, voice=voice, max_new_tokens=6 + i, ignore_eos=True, seed=10 + i,
                            sampling=hot if s else GREEDY,
                            options=Qwen3TTSOptions(subtalker_sampling=sub_hot if s else SUB_GREEDY))  # fmt: skip
        out.append(prepare_request(req, cfg, tok))
    return out


@pytest.mark.parametrize("name", ["qwen3-tts-12hz-0.6b-customvoice", "qwen3-tts-12hz-1.7b-customvoice"])
def test_graph_replay_equals_eager_at_bucket_shapes(tmp_path, name) -> None:
    cfg, tok, lm = _from_config(tmp_path, name, torch.bfloat16)
    graphed = Qwen3TTSRunner(lm, max_batch_size=4, max_len=640)
    assert graphed.use_graphs
    seconds = graphed.capture_graphs()
    assert len(graphed.graphs) == len(graphed.batch_buckets) * len(graphed.length_buckets) and seconds > 0
    eager = Qwen3TTSRunner(lm, max_batch_size=4, max_len=640, graphs=False)
    eager.pad_eager = True  # same shapes, same kernels: only the launch mechanism differs
    reqs = _requests(cfg, tok, sampled=True)
    a = graphed.generate_codes(reqs, join_steps=[0, 1, 3])
    b = eager.generate_codes(reqs, join_steps=[0, 1, 3])
    assert graphed.graph_steps > 0 and graphed.eager_steps == 0 and eager.graph_steps == 0
    assert graphed.prefill_graph_calls > 0 and graphed.kernels is not None and graphed.kernels.name == "triton"
    assert [x.shape[0] for x in a] == [6, 7, 8]
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


def test_a_burst_in_groups_of_prefill_graphs_equals_the_eager_groups(tmp_path) -> None:
    """A burst of newcomers past one graph's positions prefills as several captured groups (each a replay of a
    view of the flat static buffer); the codes equal the same groups run eagerly at those shapes."""
    cfg, tok, lm = _from_config(tmp_path, "qwen3-tts-12hz-0.6b-customvoice", torch.bfloat16)
    reqs = [r for _ in range(3) for r in _requests(cfg, tok, sampled=True)]  # 9 newcomers at once
    codes = []
    for graphs in (True, False):
        runner = Qwen3TTSRunner(lm, max_batch_size=16, max_len=640, graphs=graphs)
        runner.pad_eager = not graphs
        runner.prefill_positions = 128  # groups of at most 4 prompts of 32 positions, 2 of 64
        runner.capture_graphs()
        codes.append(runner.generate_codes(reqs))
        if graphs:
            assert runner.prefill_graph_calls >= 3 and all(b * n <= 128 for b, n in runner.prefill_graphs.graphs)
    for x, y in zip(*codes, strict=True):
        assert torch.equal(x, y)


def test_dependent_launches_give_the_codes_of_serial_launches_under_graphs(tmp_path) -> None:
    """On Hopper the Triton kernels launch while their predecessor runs (programmatic dependent launch); every
    code is the one serial launches give, at 1 row (the small projections, their weight prefetch) and 3."""
    from omni_stream.runtime import triton_kernels as tk
    from omni_stream.runtime.decoder_kernels import default_kernels

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs compute capability 9.0")
    cfg, tok, lm = _from_config(tmp_path, "qwen3-tts-12hz-1.7b-customvoice", torch.bfloat16)
    reqs = _requests(cfg, tok, sampled=True)
    got = {}
    for pdl in ("1", "0", "linear"):  # all, none, the projections without their prefetch
        tuning = Tuning.from_env({"OMNI_STREAM_PDL": pdl})
        assert tk._pdl(torch.empty(1, device="cuda"), "norm", tuning.pdl) == (pdl == "1")
        assert tk._pdl(torch.empty(1, device="cuda"), "linear", tuning.pdl) == (pdl != "0")
        kernels = default_kernels(torch.device("cuda"), tuning)
        runner = Qwen3TTSRunner(lm, max_batch_size=4, max_len=512, fused=kernels)
        runner.capture_graphs()  # the launch mode is fixed at capture
        got[pdl] = ([runner.generate_codes([reqs[0]])[0]], runner.generate_codes(reqs, join_steps=[0, 1, 2]))
        assert runner.graph_steps > 0 and runner.eager_steps == 0
    for mode in ("1", "linear"):
        for a, b in zip(got[mode], got["0"], strict=True):
            assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_batched_rows_get_their_solo_codes_under_graphs(tmp_path) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    cfg, tok, lm = _from_config(tmp_path, "qwen3-tts-12hz-0.6b-customvoice", torch.float32)
    runner = Qwen3TTSRunner(lm, max_batch_size=4, max_len=512)
    runner.capture_graphs()
    reqs = _requests(cfg, tok, sampled=True)
    solo = [runner.generate_codes([r])[0] for r in reqs]
    batched = runner.generate_codes(reqs, join_steps=[0, 2, 1])
    assert runner.eager_steps == 0
    for x, y in zip(solo, batched, strict=True):
        assert torch.equal(x, y)


def test_dummy_checkpoint_serves_speech_end_to_end_on_cuda(tmp_path) -> None:
    import anyio

    from omni_stream.engine import AsyncEngine
    from omni_stream.models.qwen3_tts.checkpoint import write_dummy_checkpoint

    path = write_dummy_checkpoint(CONFIGS / "qwen3-tts-12hz-0.6b-customvoice", tmp_path / "ckpt",
                                  dtype=torch.bfloat16, weights=False)  # fmt: skip

    async def main() -> tuple[int, int]:
        engine = await AsyncEngine.from_pretrained(path, device="cuda", load_format="dummy", max_batch_size=2,
                                                   progress=False)  # fmt: skip
        async with engine:
            family = engine.models.speech()
            # codec windows on a side stream (high, the default, or normal) unless tuning.codec_stream is off
            overlap = engine.tuning.codec_stream != "off"
            assert (family.completions is not None) == overlap
            assert (family.codec_windows.stream is not None) == overlap
            assert family.runner.prefill_graphs is not None and len(family.runner.prefill_graphs) > 0
            samples = 0
            async with engine.speech("Hello world.", voice="ryan", max_new_tokens=5, ignore_eos=True) as stream:
                async for audio in stream:
                    samples += audio.samples.shape[0]
            return samples, stream.usage.output_tokens

    samples, frames = anyio.run(main)
    assert frames == 5 and samples == 5 * 1920


# -- fused decoder layers (Triton) ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_kernels_equal_torch_versions_on_cuda(dtype) -> None:
    from omni_stream.runtime import decoder_kernels as fused
    from omni_stream.runtime import triton_kernels as tk

    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    g = torch.Generator(device="cuda").manual_seed(0)

    def r(*s):
        return torch.randn(*s, generator=g, device="cuda").to(dtype)

    for rows, h in ((1, 2048), (96, 1024)):
        x, d, w = r(rows, 1, h), r(rows, 1, h), r(h)
        for delta in (None, d):
            for a, b in zip(tk.add_rms_norm(x, delta, w, 1e-6), fused.add_rms_norm(x, delta, w, 1e-6), strict=True):
                torch.testing.assert_close(a, b, **tol)
    for b, t, hq, hkv in ((1, 1, 16, 8), (64, 1, 16, 8), (2, 37, 16, 8), (8, 2, 16, 8)):
        qkv, nw = r(b, t, (hq + 2 * hkv) * 128), r(2, 128)
        ang = torch.rand(1, t, 64, generator=g, device="cuda") * 100
        emb = torch.cat((ang, ang), -1)
        cos, sin = emb.cos().to(dtype).expand(b, -1, -1), emb.sin().to(dtype).expand(b, -1, -1)
        got = tk.qk_norm_rope(qkv, nw, cos, sin, 1e-6, hq, hkv)
        want = fused.qk_norm_rope(qkv, nw, cos, sin, 1e-6, hq, hkv)
        for a, c in zip(got, want, strict=True):
            torch.testing.assert_close(a, c, **tol)
    gu = r(64, 1, 2 * 6144)
    torch.testing.assert_close(tk.silu_mul(gu), fused.silu_mul(gu), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_small_batch_linear_equals_cublas_and_is_batch_invariant_on_cuda(dtype) -> None:
    import torch.nn.functional as F

    from omni_stream.runtime import triton_kernels as tk

    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(5)

    def r(*s, scale=1.0):
        return (torch.randn(*s, generator=g, device="cuda") * scale).to(dtype)

    # 1.7B: talker q/k/v, o, gate/up, down; code predictor q/k/v, down, lm head; the predictor's input projection
    for n, k in ((4096, 2048), (2048, 2048), (12288, 2048), (2048, 6144), (4096, 1024), (1024, 3072), (2048, 1024),
                 (1024, 2048)):  # fmt: skip
        w, bias, x = r(n, k, scale=k**-0.5), r(n), r(16, 1, k)
        for bb in (None, bias):
            got, want = tk.linear(x, w, bb), F.linear(x, w, bb)
            err = float((got.float() - want.float()).norm() / want.float().norm())
            assert err < (1e-5 if dtype == torch.float32 else 1e-2), (n, k, bb is None, err)
            for m in (1, 2, 5):  # a row's result is the same bits alone or among 16
                assert torch.equal(tk.linear(x[:m], w, bb), got[:m])
    # the code predictor's lookup read by its input projection: F.linear of the gathered rows, a row's bits alone
    table, w, bias = r(2048, 2048), r(1024, 2048, scale=2048**-0.5), r(1024)
    ids = torch.randint(0, 2048, (16,), generator=g, device="cuda")
    got = tk.embed_linear(table, ids, w, bias)
    want = F.linear(table[ids], w, bias)
    assert float((got.float() - want.float()).norm() / want.float().norm()) < (1e-5 if dtype == torch.float32 else 1e-2)
    assert torch.equal(tk.embed_linear(table, ids[:1], w, bias), got[:1])
    assert torch.equal(got, tk.linear(table[ids], w, bias))  # the same sums as the projection of the copied rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_kernel_writes_k_and_v_into_the_cache_on_cuda(dtype) -> None:
    from omni_stream.runtime import decoder_kernels as fused
    from omni_stream.runtime import triton_kernels as tk
    from omni_stream.runtime.kv_cache import KVWrite

    g = torch.Generator(device="cuda").manual_seed(0)

    def r(*s):
        return torch.randn(*s, generator=g, device="cuda").to(dtype)

    hq, hkv, d = 16, 8, 128
    slots = torch.tensor([2, 0, 3], device="cuda")
    for b, t, start in ((3, 2, torch.tensor([1, 5, 0], device="cuda")),
                        (3, 1, torch.tensor([7], device="cuda").expand(3))):  # fmt: skip
        qkv, nw = r(b, t, (hq + 2 * hkv) * d), r(2, d)
        ang = torch.rand(1, t, d // 2, generator=g, device="cuda") * 6
        emb = torch.cat((ang, ang), -1)
        cos, sin = emb.cos().to(dtype).expand(b, -1, -1), emb.sin().to(dtype).expand(b, -1, -1)
        got = []
        for fn in (tk.qk_norm_rope_kv, fused.qk_norm_rope_kv):
            kc, vc = (torch.zeros(4, hkv, 10, d, device="cuda", dtype=dtype) for _ in range(2))
            got.append((fn(qkv, nw, cos, sin, 1e-6, hq, hkv, KVWrite(kc, vc, slots, start)), kc, vc))
        for a, c in zip(*got, strict=True):
            torch.testing.assert_close(a, c, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_attention_kernel_equals_masked_attention_on_cuda(dtype) -> None:
    """The talker's shapes (16 query heads on 8 kv heads, head_dim 128): rows at their own lengths in a 512-position
    span, one inactive row past it, the code predictor's stride-0 length; a row alone gives the same bits."""
    from omni_stream.runtime import triton_kernels as tk
    from omni_stream.runtime.kv_cache import KVRead, read_one

    g = torch.Generator(device="cuda").manual_seed(0)
    hq, hkv, d = 16, 8, 128
    kc, vc = (torch.randn(6, hkv, 513, d, generator=g, device="cuda").to(dtype) for _ in range(2))
    slots = torch.tensor([4, 0, 5, 1], device="cuda")
    for last, span in ((torch.tensor([0, 130, 511, 600], device="cuda"), 512),
                       (torch.tensor([9], device="cuda").expand(4), 10)):  # fmt: skip
        q = torch.randn(4, 1, hq, d, generator=g, device="cuda").to(dtype)
        src = KVRead(kc, vc, slots, last, span)
        got = tk.decode_attention(q, src)
        want = read_one(q.float(), KVRead(kc.float(), vc.float(), slots, last, span))
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2 if dtype == torch.bfloat16 else 1e-4)
        for i in range(4):
            alone = tk.decode_attention(q[i : i + 1], KVRead(kc, vc, slots[i : i + 1], last[i : i + 1], span))
            assert torch.equal(alone[0], got[i])


@pytest.mark.parametrize("rows", [(2, 40), (1, 12)])  # the cuBLAS flow, the small-batch flow
def test_fused_talker_matches_module_talker_on_cuda(tmp_path, rows) -> None:
    """fp32 weights at real size: the fused layers compute the module layers' function."""
    from omni_stream.runtime.decoder_kernels import triton_kernels
    from omni_stream.runtime.kv_cache import attention

    torch.backends.cuda.matmul.allow_tf32 = False
    _, _, lm = _from_config(tmp_path, "qwen3-tts-12hz-1.7b-customvoice", torch.float32)
    talker = lm.talker
    g = torch.Generator(device="cuda").manual_seed(1)
    b, t = rows
    x = torch.randn(b, t, lm.config.talker.decoder.hidden_size, generator=g, device="cuda")
    pos = torch.arange(t, device="cuda")[None].expand(b, -1)
    causal = torch.ones(t, t, dtype=torch.bool, device="cuda").tril()

    def attend(_layer, q, k, v):
        return attention(q, k, v, causal)

    with torch.no_grad():
        talker.use_kernels(None)
        want = talker(x, pos, attend)
        kernels = triton_kernels(Tuning(small_rows=16))
        talker.use_kernels(kernels)
        got = talker(x, pos, attend)
    assert (b * t <= kernels.small_rows) == (rows == (1, 12))
    err = (got - want).norm() / want.norm()
    assert err < 1e-4, float(err)


def test_triton_sampler_agrees_with_torch_sampler_on_cuda() -> None:
    from omni_stream.runtime import triton_kernels as tk
    from omni_stream.runtime.sampling import sample

    kinds = [
        SamplingParams(do_sample=False), SamplingParams(temperature=0.9, top_k=50), SamplingParams(top_k=5, top_p=0.8),
        SamplingParams(top_k=0, top_p=0.5), SamplingParams(top_k=1), SamplingParams(temperature=1.3, top_k=0),
        SamplingParams(top_k=5000, top_p=0.95), SamplingParams(temperature=0.5, top_k=20, top_p=0.3),
    ]  # fmt: skip
    g = torch.Generator(device="cuda").manual_seed(3)
    params = SamplingTensors.from_params(kinds * 16, "cuda")
    b = len(kinds) * 16
    agree = total = 0
    for vocab in (2048, 3072):
        for dtype in (torch.float32, torch.bfloat16):
            for _ in range(10):
                logits = (torch.randn(b, vocab, generator=g, device="cuda") * 4).to(dtype)
                noise = torch.empty(b, 2, vocab, device="cuda").exponential_(generator=g)[:, 0]
                got, want = tk.sample(logits, params, noise), sample(logits, params, noise)
                greedy = ~params.do_sample
                assert torch.equal(got[greedy], want[greedy])  # ties break to the first index in both
                agree += int((got == want).sum())
                total += b
                # every sampled token lies inside its row's top-k
                k = params.top_k.clamp(min=1).where(params.top_k > 0, torch.full_like(params.top_k, vocab))
                rank = (logits.float() > logits.float().gather(1, got[:, None])).sum(1)
                assert bool((rank < k).all())
    # the race compares probabilities computed by two exp implementations: only near-ties may differ
    assert agree / total > 0.995, agree / total


def test_codec_windows_on_their_own_stream_equal_the_synchronous_decode(tmp_path) -> None:
    """Issued on a high-priority side stream while the default stream is busy and collected by the worker:
    the same audio as the synchronous decode, for graph and eager window sizes and batches in pieces."""
    from omni_stream.models.qwen3_tts.checkpoint import write_dummy_checkpoint
    from omni_stream.models.qwen3_tts.codec import load_speech_tokenizer
    from omni_stream.models.qwen3_tts.codec_graphs import CodecWindows
    from omni_stream.models.qwen3_tts.codec_stage import SlotWindow, decode_slot_windows, issue_slot_windows
    from omni_stream.runtime.gpu_completions import Completions
    from omni_stream.worker import DeviceWorker

    path = write_dummy_checkpoint(CONFIGS / "qwen3-tts-12hz-0.6b-customvoice", tmp_path / "ckpt",
                                  dtype=torch.bfloat16, weights=False)  # fmt: skip
    decoder = load_speech_tokenizer(path, "cuda", torch.bfloat16, "dummy", with_encoder=False).eval().decoder
    windows = (1, 2, 4)
    sync = CodecWindows(decoder, 8, windows=windows, max_batch=2)
    side = CodecWindows(decoder, 8, windows=windows, max_batch=2, stream=torch.cuda.Stream(priority=-100))
    sync.capture_graphs()
    side.capture_graphs()
    completions = Completions(DeviceWorker())  # never started: this thread collects, as the worker would
    gen = torch.Generator().manual_seed(0)
    codes = [torch.randint(0, 2048, (10, 16), generator=gen) for _ in range(3)]
    busy = torch.randn(4096, 4096, device="cuda")
    for lo, hi in ((0, 1), (1, 3), (3, 7), (7, 10)):  # 1, 2, 4 (3 windows: pieces of 2), 3 (replays 2 + 1)
        want = decode_slot_windows(sync, [SlotWindow(i, codes[i][lo:hi], lo == 0) for i in range(3)])
        for _ in range(20):  # keep the default stream busy while the side stream decodes
            busy = busy @ busy / 64
        jobs = [SlotWindow(i, codes[i][lo:hi], lo == 0, first=lo == 0) for i in range(3)]
        futures = issue_slot_windows(side, jobs, completions)
        assert all(f.done() for f in futures) == (lo == 0)  # a first window is waited for at once
        while completions.has_work():
            completions.run_step()
        got = [f.result(timeout=0) for f in futures]
        for g, w in zip(got, want, strict=True):
            assert g.dtype == np.float32 and g.shape == w.shape and float(np.abs(g - w).max()) < 1e-4
    assert side.graph_jobs == sync.graph_jobs > 0 and side.eager_jobs == sync.eager_jobs == 0
    assert side.planned_jobs == sync.planned_jobs == 2  # the 3-frame windows: two batch pieces, each 2 + 1


def test_codec_windows_of_no_graph_size_replay_graphs_exactly(tmp_path) -> None:
    """On CUDA graphs (fp32): a 3-frame window (2 + 1), a 7-frame ICL prime (4 + 2 + 1) and a 3-frame last
    window (padded to 4) give what private eager states give, with no eager decode."""
    from omni_stream.models.qwen3_tts.checkpoint import write_dummy_checkpoint
    from omni_stream.models.qwen3_tts.codec import load_speech_tokenizer
    from omni_stream.models.qwen3_tts.codec_graphs import CodecWindows
    from omni_stream.models.qwen3_tts.codec_stage import SlotWindow, decode_slot_windows
    from omni_stream.models.qwen3_tts.codec_stream import CodecStreamState, decode_window, prime

    path = write_dummy_checkpoint(CONFIGS / "qwen3-tts-12hz-0.6b-customvoice", tmp_path / "ckpt",
                                  dtype=torch.float32, weights=False)  # fmt: skip
    decoder = load_speech_tokenizer(path, "cuda", torch.float32, "dummy", with_encoder=False).eval().decoder
    pool = CodecWindows(decoder, 4, windows=(1, 2, 4), max_batch=2)
    pool.capture_graphs()
    gen = torch.Generator().manual_seed(3)
    context = torch.randint(0, 2048, (7, 16), generator=gen)
    codes = [torch.randint(0, 2048, (9, 16), generator=gen) for _ in range(2)]
    bounds = ((0, 3), (3, 6), (6, 9))
    got: list[list[np.ndarray]] = [[], []]
    for lo, hi in bounds:
        ctx = [context if lo == 0 else None, None]
        jobs = [SlotWindow(i, codes[i][lo:hi], lo == 0, ctx[i], final=hi == 9) for i in range(2)]
        for i, audio in enumerate(decode_slot_windows(pool, jobs)):
            got[i].append(audio)
    assert pool.eager_jobs == 0 and pool.planned_jobs == 4
    with torch.inference_mode():
        for i in range(2):
            state = CodecStreamState.zeros(decoder, 1)
            if i == 0:
                prime(decoder, context.T.unsqueeze(0).cuda(), state)
            for (lo, hi), g in zip(bounds, got[i], strict=True):
                w = decode_window(decoder, codes[i][lo:hi].T[None].cuda(), state)[0].float().cpu().numpy()
                assert g.shape == w.shape and float(np.abs(g - w).max()) < 1e-3
