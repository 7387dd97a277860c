"""Batched token sampling with per-row parameters, HF logits-processor semantics, and no host syncs.

Every function is pure and works on whole batches: rows with different temperatures, top-k, top-p,
repetition penalties or greedy/sampling modes share one call. Sampling is an exponential race
(``argmax(probs / E)`` with ``E ~ Exponential(1)``, as in gpt-fast), so the random draw is an input
tensor: callers draw it from per-request generators and the sampler itself has no RNG state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from omni_stream.requests import SamplingParams


@dataclass(slots=True, frozen=True)
class SamplingTensors:
    """Per-row sampling parameters as device tensors (``[B]`` each). ``top_k == 0`` disables top-k."""

    do_sample: torch.Tensor  # bool
    temperature: torch.Tensor  # float32
    top_k: torch.Tensor  # int64
    top_p: torch.Tensor  # float32
    repetition_penalty: torch.Tensor  # float32

    @classmethod
    def from_params(cls, params: Sequence[SamplingParams], device: torch.device | str = "cpu") -> SamplingTensors:
        """Stack per-request parameters (one host-to-device copy per field)."""
        return cls(
            do_sample=torch.tensor([p.do_sample for p in params], dtype=torch.bool, device=device),
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            repetition_penalty=torch.tensor([p.repetition_penalty for p in params], dtype=torch.float32, device=device),
        )

    @classmethod
    def empty(cls, n: int, device: torch.device | str = "cpu") -> SamplingTensors:
        """``n`` greedy rows (slot-indexed storage to be filled with :meth:`write`)."""
        return cls(
            do_sample=torch.zeros(n, dtype=torch.bool, device=device),
            temperature=torch.ones(n, dtype=torch.float32, device=device),
            top_k=torch.zeros(n, dtype=torch.int64, device=device),
            top_p=torch.ones(n, dtype=torch.float32, device=device),
            repetition_penalty=torch.ones(n, dtype=torch.float32, device=device),
        )

    def write(self, row: int, p: SamplingParams) -> None:
        """Store one request's parameters in row ``row`` (admission time, not the hot path)."""
        self.do_sample[row] = p.do_sample
        self.temperature[row] = p.temperature
        self.top_k[row] = p.top_k
        self.top_p[row] = p.top_p
        self.repetition_penalty[row] = p.repetition_penalty

    def write_rows(self, rows: torch.Tensor, params: Sequence[SamplingParams]) -> None:
        """Store requests' parameters in ``rows`` (an index tensor on this storage's device): one copy per field
        from pinned memory, never waited for. :meth:`write` on CUDA is five blocking copies a request."""
        host = SamplingTensors.from_params(params)
        for name in ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty"):
            dst, src = getattr(self, name), getattr(host, name)
            if dst.device.type == "cuda":
                src = src.pin_memory()
            dst.index_copy_(0, rows, src.to(dst.device, non_blocking=True))

    def head(self, b: int) -> SamplingTensors:
        """The first ``b`` rows as views (static storage a graph can read)."""
        return SamplingTensors(
            self.do_sample[:b], self.temperature[:b], self.top_k[:b], self.top_p[:b], self.repetition_penalty[:b]
        )

    def index(self, rows: torch.Tensor) -> SamplingTensors:
        """Gather rows (e.g. the slots of this step's batch)."""
        return SamplingTensors(
            self.do_sample[rows], self.temperature[rows], self.top_k[rows], self.top_p[rows],
            self.repetition_penalty[rows],
        )  # fmt: skip


class HeldSampling:
    """What each slot of a slot-indexed :class:`SamplingTensors` storage holds, as last written, kept on the host, so
    a newcomer whose slot already holds its parameters (a voice agent's next turn, a server's default sampling)
    writes none. Writing them is four torch calls a field, twenty a storage; each call from the worker thread hands
    the interpreter to the serving process's other threads and waits to get it back, which under load costs up to a
    switch interval apiece."""

    def __init__(self, storage: SamplingTensors) -> None:
        self.storage = storage
        self._held: dict[int, SamplingParams] = {}

    def write(
        self,
        slots: Sequence[int],
        rows: torch.Tensor,
        params: Sequence[SamplingParams],
        upload: Callable[[list[int]], torch.Tensor],
    ) -> int:
        """Store ``params[i]`` in slot ``slots[i]`` (``rows``: those slots as an index tensor on the storage's
        device; ``upload``: host slots -> such a tensor, for a subset), only where the slot holds other parameters;
        returns the rows written."""
        changed = [i for i, (slot, p) in enumerate(zip(slots, params, strict=True)) if self._held.get(slot) != p]
        if not changed:
            return 0
        if len(changed) < len(slots):
            rows = upload([slots[i] for i in changed])
        try:
            self.storage.write_rows(rows, [params[i] for i in changed])
        except BaseException:
            for i in changed:  # the rows may hold anything now: written in full next time
                self._held.pop(slots[i], None)
            raise
        for i in changed:
            self._held[slots[i]] = params[i]
        return len(changed)


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """HF semantics over the tokens marked in ``seen`` ``[B, V]``: positive logits / p, negative * p."""
    p = penalty[:, None].to(logits.dtype)
    penalized = torch.where(logits > 0, logits / p, logits * p)
    return torch.where(seen, penalized, logits)


