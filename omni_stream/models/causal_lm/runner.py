"""CausalLMRunner: a decoder-only LM as a :class:`~omni_stream.batch_model.BatchModel` over a slot-indexed KV cache.

One step: newcomers are prefilled together into their slots (prompts right-padded to the longest; other slots
keep their rows), then every row of the step decodes one token: logits from the row's last hidden state,
repetition penalty, per-row sampling (temperature, top-k, top-p, greedy; exponential race with counter-based
noise from :mod:`omni_stream.runtime.rng`, so a seeded row draws the same tokens whoever it is batched with),
then the sampled token runs through the layers at the row's next position. One device-to-host copy per step
carries every row's token; each token then goes through the row's :class:`~.detokenize.TextStream` on this
(the worker) thread and comes out as one :class:`~omni_stream.chunks.TextDelta` (empty while a character is
incomplete or a stop string might be starting).

The decode step works on slots ``0..b-1`` where ``b`` covers the highest slot in the step, so its cost follows
the live rows (the scheduler hands out the lowest free slot); rows marked idle in a static ``active`` mask compute
along, write their K/V into a scratch column and keep their state. Its shapes depend only on ``(b, span, full)``
(``full``: some row samples or has a repetition penalty; else a plain argmax), so on CUDA the whole step is one
CUDA graph per (batch bucket, attention-span bucket, mode), replayed after one host-to-device copy of the mask.
On the CPU, and for shapes outside the buckets, the same function runs eagerly at the exact shape.

A lone newcomer (the common case of a voice agent's turn, and of any request arriving on its own) is prefilled at
a bucketed length (:data:`PREFILL_BUCKET` doubling up to ``max_len``): its prompt is padded, the padding masked,
and on CUDA each length bucket's prefill is a CUDA graph captured with the decode graphs at load, so a prompt
length seen for the first time costs what it costs the tenth time (eagerly, each new length paid its kernel
selection and allocations, ~80 ms against ~27 ms warm at c=1 on Qwen3-0.6B). ``pad_lone_prefill`` runs the same
bucketed prefill eagerly (CPU tests show its shapes in the step log). Several newcomers prefill together, eagerly,
at the length bucket of the longest (padded likewise). With ``group_prefill`` (``Tuning.group_prefill_graphs``, on by
default) they prefill from static buffers at a (batch bucket, length bucket) shape instead, the
rows past the newcomers writing a scratch slot of their own, and on CUDA each such shape up to
:data:`GROUP_PREFILL_MAX_LEN` positions is a CUDA graph captured at load: a voice agent's sessions that end their turns
together send 16-32 prompts at once, whose eager prefill launched every layer's kernels from the worker thread while
the serving process's other threads held the interpreter (``voice_bench`` run 43: text steps of 14-28 ms while 16-32
newcomers were prefilled; run 45, graphs against eager in one call: the answer's LM phase 381 -> 142 ms at 16
sessions, 422 -> 226 ms at 32).

On CUDA the layers run as the fused Triton kernels (residual+norm, q/k norm+rotary for Qwen3, SiLU-and-multiply);
sampling stays in torch (the Triton sampler holds a whole row in one block, sized for the talker's 3072 codes, not
a 150k-token vocabulary).

Beyond sampling, a row may carry (each only costs the steps of a batch that has such a row, as bits of the
step's mode): a grammar (an llguidance matcher, :mod:`.constraint`): its next-token bitmask is applied to the
logits and the sampled token fed back; the masks of the next step are computed in a thread as soon as the tokens
are known, overlapping the host's work until the next step starts; OpenAI's ``logit_bias`` and presence and
frequency penalties (over the row's generated tokens, counted on the device); and log-probabilities of the
model's own distribution (the sampled token's and the 20 best, copied with the tokens). Rows that need none of
it get identities (all-ones masks, zero bias), so a free row draws the same tokens beside a constrained one.

Ending: an EOS id from ``generation_config.json`` ends the row with ``finish_reason="stop"`` (``ignore_eos``:
generation goes on), as does a stop string (the text stops before it); the ``max_tokens``-th token ends it with
``"length"``. Every sampled token, EOS included, is one item (one token of usage).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from omni_stream.batch_model import Batch, SeqOutput, Sequence
from omni_stream.chunks import TextDelta
from omni_stream.errors import InvalidRequestError
from omni_stream.models.causal_lm.constraint import fill_masks
from omni_stream.models.causal_lm.detokenize import Decode, TextStream
from omni_stream.models.causal_lm.model import CausalLM
from omni_stream.requests import SamplingParams
from omni_stream.runtime import rng
from omni_stream.runtime.cuda_graphs import GraphSet, length_buckets, pick
from omni_stream.runtime.decoder_kernels import DecodeKernels
from omni_stream.runtime.kv_cache import KVShape, attention
from omni_stream.runtime.load_display import ProgressFactory
from omni_stream.runtime.sampling import (
    HeldSampling,
    SamplingTensors,
    apply_bitmask,
    apply_penalties,
    apply_repetition_penalty,
    bitmask_words,
    sample,
    top_logprobs,
)
from omni_stream.runtime.slot_runner import SlotKVRunner, padded_causal_mask, select_kernels
from omni_stream.text.logprobs import TokenLogprob

log = logging.getLogger(__name__)

SPAN_BUCKET = 256  # smallest attention-span bucket of the decode graphs (positions)
TOP_LOGPROBS = 20  # alternatives computed when any row asks for log-probabilities (OpenAI's maximum)
# What a decode step computes beyond a plain argmax (bits of its mode; one graph per bucket and mode).
FULL, MASK, ADJUST, LOGPROBS = 1, 2, 4, 8
PREFILL_BUCKET = 32  # smallest prompt-length bucket of a lone newcomer's prefill (positions)
GROUP_PREFILL_MAX_LEN = 512  # longest length bucket of the newcomers' group prefill at static shapes (positions)


@dataclass(slots=True, frozen=True)
class Prompt:
    """A request's prompt as a text runner reads it: token ids (a family's prompts may carry more: images)."""

    ids: tuple[int, ...]


@dataclass(slots=True, frozen=True)
class LMRequest:
    """The scheduler payload of one generation: prompt ids and how to generate (``max_tokens`` >= 1).

    ``matcher``: an llguidance matcher the reply must follow (:mod:`.constraint`), None: free. ``presence_penalty``,
    ``frequency_penalty`` and ``logit_bias`` follow OpenAI; ``logprobs`` None: none, else that many alternatives.
    """

    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    matcher: Any = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None
    grammar_field: str | None = None  # the request field the matcher's grammar came from (its errors name it)

    @property
    def adjusts(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias)


LMSeq = Sequence[LMRequest]
LMOut = SeqOutput[TextDelta]


@dataclass(slots=True)
class _SlotState:
    """Host-side mirror of one running sequence (worker thread only)."""

    slot: int
    length: int  # positions written to the KV cache
    max_tokens: int
    ignore_eos: bool
    full: bool  # needs the full sampler (sampling or a repetition penalty)
    text: TextStream
    generated: int = 0
    tokens: list[int] | None = field(default=None)  # every sampled id, when the runner records
    matcher: Any = None  # the reply's grammar (llguidance), None: free
    grammar_field: str | None = None
    adjust: bool = False  # logit bias or presence/frequency penalties
    logprobs: int | None = None  # alternatives to report, None: no log-probabilities

    @property
    def mode(self) -> int:
        return (
            (FULL if self.full else 0)
            | (MASK if self.matcher is not None else 0)
            | (ADJUST if self.adjust else 0)
            | (LOGPROBS if self.logprobs is not None else 0)
        )


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Causal attention of padded prompts (``mask`` ``[B, 1, T, T]``; None: one unpadded prompt)."""
    if not q.is_cuda:
        if mask is None:
            t = q.shape[2]
            mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        return attention(q, k, v, mask)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


