"""GPU only: the CUDA-graph decode step gives the same tokens as the eager step, at real sizes (dummy weights, bf16).

The eager runner runs at the graphs' bucket shapes (``pad_eager``), so both paths execute the same kernels on the
same shapes and must agree token for token, through newcomers joining, greedy and seeded sampled rows.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lm_helpers import drive

from omni_stream.models.causal_lm.config import load_config
from omni_stream.models.causal_lm.model import load_lm
from omni_stream.models.causal_lm.runner import CausalLMRunner, LMRequest
from omni_stream.requests import GREEDY, SamplingParams

pytestmark = pytest.mark.gpu

CONFIGS = Path(__file__).resolve().parents[1] / "benchmarks" / "configs"


def no_text(ids) -> str:
    return ""


@pytest.fixture(scope="module", params=["qwen3-0.6b", "llama-3.2-1b-instruct"])
def lm(request):
    path = CONFIGS / request.param
    return load_lm(path, device="cuda", dtype=torch.bfloat16, load_format="dummy", config=load_config(path))


def requests(vocab: int) -> list[LMRequest]:
    gen = torch.Generator().manual_seed(0)
    sampled = SamplingParams(temperature=0.6, top_k=20, top_p=0.95, repetition_penalty=1.1)

    def prompt(n: int) -> tuple[int, ...]:
        return tuple(torch.randint(0, vocab, (n,), generator=gen).tolist())

    return [
        LMRequest(prompt(37), 40, GREEDY, ignore_eos=True),
        LMRequest(prompt(5), 24, sampled, seed=1, ignore_eos=True),
        LMRequest(prompt(300), 33, sampled, seed=2, ignore_eos=True),
        LMRequest(prompt(90), 28, GREEDY, ignore_eos=True),
        LMRequest(prompt(12), 30, SamplingParams(temperature=1.0, top_k=0), seed=3, ignore_eos=True),
    ]


async def test_graph_decode_equals_eager_decode(lm):
    reqs = requests(lm.config.vocab_size)
    join = [0, 0, 3, 7, 8]
    graphed = CausalLMRunner(lm, no_text, max_batch_size=4, max_len=512, graphs=True, record=True)
    assert graphed.kernels is not None  # the fused layers run in both paths
    graphed.capture_graphs()
    eager = CausalLMRunner(lm, no_text, max_batch_size=4, max_len=512, graphs=False, record=True)
    # the same shapes on both paths: the decode step's buckets, and a lone newcomer's prefill at its bucket length
    # (the graphed runner pads it to replay its graph; bf16 at another length is another result)
    eager.pad_eager = eager.pad_lone_prefill = True
    with_graphs = await drive(graphed, reqs, join)
    without = await drive(eager, reqs, join)
    assert [r.tokens for r in with_graphs] == [r.tokens for r in without]
    assert [len(r.tokens) for r in with_graphs] == [r.max_tokens for r in reqs]
    assert graphed.graph_steps > 0 and graphed.eager_steps == 0 and eager.graph_steps == 0
    assert graphed.num_active == eager.num_active == 0


async def test_a_lone_newcomers_graphed_prefill_equals_its_eager_padded_prefill(lm):
    """One newcomer at a time: the graphs' lone prefill (captured at load) replays at bucket lengths and gives the
    eager bucketed prefill's tokens; no prefill ran eagerly at a new length."""
    reqs = requests(lm.config.vocab_size)
    join = [0, 60, 120, 180, 240]  # each alone
    graphed = CausalLMRunner(lm, no_text, max_batch_size=4, max_len=512, graphs=True, record=True)
    graphed.capture_graphs()
    assert len(graphed.prefill_graphs) == len(graphed.prefill_buckets)
    eager = CausalLMRunner(lm, no_text, max_batch_size=4, max_len=512, graphs=False, record=True)
    eager.pad_eager = eager.pad_lone_prefill = True
    with_graphs = await drive(graphed, reqs, join)
    without = await drive(eager, reqs, join)
    assert [r.tokens for r in with_graphs] == [r.tokens for r in without]
    assert [kind for _, _, kind in graphed.prefill_log] == ["graph"] * len(reqs)
    assert {t for _, t, _ in graphed.prefill_log} <= set(graphed.prefill_buckets)


async def test_newcomers_graphed_group_prefill_equals_its_eager_static_prefill(lm):
    """``group_prefill`` on CUDA: newcomers arriving together replay the (batch bucket, length bucket) graph
    captured at load and get the tokens of the same static-shape prefill run eagerly, beside rows already running;
    no group prefill ran eagerly."""
    reqs = requests(lm.config.vocab_size)
    join = [0, 0, 0, 5, 5]  # three together (one scratch row), then two beside three running rows
    graphed = CausalLMRunner(lm, no_text, max_batch_size=8, max_len=512, graphs=True, group_prefill=True, record=True)
    graphed.capture_graphs()
    assert len(graphed.group_graphs) == len(graphed.group_batches) * len(graphed.group_lengths)
    eager = CausalLMRunner(lm, no_text, max_batch_size=8, max_len=512, graphs=False, group_prefill=True, record=True)
    eager.pad_eager = eager.pad_lone_prefill = True
    with_graphs = await drive(graphed, reqs, join)
    without = await drive(eager, reqs, join)
    assert [r.tokens for r in with_graphs] == [r.tokens for r in without]
    assert [kind for _, _, kind in graphed.prefill_log] == ["graph", "graph"]
    assert graphed.group_batch_log == eager.group_batch_log == [4, 2]