def mask_tokens(logits: torch.Tensor, banned: torch.Tensor) -> torch.Tensor:
    """Set banned logits to -inf; ``banned`` is ``[V]`` or ``[B, V]`` boolean."""
    return logits.masked_fill(banned, float("-inf"))


def warp(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """Temperature, then top-k, then top-p (HF warper order), from one ascending sort of each row.

    Top-k keeps the logits at or above the row's k-th largest (ties at the k-th value are kept; ``k == 0`` keeps
    all). Top-p (HF's nucleus filter) then drops the low tail of what top-k kept whose total mass is <= 1 - p, never
    the best token. Both read the same sort: top-k's cut is the low end of HF's own top-p order, so top-p's softmax
    and running sum see the same values in the same order as a sort of their own would, ties included where the
    sort is stable (the CPU's). The second sort this saves ran over what top-k left (mostly -inf) and was the cheap
    one: on a CPU, 32 rows of 151,936 logits sample in 275 ms against 306, and the remaining full sort is ~200 ms
    of it where a top-20 selection alone takes ~3 ms (``benchmarks/sampling_bench.py``).
    """
    x = logits / params.temperature[:, None].to(logits.dtype)
    v = x.shape[-1]
    ranked, order = x.sort(dim=-1)
    k = params.top_k
    kth = ranked.gather(-1, (v - k.clamp(1, v))[:, None])  # the k-th largest
    kth = torch.where(k[:, None] > 0, kth, torch.full_like(kth, float("-inf")))
    cut = ranked < kth  # top-k, in sorted order
    mass = ranked.masked_fill(cut, float("-inf")).softmax(dim=-1).cumsum(dim=-1)
    cut |= mass <= (1.0 - params.top_p)[:, None].to(mass.dtype)
    cut[:, -1] = False  # the best token stays
    return x.masked_fill(cut.scatter(-1, order, cut), float("-inf"))


def sample(logits: torch.Tensor, params: SamplingTensors, noise: torch.Tensor | None) -> torch.Tensor:
    """Next token per row: greedy argmax where ``do_sample`` is False, else an exponential race.

    ``noise`` is ``[B, V]`` Exponential(1) draws (None only when no row samples).
    """
    logits = logits.float()
    greedy = logits.argmax(dim=-1)
    if noise is None:
        return greedy
    probs = warp(logits, params).softmax(dim=-1)
    raced = (probs / noise.clamp_min(1e-20)).argmax(dim=-1)
    return torch.where(params.do_sample, raced, greedy)


def exponential_noise(
    generators: Sequence[torch.Generator | None], width: int, device: torch.device | str
) -> torch.Tensor:
    """``[len(generators), width]`` Exponential(1) draws, row ``i`` from ``generators[i]`` (None: global RNG).

    One row per request keeps each request's stream independent of who it is batched with.
    """
    out = torch.empty(len(generators), width, dtype=torch.float32, device=device)
    for i, g in enumerate(generators):
        out[i].exponential_(generator=g)
    return out


# --- the text model's extras: logit bias, presence/frequency penalties, grammar masks, log-probabilities -------


def bitmask_words(vocab: int) -> int:
    """32-bit words of a token bitmask over ``vocab`` tokens (bit ``t % 32`` of word ``t // 32``: token ``t``)."""
    return (vocab + 31) // 32


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[B, W]`` int32 words -> ``[B, vocab]`` bool (True: allowed). Shapes are static: a graph can hold it."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask[:, :, None] >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab].bool()


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Disallowed tokens to -inf; a row of all-ones words (-1) is unchanged (free rows share the call)."""
    return logits.masked_fill(~unpack_bitmask(bitmask, logits.shape[-1]), float("-inf"))


def apply_penalties(
    logits: torch.Tensor, counts: torch.Tensor, presence: torch.Tensor, frequency: torch.Tensor
) -> torch.Tensor:
    """OpenAI's penalties over ``counts`` ``[B, V]`` of each row's generated tokens: minus ``frequency * count``,
    minus ``presence`` where the count is positive."""
    return logits - frequency[:, None] * counts - presence[:, None] * (counts > 0).to(logits.dtype)


def top_logprobs(logits: torch.Tensor, token: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the sampled ``token``'s log-probability ``[B]``, the ``k`` best log-probabilities ``[B, k]`` and their ids)
    under ``logits`` (the model's own distribution: before bias, penalties, temperature and masks)."""
    lp = logits.float().log_softmax(dim=-1)
    best = lp.topk(k, dim=-1)
    return lp.gather(-1, token[:, None])[:, 0], best.values, best.indices
