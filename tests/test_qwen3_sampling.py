"""Sampling: HF logits-processor semantics, the exponential race draws from the right distribution, seeds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from omni_stream.requests import SamplingParams
from omni_stream.runtime.sampling import (
    HeldSampling,
    SamplingTensors,
    apply_repetition_penalty,
    exponential_noise,
    mask_tokens,
    sample,
    warp,
)


def chisquare_pvalue(observed: np.ndarray, expected: np.ndarray) -> float:
    """Pearson chi-square goodness of fit: P(chi2_{k-1} >= statistic) (regularized upper gamma)."""
    stat = float(((observed - expected) ** 2 / expected).sum())
    dof = len(observed) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2)))


PARAMS = [
    SamplingParams(do_sample=True, temperature=0.7, top_k=5, top_p=1.0),
    SamplingParams(do_sample=True, temperature=1.3, top_k=0, top_p=0.8),
    SamplingParams(do_sample=True, temperature=0.9, top_k=3, top_p=0.6),
    SamplingParams(do_sample=True, temperature=1.0, top_k=0, top_p=1.0),
]


def hf_warp(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    x = TemperatureLogitsWarper(p.temperature)(None, logits[None].clone())
    if p.top_k:
        x = TopKLogitsWarper(p.top_k)(None, x)
    if p.top_p < 1.0:
        x = TopPLogitsWarper(p.top_p)(None, x)
    return x[0]


def test_warp_matches_hf_per_row() -> None:
    torch.manual_seed(0)
    logits = torch.randn(len(PARAMS), 40) * 3
    ours = warp(logits, SamplingTensors.from_params(PARAMS))
    for i, p in enumerate(PARAMS):
        ref = hf_warp(logits[i], p)
        assert torch.equal(torch.isinf(ours[i]), torch.isinf(ref)), i
        keep = ~torch.isinf(ref)
        torch.testing.assert_close(ours[i][keep], ref[keep])


def test_warp_keeps_what_hf_keeps_on_a_wide_vocabulary() -> None:
    """One sort serves both filters: on 4096 logits a row (no ties) the tokens kept are exactly HF's, for every mix
    of top-k and top-p, at the cut-offs too (top-p's running sum sees HF's values in HF's order)."""
    g = torch.Generator().manual_seed(7)
    kinds = [*PARAMS, SamplingParams(temperature=0.6, top_k=20, top_p=0.95), SamplingParams(top_k=4000, top_p=0.3),
             SamplingParams(temperature=2.0, top_k=0, top_p=0.999), SamplingParams(top_k=1, top_p=0.5)]  # fmt: skip
    rows = kinds * 8
    logits = torch.randn(len(rows), 4096, generator=g) * 4
    ours = warp(logits, SamplingTensors.from_params(rows))
    for i, p in enumerate(rows):
        ref = hf_warp(logits[i], p)
        assert torch.equal(torch.isinf(ours[i]), torch.isinf(ref)), (i, p)
        assert torch.equal(ours[i][~torch.isinf(ref)], ref[~torch.isinf(ref)])


def test_top_k_keeps_ties_at_kth_value() -> None:
    logits = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0], [3.0, 2.0, 2.0, 2.0, 1.0]])
    params = [SamplingParams(temperature=1.0, top_k=2, top_p=1.0), SamplingParams(temperature=1.0, top_k=0, top_p=1.0)]
    out = warp(logits, SamplingTensors.from_params(params))
    assert torch.isinf(out[0]).tolist() == [False, False, False, False, True]
    assert not torch.isinf(out[1]).any()  # k = 0 disables the filter


def test_repetition_penalty_matches_hf() -> None:
    torch.manual_seed(1)
    logits = torch.randn(2, 12)
    history = [[3, 5, 5, 0], [7]]
    seen = torch.zeros(2, 12, dtype=torch.bool)
    for row, ids in enumerate(history):
        seen[row, ids] = True
    ours = apply_repetition_penalty(logits, seen, torch.tensor([1.05, 1.3]))
    for row, (ids, pen) in enumerate(zip(history, (1.05, 1.3), strict=True)):
        ref = RepetitionPenaltyLogitsProcessor(pen)(torch.tensor([ids]), logits[row : row + 1].clone())[0]
        torch.testing.assert_close(ours[row], ref)


@pytest.mark.parametrize("row", range(len(PARAMS)))
def test_exponential_race_draws_the_warped_distribution(row: int) -> None:
    logits = torch.tensor([2.0, 1.5, 1.5, 1.0, 0.3, 0.0, -0.5, -1.0, -2.0, -3.0])
    p = PARAMS[row]
    expected = hf_warp(logits, p).softmax(-1).double().numpy()
    n = 20000
    params = SamplingTensors.from_params([p] * n)
    gen = torch.Generator().manual_seed(1234 + row)
    noise = torch.empty(n, logits.numel()).exponential_(generator=gen)
    tokens = sample(logits.expand(n, -1), params, noise)
    counts = np.bincount(tokens.numpy(), minlength=logits.numel())
    assert counts[expected == 0].sum() == 0  # filtered tokens are never drawn
    keep = expected > 0
    exp = expected[keep] / expected[keep].sum() * counts.sum()
    pvalue = chisquare_pvalue(counts[keep], exp)
    assert pvalue > 1e-3, (counts, expected * n)