class CausalLMRunner(SlotKVRunner[LMRequest, TextDelta, _SlotState]):
    """Batched decoding over a slot-indexed static KV cache (see module docstring; the skeleton every slot-KV
    runner shares: :class:`~omni_stream.runtime.slot_runner.SlotKVRunner`)."""

    state_type = _SlotState

    def __init__(
        self,
        lm: CausalLM,
        decode: Decode,
        *,
        eos_token_ids: tuple[int, ...] = (),
        max_batch_size: int = 8,
        max_len: int = 2048,
        graphs: bool | None = None,
        fused: DecodeKernels | bool | None = None,
        group_prefill: bool = False,
        record: bool = False,
        token_bytes: Callable[[int], bytes] | None = None,
    ) -> None:
        """``decode``: ids -> text (special tokens skipped); ``max_len``: positions per slot (prompt + output);
        ``token_bytes``: the bytes a token stands for, for logprobs (None: its text's UTF-8).

        ``graphs``: replay CUDA graphs of the decode step (None: on CUDA devices). ``fused``: decoder layers as
        fused kernels (None: the Triton kernels on CUDA when Triton is installed; False: the modules).
        ``group_prefill``: newcomers prefilled together at static (batch, length) bucket shapes, graphed with
        ``graphs`` (the module docstring). ``record``: keep each sequence's sampled ids in ``recorded[seq_id]``.
        """
        self.lm = lm.eval()
        self.cfg = cfg = lm.config
        w = lm.model.embed_tokens.weight
        self.kernels = kernels = select_kernels(w.device, fused)
        lm.use_kernels(kernels)
        self.decode_text = decode
        self.token_bytes = token_bytes
        self.eos = frozenset(eos_token_ids)
        self.vocab = cfg.vocab_size
        length = min(max_len, cfg.max_position_embeddings)
        s = max_batch_size
        scratch = 1 if group_prefill else 0  # the group prefill's padding rows write a slot no sequence owns
        self._init_slots(
            device=w.device,
            dtype=w.dtype,
            max_batch_size=s,
            max_len=length,
            kv=KVShape(cfg.num_hidden_layers, s + scratch, cfg.num_key_value_heads, length + 1, cfg.head_dim),
            graphs=graphs,
            graph_step=self._run_rows,
            smallest_span=SPAN_BUCKET,
            noise_width=self.vocab,
        )
        dev = self.device
        self.hidden = torch.zeros(s + scratch, cfg.hidden_size, dtype=self.dtype, device=dev)
        self.seen = torch.zeros(s, self.vocab, dtype=torch.bool, device=dev)
        self._true = torch.ones((), dtype=torch.bool, device=dev)
        self.tokens_out = torch.zeros(s, dtype=torch.long, device=dev)
        self.params = SamplingTensors.empty(s, dev)
        self.held_params = HeldSampling(self.params)
        # Grammar masks: a bitmask row per slot (all ones for free rows), filled on the host by llguidance.
        words = bitmask_words(self.vocab)
        self.bitmask = torch.full((s, words), -1, dtype=torch.int32, device=dev)
        self._bitmask_host = (
            self.bitmask if dev.type == "cpu" else torch.full((s, words), -1, dtype=torch.int32, pin_memory=True)
        )
        self._masks: Future[None] | None = None  # the next step's masks, computed while the host does other work
        self._mask_pool = ThreadPoolExecutor(1, thread_name_prefix="lm-masks")
        # Logit bias and OpenAI's penalties over each row's generated tokens.
        self.bias = torch.zeros(s, self.vocab, dtype=torch.float32, device=dev)
        self.counts = torch.zeros(s, self.vocab, dtype=torch.float32, device=dev)
        self.presence = torch.zeros(s, dtype=torch.float32, device=dev)
        self.frequency = torch.zeros(s, dtype=torch.float32, device=dev)
        self.lp_token = torch.zeros(s, dtype=torch.float32, device=dev)
        self.lp_top = torch.zeros(s, TOP_LOGPROBS, dtype=torch.float32, device=dev)
        self.lp_ids = torch.zeros(s, TOP_LOGPROBS, dtype=torch.long, device=dev)
        self.record = record
        self.recorded: dict[int, list[int]] = {}
        # A lone newcomer's prefill at bucketed lengths (static buffers; graphs on CUDA)
        self.prefill_buckets = length_buckets(self.max_len, PREFILL_BUCKET)
        self.pad_lone_prefill = self.use_graphs
        self._pf_ids = torch.zeros(1, self.max_len, dtype=torch.long, device=dev)
        self._pf_positions = torch.arange(self.max_len, device=dev)[None]
        self._pf_length = torch.ones(1, dtype=torch.long, device=dev)
        self._pf_slot = torch.zeros(1, dtype=torch.long, device=dev)
        self.prefill_graphs = GraphSet(self._prefill_lone, dev) if self.use_graphs else None
        self.prefill_log: list[tuple[int, int, str]] = []  # (newcomers, padded length, "graph"|"eager") when recording
        # Newcomers together at (batch bucket, length bucket) shapes (static buffers; graphs on CUDA)
        self.group_prefill = group_prefill
        self.group_batches = tuple(b for b in self.batch_buckets if b >= 2) if group_prefill else ()
        self.group_lengths = tuple(t for t in self.prefill_buckets if t <= GROUP_PREFILL_MAX_LEN)
        self.group_batch_log: list[int] = []  # the batch bucket of each group prefill at static shapes (recording)
        widest = max(self.group_batches, default=0)
        self._pg_ids = torch.zeros(widest, min(self.max_len, GROUP_PREFILL_MAX_LEN), dtype=torch.long, device=dev)
        self._pg_length = torch.ones(widest, dtype=torch.long, device=dev)
        self._pg_slot = torch.full((widest,), s, dtype=torch.long, device=dev)
        self._pg_rows = torch.arange(widest, device=dev)
        graphed = group_prefill and self.use_graphs
        self.group_graphs = GraphSet(self._prefill_group, dev) if graphed else None

    # -- CUDA graphs ------------------------------------------------------------------------------------

    def capture_graphs(self, progress: ProgressFactory | None = None) -> float:
        """Capture the decode step for every (batch, span, mode) bucket, largest first; returns seconds (0 without
        graphs). Needs no running sequence: every row is idle while it is captured."""
        seconds = self._capture_decode(((FULL,), (0,)), progress)
        if self.prefill_graphs is None:
            return seconds
        # The scratch slot: a capture's prefill writes K/V rows and a hidden state no sequence owns yet (at load).
        self._pf_slot.fill_(self.max_batch_size - 1)
        self._pf_length.fill_(1)
        lone = [(t,) for t in self.prefill_buckets if (t,) not in self.prefill_graphs]
        seconds += self.prefill_graphs.capture_all(lone, progress=progress, desc="capturing prefill graphs")
        if self.group_graphs is None:
            return seconds
        self._pg_slot.fill_(self.max_batch_size)  # every row on the scratch slot while capturing
        self._pg_length.fill_(1)
        shapes = [(b, t) for b in reversed(self.group_batches) for t in reversed(self.group_lengths)]
        shapes = [k for k in shapes if k not in self.group_graphs]
        return seconds + self.group_graphs.capture_all(shapes, progress=progress, desc="capturing group prefill graphs")

    @property
    def capture_seconds(self) -> float:
        graphs = (self.graphs, self.prefill_graphs, self.group_graphs)
        return sum(g.capture_seconds for g in graphs if g is not None)

    # -- BatchModel -------------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, batch: Batch[LMRequest]) -> list[LMOut]:
        """Prefill ``batch.prefill``, then give every row of the batch its next token."""
        self._join_masks()  # before any slot changes hands: the job writes the rows it was given
        outputs: dict[int, LMOut] = {}
        admitted: list[tuple[LMSeq, tuple[int, ...]]] = []
        for seq in batch.prefill:
            try:
                admitted.append((seq, self._admit(seq)))
            except Exception as exc:  # one newcomer's failure must not end the running rows
                self._reject(seq, exc, outputs)
        try:
            self._write_newcomers([seq for seq, _ in admitted])
        except Exception as exc:  # the step's newcomers end; the running rows go on
            for seq, _ in admitted:
                self._reject(seq, exc, outputs)
            admitted = []
        rows = [*self._prefill_all(admitted, outputs), *batch.decode]
        if rows:
            states = [self._state(seq) for seq in rows]
            tokens, logprobs = self._decode(states)
            for i, (seq, st, token) in enumerate(zip(rows, states, tokens, strict=True)):
                outputs[seq.seq_id] = self._emit(seq, st, token, None if logprobs is None else logprobs[i])
            self._submit_masks([st for seq, st in zip(rows, states, strict=True) if not outputs[seq.seq_id].finished])
        return [outputs[seq.seq_id] for seq in (*batch.prefill, *batch.decode)]

    # -- grammar masks ---------------------------------------------------------------------------------------

    def _submit_masks(self, states: list[_SlotState]) -> None:
        """Start computing the next masks of the constrained rows (a thread; llguidance releases the GIL), so the
        work overlaps the scheduler's and the event loop's until the next step joins it."""
        pairs = [(st.matcher, st.slot) for st in states if st.matcher is not None]
        if pairs:
            self._masks = self._mask_pool.submit(fill_masks, pairs, self._bitmask_host)

    def _join_masks(self) -> None:
        job, self._masks = self._masks, None
        if job is not None:
            job.result()

    # -- admission and prefill --------------------------------------------------------------------------

    def _admit(self, seq: LMSeq) -> tuple[int, ...]:
        """Check the request, take its slot and keep its host-side state; returns the prompt ids. Its device state
        is written with the step's other newcomers' (:meth:`_write_newcomers`)."""
        req = self._take_slot(seq, LMRequest)
        slot = seq.slot
        n = len(req.prompt_ids)
        if n < 1:
            raise InvalidRequestError("the prompt has no tokens", "prompt")
        if req.max_tokens < 1 or n + req.max_tokens > self.max_len:
            raise InvalidRequestError(
                f"the prompt ({n} tokens) + max_tokens ({req.max_tokens}) exceeds the context of {self.max_len} tokens",
                "max_tokens",
            )
        if min(req.prompt_ids) < 0 or max(req.prompt_ids) >= self.vocab:
            raise ValueError(f"prompt ids outside the vocabulary of {self.vocab}: tokenizer and model disagree")
        full = req.sampling.do_sample or req.sampling.repetition_penalty != 1.0
        st = _SlotState(slot, n, req.max_tokens, req.ignore_eos, full, TextStream(self.decode_text, req.stop))
        st.matcher, st.grammar_field, st.adjust, st.logprobs = req.matcher, req.grammar_field, req.adjusts, req.logprobs
        if req.matcher is not None:
            self._bitmask_host[slot] = -1
            fill_masks([(req.matcher, slot)], self._bitmask_host)
        if self.record:
            st.tokens = self.recorded[seq.seq_id] = []
        self._hold(seq, st)
        return req.prompt_ids

    def _write_newcomers(self, seqs: list[LMSeq]) -> None:
        """The admitted newcomers' device state, all of them at once: one copy of their values from pinned memory,
        then a few torch calls per tensor whatever their number (``tests/test_causal_lm_runner.py`` counts them).
        Written a newcomer at a time it was a dozen calls each, and every call from the worker thread may wait for
        the interpreter while the server's other threads hold it. (The burst steps' time under 32 voice sessions,
        37-46 ms for 8-22 newcomers on one H100, did not change with this: voice_bench run 59.)"""
        if not seqs:
            return
        reqs: list[LMRequest] = [seq.payload for seq in seqs]
        slots = [seq.slot for seq in seqs]
        lengths = [len(r.prompt_ids) for r in reqs]
        seeds = [r.seed % (1 << 63) if r.seed is not None else secrets.randbits(63) for r in reqs]
        # the repetition penalty counts the prompt too (as transformers does): each prompt id marks its row
        # (numpy builds the thousands of (row, id) pairs of a burst without a Python loop over them)
        marked_rows = np.repeat(np.asarray(slots, dtype=np.int64), lengths)
        marked_ids = np.concatenate([np.asarray(r.prompt_ids, dtype=np.int64) for r in reqs])
        values = np.concatenate([np.asarray(slots + lengths + seeds, dtype=np.int64), marked_rows, marked_ids])
        host = self._host_array(values)
        k, m = len(seqs), len(marked_ids)
        rows, lens, seed, seen_rows, seen_ids = host.to(self.device, non_blocking=True).split([k, k, k, m, m])
        self.seen.index_fill_(0, rows, False)
        self.seen.index_put_((seen_rows, seen_ids), self._true)
        self.steps.index_fill_(0, rows, 0)
        self.lengths.index_copy_(0, rows, lens)
        self.seeds.index_copy_(0, rows, seed)
        self.counts.index_fill_(0, rows, 0)
        self.held_params.write(slots, rows, [r.sampling for r in reqs], self._upload)
        free = [slot for slot, r in zip(slots, reqs, strict=True) if r.matcher is None]
        if free:
            self._bitmask_host[free] = -1  # every token allowed (a matcher's row was filled at admission)
        for slot, req in zip(slots, reqs, strict=True):
            if req.adjusts:  # OpenAI's penalties and logit bias: rare, row by row
                self.presence[slot], self.frequency[slot] = req.presence_penalty, req.frequency_penalty
                self.bias[slot] = 0
                biased = [(t, b) for t, b in req.logit_bias if t < self.vocab]
                if biased:
                    ids_, biases = zip(*biased, strict=True)
                    self.bias[slot, list(ids_)] = torch.tensor(biases, dtype=torch.float32, device=self.device)

    def _prefill_all(self, admitted: list[tuple[LMSeq, tuple[int, ...]]], outputs: dict[int, LMOut]) -> list[LMSeq]:
        """Prefill the admitted newcomers together (one by one when that fails); returns those that joined."""
        seqs = [seq for seq, _ in admitted]
        return self._prefill_each(seqs, [(seq.slot, ids) for seq, ids in admitted], self._prefill, outputs)

    def _padded_ids(self, prompts: list[tuple[int, tuple[int, ...]]], t: int) -> torch.Tensor:
        """The prompts' ids right-padded with 0 to ``t`` positions, ``[len(prompts), t]`` on the device: one copy
        from pinned memory (padding positions are masked, so their ids do not matter)."""
        padded = np.zeros((len(prompts), t), dtype=np.int64)
        for row, (_, ids) in enumerate(prompts):
            padded[row, : len(ids)] = ids
        return self._host_array(padded).to(self.device, non_blocking=True)

    def _prefill(self, prompts: list[tuple[int, tuple[int, ...]]]) -> None:
        """One forward over every newcomer's prompt; K/V rows go to each one's slot, its last hidden state kept."""
        if len(prompts) == 1 and self.pad_lone_prefill:
            slot, ids = prompts[0]
            bucket = pick(self.prefill_buckets, len(ids))
            assert bucket is not None  # _admit refused prompts longer than the context
            self._pf_ids[:, : len(ids)].copy_(self._padded_ids(prompts, len(ids)))
            self._pf_length.fill_(len(ids))
            self._pf_slot.fill_(slot)
            replayed = self.prefill_graphs is not None and self.prefill_graphs.replay((bucket,))
            if not replayed:
                self._prefill_lone(bucket)
            if self.record:
                self.prefill_log.append((1, bucket, "graph" if replayed else "eager"))
            return
        lengths = [len(ids) for _, ids in prompts]
        t = max(lengths)
        if self.group_prefill and self._prefill_static(prompts, lengths):
            return
        if self.pad_lone_prefill:
            # Newcomers together run eagerly, at their length bucket: at an exact new length the first prefill paid
            # its kernels' specialization for the new shape (voice_bench run 31: a 16-session level's first round
            # spent 1.7 s more in LM steps than its second, 39 ms a step against 11)
            t = pick(self.prefill_buckets, t) or t
        padded = self._padded_ids(prompts, t)
        slots = torch.tensor([slot for slot, _ in prompts], dtype=torch.long, device=self.device)
        lens = torch.tensor(lengths, dtype=torch.long, device=self.device)
        positions = torch.arange(t, device=self.device)[None].expand(len(prompts), -1)
        mask = padded_causal_mask(lens, t) if min(lengths) != t else None  # unpadded: SDPA's causal rule
        attend = self._prefill_attend(slots, t, mask, prefill_attention)
        hidden = self.lm(self.lm.embed(padded), positions, attend)
        self.hidden[slots] = hidden[torch.arange(len(prompts), device=self.device), lens - 1]
        if self.record:
            self.prefill_log.append((len(prompts), t, "eager"))

    def _prefill_static(self, prompts: list[tuple[int, tuple[int, ...]]], lengths: list[int]) -> bool:
        """Several newcomers at a (batch bucket, length bucket) shape from the static buffers: the rows past them on
        the scratch slot (length 1); its graph where captured, else eagerly at that shape. False: no bucket fits."""
        n = len(prompts)
        b, t = pick(self.group_batches, n), pick(self.group_lengths, max(lengths))
        if b is None or t is None:
            return False
        longest = max(lengths)  # past a prompt's length: padding or stale ids, masked (as the lone prefill)
        self._pg_ids[:n, :longest].copy_(self._padded_ids(prompts, longest))
        scratch = self.max_batch_size
        meta = torch.tensor([[slot for slot, _ in prompts] + [scratch] * (b - n), lengths + [1] * (b - n)])
        self._pg_slot[:b].copy_(meta[0])
        self._pg_length[:b].copy_(meta[1])
        replayed = self.group_graphs is not None and self.group_graphs.replay((b, t))
        if not replayed:
            self._prefill_group(b, t)
        if self.record:
            self.prefill_log.append((n, t, "graph" if replayed else "eager"))
            self.group_batch_log.append(b)
        return True

    @torch.no_grad()
    def _prefill_group(self, b: int, t: int) -> None:
        """The static-buffer prefill of ``b`` prompts padded to ``t`` positions (a CUDA graph per ``(b, t)``): each
        row's padding keys masked, the rows past the newcomers on the scratch slot (their K/V and hidden state
        written where no sequence reads)."""
        slots, lengths = self._pg_slot[:b], self._pg_length[:b]
        positions = self._pf_positions[:, :t].expand(b, -1)
        attend = self._prefill_attend(slots, t, padded_causal_mask(lengths, t), prefill_attention)
        hidden = self.lm(self.lm.embed(self._pg_ids[:b, :t]), positions, attend)
        self.hidden.index_copy_(0, slots, hidden[self._pg_rows[:b], lengths - 1])

    @torch.no_grad()
    def _prefill_lone(self, t: int) -> None:
        """The static-buffer prefill of one prompt padded to ``t`` positions (a CUDA graph per ``t``): the padding's
        keys are masked, and the K/V it writes past the prompt lie beyond the row's length, never read before the
        row's own decode steps overwrite them."""
        ids, positions = self._pf_ids[:, :t], self._pf_positions[:, :t]
        attend = self._prefill_attend(self._pf_slot, t, padded_causal_mask(self._pf_length, t), prefill_attention)
        hidden = self.lm(self.lm.embed(ids), positions, attend)
        self.hidden.index_copy_(0, self._pf_slot, hidden[0].index_select(0, self._pf_length - 1))

    # -- decode -------------------------------------------------------------------------------------------

    def _decode(self, states: list[_SlotState]) -> tuple[list[int], list[TokenLogprob] | None]:
        """One token for each row (one device-to-host copy), and their log-probabilities where any row asks."""
        slots = [st.slot for st in states]
        n = max(slots) + 1
        span = max(st.length for st in states) + 1
        full = 0
        for st in states:
            full |= st.mode
        if full & MASK and self._bitmask_host is not self.bitmask:
            self.bitmask[:n].copy_(self._bitmask_host[:n], non_blocking=True)
        self._mark_active(slots)
        b = self._replay_or_run(n, span, (full,), lambda b, span: self._run_rows(b, span, full))
        tokens = self.tokens_out[:b].cpu()
        chosen = tokens[slots].tolist()
        if not full & LOGPROBS:
            return chosen, None
        lp_token, lp_top, lp_ids = self.lp_token[:b].cpu(), self.lp_top[:b].cpu(), self.lp_ids[:b].cpu()
        out = []
        for st, token in zip(states, chosen, strict=True):
            k = st.logprobs or 0
            ids, values = lp_ids[st.slot, :k].tolist(), lp_top[st.slot, :k].tolist()
            top = tuple((self.decode_text([i]), v) for i, v in zip(ids, values, strict=True))
            raw = self.token_bytes(token) if self.token_bytes is not None else None
            top_raw = tuple(self.token_bytes(i) for i in ids) if self.token_bytes is not None else ()
            out.append(TokenLogprob(self.decode_text([token]), float(lp_token[st.slot]), top, raw, top_raw))
        return chosen, out

    @torch.no_grad()
    def _run_rows(self, b: int, span: int, mode: int) -> None:
        """The decode step over slots ``0..b-1``, attention over ``span`` positions (static tensors only).

        Rows marked in ``active`` advance; the others compute along and are discarded. ``mode``: the bits of what
        some row needs (:data:`FULL` sampling, grammar :data:`MASK`, bias and penalties :data:`ADJUST`,
        :data:`LOGPROBS`); rows that need less get the identity of each (zero bias and penalties, all-ones masks).
        """
        rows, act = self._rows[:b], self.active[:b]
        h, steps, lengths, seen = self.hidden[:b], self.steps[:b], self.lengths[:b], self.seen[:b]
        raw = logits = self.lm.logits(h).float()
        if mode & ADJUST:
            logits = logits + self.bias[:b]
        if mode & FULL:
            params = self.params.head(b)
            logits = apply_repetition_penalty(logits, seen, params.repetition_penalty)
        if mode & ADJUST:
            logits = apply_penalties(logits, self.counts[:b], self.presence[:b], self.frequency[:b])
        if mode & MASK:
            logits = apply_bitmask(logits, self.bitmask[:b])
        if mode & FULL:
            noise = rng.exponential(rng.row_keys(self.seeds[:b], steps), self.vocab)
            token = sample(logits, params, noise)
        else:
            token = logits.argmax(dim=-1)
        if mode & LOGPROBS:
            self.lp_token[:b], self.lp_top[:b], self.lp_ids[:b] = top_logprobs(raw, token, TOP_LOGPROBS)
        self.counts[:b].scatter_add_(1, token[:, None], act[:, None].float())
        seen.scatter_(1, token[:, None], seen.gather(1, token[:, None]) | act[:, None])
        write = torch.where(act, lengths, self.max_len)
        attend = self.kv.decode_rows(rows, write, lengths, span)
        hidden = self.lm(self.lm.embed(token)[:, None], lengths[:, None], attend)
        self.hidden[:b] = torch.where(act[:, None], hidden[:, 0], h)
        inc = act.long()
        steps += inc
        lengths += inc
        self.tokens_out[:b] = token

    def _emit(self, seq: LMSeq, st: _SlotState, token: int, logprob: TokenLogprob | None = None) -> LMOut:
        """The row's delta for ``token``, and whether the row is done."""
        st.generated += 1
        st.length += 1
        if st.tokens is not None:
            st.tokens.append(token)
        index = st.generated - 1
        lps = () if logprob is None else (logprob,)
        if st.matcher is not None and token in self.eos and not st.matcher.is_accepting():
            # llguidance allows EOS alone where its grammar has no way on (a schema with no value at all): the reply
            # would end as if complete, a forced call with no call in it
            message = "the reply cannot follow the schema to its end: it admits no value (a $ref only to itself?)"
            return SeqOutput(seq.seq_id, error=InvalidRequestError(message, st.grammar_field), finished=True)
        if st.matcher is not None and not st.matcher.consume_token(token):
            log.error("sequence %s left its grammar at token %d: %s", seq.seq_id, token, st.matcher.get_error())
        if token in self.eos and not st.ignore_eos:
            text, _ = st.text.finish()
            delta = TextDelta(text, index, final=True, finish_reason="stop", logprobs=lps)
            return SeqOutput(seq.seq_id, delta, finished=True)
        text, stopped = st.text.push(token)
        if not stopped and st.generated >= st.max_tokens:
            rest, stopped = st.text.finish()
            text += rest
            reason = "stop" if stopped else "length"
            delta = TextDelta(text, index, final=True, finish_reason=reason, logprobs=lps)
            return SeqOutput(seq.seq_id, delta, finished=True)
        if stopped:
            delta = TextDelta(text, index, final=True, finish_reason="stop", logprobs=lps)
            return SeqOutput(seq.seq_id, delta, finished=True)
        return SeqOutput(seq.seq_id, TextDelta(text, index, logprobs=lps))