def test_chisquare_pvalue_matches_known_values() -> None:
    # 60/40 against 50/50: statistic 4 on 1 dof, p = 0.0455; 5 cells at the 4-dof 5 % critical value 9.488
    assert abs(chisquare_pvalue(np.array([60.0, 40.0]), np.array([50.0, 50.0])) - 0.0455) < 1e-3
    obs = np.array([100.0 + (9.488 * 100 / 2) ** 0.5, 100.0 - (9.488 * 100 / 2) ** 0.5, 100.0, 100.0, 100.0])
    assert abs(chisquare_pvalue(obs, np.full(5, 100.0)) - 0.05) < 1e-3


def test_chi_square_detects_a_wrong_temperature() -> None:
    # The statistical check above can fail: drawing at T=1 while expecting T=0.5 is rejected.
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5])
    n = 20000
    noise = torch.empty(n, 4).exponential_(generator=torch.Generator().manual_seed(0))
    tokens = sample(logits.expand(n, -1), SamplingTensors.from_params([SamplingParams(top_k=0)] * n), noise)
    counts = np.bincount(tokens.numpy(), minlength=4)
    wrong = (logits / 0.5).softmax(-1).double().numpy()
    assert chisquare_pvalue(counts, wrong / wrong.sum() * n) < 1e-6


def test_greedy_rows_ignore_noise_and_batch_equals_solo() -> None:
    torch.manual_seed(2)
    logits = torch.randn(5, 64)
    params = [*PARAMS, SamplingParams(do_sample=False, temperature=1.0, top_k=0)]
    noise = exponential_noise([torch.Generator().manual_seed(i) for i in range(5)], 64, "cpu")
    batched = sample(logits, SamplingTensors.from_params(params), noise)
    solo = [
        int(sample(logits[i : i + 1], SamplingTensors.from_params([params[i]]), noise[i : i + 1])) for i in range(5)
    ]
    assert batched.tolist() == solo
    assert solo[4] == int(logits[4].argmax())
    assert torch.equal(sample(logits, SamplingTensors.from_params([params[4]] * 5), None), logits.argmax(-1))


def test_seeded_noise_reproduces_and_is_independent_of_batch() -> None:
    a = exponential_noise([torch.Generator().manual_seed(7), torch.Generator().manual_seed(8)], 16, "cpu")
    b = exponential_noise([torch.Generator().manual_seed(8)], 16, "cpu")
    c = exponential_noise([torch.Generator().manual_seed(7)], 16, "cpu")
    assert torch.equal(a[1], b[0]) and torch.equal(a[0], c[0])
    assert not torch.equal(a[0], a[1])


def test_suppression_mask() -> None:
    banned = torch.zeros(6, dtype=torch.bool)
    banned[3:] = True
    banned[4] = False
    out = mask_tokens(torch.zeros(2, 6), banned)
    assert torch.isinf(out).tolist() == [[False, False, False, True, False, True]] * 2


def test_held_sampling_writes_only_the_slots_whose_parameters_changed():
    storage = SamplingTensors.empty(4)
    held = HeldSampling(storage)
    hot = SamplingParams(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.1)
    greedy = SamplingParams(do_sample=False)
    uploads: list[list[int]] = []

    def upload(slots: list[int]) -> torch.Tensor:
        uploads.append(slots)
        return torch.tensor(slots)

    assert held.write([0, 2], torch.tensor([0, 2]), [hot, greedy], upload) == 2 and uploads == []  # all: `rows`
    expected = SamplingTensors.from_params([hot, SamplingParams(), greedy, SamplingParams()])
    for name in ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty"):
        torch.testing.assert_close(getattr(storage, name)[[0, 2]], getattr(expected, name)[[0, 2]])
    assert held.write([0, 2], torch.tensor([0, 2]), [hot, greedy], upload) == 0  # held already: nothing written
    storage.temperature[2] = 5.0  # a row the mirror says holds `greedy`: left alone, as nothing was asked
    assert held.write([2, 0], torch.tensor([2, 0]), [hot, hot], upload) == 1 and uploads == [[2]]  # a subset
    assert storage.temperature[2].item() == pytest.approx(0.7) and bool(storage.do_sample[2])

    class Failing(SamplingTensors):
        def write_rows(self, rows, params):
            raise RuntimeError("device fault")

    e = SamplingTensors.empty(2)
    failing = HeldSampling(Failing(e.do_sample, e.temperature, e.top_k, e.top_p, e.repetition_penalty))
    with pytest.raises(RuntimeError):
        failing.write([1], torch.tensor([1]), [hot], upload)
    assert failing._held == {}  # a failed write is done in full next time
