"""Qwen3TTSRunner: the talker + code predictor as a :class:`~omni_stream.batch_model.BatchModel`.

One step: newcomers are prefilled into their slots of the static KV cache (each at its own length, while
other slots keep their rows), then every row in the step decodes together: sample code 0 from the last
talker hidden state (per-row parameters), run the 15-step code predictor, form the next talker input (sum
of the 16 codebook embeddings + the row's next trailing text embedding, ``tts_pad`` after) and advance the
talker by one position. One batched device-to-host copy per step carries all rows' codes; each row gets
one :class:`CodecFrames` (16 codes) per step.

The decode step works on the first ``b`` slots of the slot-indexed state (no gathers; the scheduler hands
out the lowest free slot, so ``b`` follows the live batch): rows of the step are marked in a static ``active``
mask, idle rows compute along but write their K/V into a scratch column and keep their state. Its shapes
depend only on ``(b, span)``, so on CUDA the whole step (code-0 sampling, the 15-step code predictor
with in-graph sampling noise, the talker layer stack) is one CUDA graph per
(batch bucket, attention-span bucket), replayed after one host-to-device copy of the mask. Elsewhere, and
for shapes outside the buckets, the same function runs eagerly at the exact shape. A step's newcomers prefill
through a graph per (newcomer-count bucket, prompt-length bucket) of at most :data:`PREFILL_GRAPH_POSITIONS`
padded positions, a larger burst as several such groups, their prompts right-padded in a static buffer and
padding rows writing a scratch slot (prompts past every length bucket: one eager padded forward); on CUDA the
decoder layers run as fused Triton kernels
(:mod:`omni_stream.runtime.decoder_kernels`).

Host work per step is kept to a few interpreter round trips (each torch call releases and retakes the GIL,
which the event loop may hold): the row mask is uploaded only when the step's rows change, and the codes
come back in one copy and are split with numpy.

Stepping ahead (on CUDA by default): a call waits for the decode step the previous call launched, prefills its
newcomers, launches the next decode step for every row that may draw another frame, and only then hands out the
frames it collected. So a row's frame arrives one call after its step was launched (a newcomer's first with the
call after its prefill), and the host's work between steps (the outputs, the scheduler, the stages' codec jobs,
the event loop's share of the GIL) overlaps the device's next step instead of leaving the device idle: at
c = 128 that work was ~20 % of a step (``benchmarks/results/tts_bench.md``, run 25's sampled profile). Nothing
is computed speculatively: a step is launched only for rows that will use its frame (an EOS or the length limit
is known from the frame collected before), so a row released meanwhile is the only wasted work (its frame is
dropped; its slot's state is rewritten by the next owner's prefill, queued behind the step on the same stream).

Latency levers under open-loop load (fields of the tuning object, off by default until measured A/B with
``benchmarks/tts_load.py --arm``): ``admit_after_collect`` (the scheduler calls :meth:`settle` before it picks a
batch, so a request that arrived while the step in flight ran joins the next launch instead of waiting behind one
more step), ``first_window_wait_ms`` (:meth:`jobs_due` counts the first audio windows a call's frames complete;
the worker waits for their codec jobs before the next step, so they run beside the step already launched) and
``prefill_budget`` (prompt positions per call; a longer prompt goes in over several calls while the running rows
keep stepping).

Length rule (reference parity): ``max_new_tokens = N`` allows N code-0 samples, and the last one never gets
residual codes, so at most N - 1 frames; an EOS code 0 ends the sequence and its frame is dropped.
``ignore_eos`` (benchmarks) bans EOS and yields exactly N frames.
"""

from __future__ import annotations

import logging
import secrets
from collections import deque
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np
import torch

from omni_stream.batch_model import Batch, SeqOutput, Sequence
from omni_stream.chunks import CodecFrames
from omni_stream.errors import InvalidRequestError
from omni_stream.models.qwen3_tts.config import CODEBOOK_SIZE, CONTROL_ID_SPAN, NUM_CODE_GROUPS
from omni_stream.models.qwen3_tts.prompt import TalkerRequest, embed_prompts, embed_tts_pad
from omni_stream.models.qwen3_tts.talker import Qwen3TTSLM
from omni_stream.runtime import rng
from omni_stream.runtime.cuda_graphs import GraphSet, pick
from omni_stream.runtime.decoder_kernels import DecodeKernels
from omni_stream.runtime.kv_cache import KVShape
from omni_stream.runtime.load_display import ProgressFactory
from omni_stream.runtime.sampling import HeldSampling, SamplingTensors, apply_repetition_penalty, mask_tokens
from omni_stream.runtime.slot_runner import SlotKVRunner, padded_causal_mask, select_kernels
from omni_stream.scheduler import run_offline

log = logging.getLogger(__name__)

MIN_NEW_TOKENS = 2  # the reference bans EOS for the first two code-0 samples
CP_STEPS = NUM_CODE_GROUPS - 1
TRAILING_CAPACITY = 256  # trailing text rows per slot before the buffer grows (and graphs are re-captured)
PREFILL_BUCKETS = (32, 64, 128, 256)  # prompt positions of the prefill graphs; longer prompts prefill eagerly
# Padded positions of one prefill graph, at most: a (newcomer-count bucket, length bucket) shape is captured when
# count x length fits, and a larger burst prefills as several such groups, each a graph. One eager forward for the
# whole burst launches every layer's kernels from the worker thread, each launch handing the interpreter to the
# server's other threads and waiting to get it back: with 32 voice sessions on one H100 a talker step that
# prefilled 19 newcomers eagerly took 128 ms and one of 11 took 95 ms (voice_bench at 1add998), where unloaded the
# same forward of 32 x 88 positions took 20.9 ms (and one graph padded to 32 x 128, 26.3 ms: larger groups are
# compute-bound, so they stay within this bound, which is also what 8 newcomers x 256 positions take).
PREFILL_GRAPH_POSITIONS = 2048
SMALLEST_SPAN = 128  # attention span of the smallest decode graph (the talker attention at B=128 reads the span)

TalkerSeq = Sequence[TalkerRequest]
TalkerOut = SeqOutput[CodecFrames]


@dataclass(slots=True)
class _SlotState:
    """Host-side mirror of one running sequence (worker thread only)."""

    slot: int
    length: int  # talker positions written to the KV cache (decode steps launched included)
    steps: int  # code-0 samples launched so far
    max_frames: int
    frames: int  # frames handed out
    ignore_eos: bool
    samples: bool  # talker or sub-talker samples (needs random draws each step)
    # The row's codes from a decode step collected but not yet handed out: (codes [B, 16], row, EOS drawn).
    pending: tuple[np.ndarray, int, bool] | None = None
    window: int = 0  # frames of its first audio window, decided at its first frame (0: not known)
    # A prompt prefilled in chunks (prefill_budget): its embeddings [n, H] until every position is written.
    prompt: torch.Tensor | None = None
    prefilled: int = 0  # positions of ``prompt`` written so far

    def launchable(self) -> bool:
        """Another frame may be drawn: the prompt is in, the length allows one and no EOS waits to be handed out."""
        return (
            self.prompt is None and self.steps < self.max_frames and not (self.pending is not None and self.pending[2])
        )


@dataclass(slots=True)
class _InFlight:
    """A decode step launched and not yet collected: its rows, and the event after its codes' copy to the host."""

    seqs: list[TalkerSeq]
    states: list[_SlotState]
    b: int  # rows computed (slots 0..b-1)
    event: torch.cuda.Event | None  # None: the step ran synchronously (CPU)


class Qwen3TTSRunner(SlotKVRunner[TalkerRequest, CodecFrames, _SlotState]):
    """Batched talker decoding over a slot-indexed static KV cache (see module docstring; the skeleton every
    slot-KV runner shares: :class:`~omni_stream.runtime.slot_runner.SlotKVRunner`)."""

    state_type = _SlotState

    def __init__(
        self,
        lm: Qwen3TTSLM,
        *,
        max_batch_size: int = 8,
        max_len: int = 4096,
        graphs: bool | None = None,
        fused: DecodeKernels | bool | None = None,
        ahead: bool | None = None,
        prefill_budget: int = 0,
    ) -> None:
        """``max_len``: talker positions per slot (prompt + frames; 12.5 frames per second of audio).

        ``graphs``: replay CUDA graphs of the decode step (None: on CUDA devices); see :meth:`capture_graphs`.
        ``fused``: decoder layers as fused kernels (:mod:`omni_stream.runtime.decoder_kernels`); None: the Triton
        kernels on CUDA when Triton is installed, else the modules; False: the modules; or a :class:`DecodeKernels`
        set.
        ``ahead``: launch each decode step before handing out the previous one's frames (see :meth:`step`;
        None: on CUDA devices, where the device then never waits for the host between steps).
        ``prefill_budget``: prompt positions prefilled per call at most (0: no limit); a newcomer's prompt that does
        not fit is prefilled in chunks over the next calls, the running rows stepping meanwhile
        (``Tuning.prefill_budget``).
        """
        self.lm = lm.eval()
        self.cfg = cfg = lm.config
        self.talker = talker = lm.talker
        w = talker.codec_head.weight
        self.kernels = kernels = select_kernels(w.device, fused)
        talker.use_kernels(kernels)
        d = cfg.talker.decoder
        length = min(max_len, d.max_position_embeddings)
        self.vocab = d.vocab_size
        self.noise_width = self.vocab + CP_STEPS * CODEBOOK_SIZE
        # One slot past the last: padding rows of a prefill graph write there; no decode step reads it.
        self.scratch_slot = max_batch_size
        self._init_slots(
            device=w.device,
            dtype=w.dtype,
            max_batch_size=max_batch_size,
            max_len=length,
            kv=KVShape(d.num_hidden_layers, max_batch_size + 1, d.num_key_value_heads, length + 1, d.head_dim),
            graphs=graphs,
            graph_step=self._graph_step,
            smallest_span=SMALLEST_SPAN,
            noise_width=self.noise_width,
        )
        s, dev = max_batch_size, self.device
        self.eos = cfg.talker.codec_eos_token_id
        self.hidden = torch.zeros(s + 1, d.hidden_size, dtype=self.dtype, device=dev)  # + the scratch slot
        self.seen = torch.zeros(s, self.vocab, dtype=torch.bool, device=dev)
        self.no_eos = torch.zeros(s, dtype=torch.bool, device=dev)
        self.talker_params = SamplingTensors.empty(s, dev)
        self.cp_params = SamplingTensors.empty(s, dev)
        self.held_talker_params, self.held_cp_params = HeldSampling(self.talker_params), HeldSampling(self.cp_params)
        cap = min(TRAILING_CAPACITY, self.max_len)
        self.trailing = torch.zeros(s, cap, d.hidden_size, dtype=self.dtype, device=dev)
        self.trailing_len = torch.zeros(s, dtype=torch.long, device=dev)
        self.codes_out = torch.zeros(s, NUM_CODE_GROUPS, dtype=torch.long, device=dev)
        self._codes_host = torch.zeros(s, NUM_CODE_GROUPS, dtype=torch.long, pin_memory=dev.type == "cuda")
        self.ahead = dev.type == "cuda" if ahead is None else ahead
        if prefill_budget < 0:
            raise ValueError(f"prefill_budget must be >= 0 positions, got {prefill_budget}")
        self.prefill_budget = prefill_budget
        self.prefill_log: deque[int] = deque(maxlen=1024)  # prompt positions each recent call prefilled
        self._inflight: _InFlight | None = None
        self.suppress = torch.zeros(self.vocab, dtype=torch.bool, device=dev)
        self.suppress[self.vocab - CONTROL_ID_SPAN :] = True
        self.suppress[self.eos] = False
        self.tts_pad = embed_tts_pad(talker, cfg)
        self.decode_rows: deque[int] = deque(maxlen=1024)  # rows each recent decode step computed
        # Requests served, for the first audio window a row's first frame decides (the family counts them).
        self.load: Callable[[], int] = lambda: self.num_active
        self._due = 0  # first windows the last call's frames completed (jobs_due)
        # Runs after every step, once the step's codes are on the host (the family collects the codec jobs
        # that ran beside it on their own stream).
        self.after_step: Callable[[], object] | None = None
        # Newcomers of a step prefill through a graph per (count bucket, prompt-length bucket), their prompts
        # right-padded in static buffers; padding rows prefill a 1-position prompt into the scratch slot.
        self.prefill_buckets = tuple(n for n in PREFILL_BUCKETS if n <= self.max_len)
        self.prefill_positions = PREFILL_GRAPH_POSITIONS
        smallest = min(self.prefill_buckets, default=1)
        self.prefill_batch_buckets = tuple(b for b in self.batch_buckets if b * smallest <= self.prefill_positions)
        top = max(self.prefill_buckets, default=1)
        pb = self.prefill_batch_buckets[-1]
        # One flat buffer, viewed as [b, n, H] at each shape (b x n <= prefill_positions)
        self._pf_x = torch.zeros(max(self.prefill_positions, top), d.hidden_size, dtype=self.dtype, device=dev)
        self._pf_positions = torch.arange(top, device=dev)[None]
        self._pf_len = torch.ones(pb, dtype=torch.long, device=dev)
        self._pf_slot = torch.full((pb,), self.scratch_slot, dtype=torch.long, device=dev)
        self._pf_rows = torch.arange(pb, device=dev)
        self.prefill_graphs = GraphSet(self._padded_prefill, dev) if self.use_graphs else None
        self.prefill_graph_calls = 0

    # -- CUDA graphs ------------------------------------------------------------------------------------

    def capture_graphs(self, progress: ProgressFactory | None = None) -> float:
        """Capture the decode step for every (batch, span) bucket, largest first, and the prefill for every
        (newcomer-count, prompt-length) bucket; returns seconds (0 without graphs).

        ``progress``: a tqdm-like factory (``progress(total=, desc=, unit=)``). Needs no running sequence:
        every row is idle while the decode step is captured, and the prefill captures write the scratch slot.
        """
        seconds = self._capture_decode(((),), progress)
        if self.prefill_graphs is not None:
            # Capturing runs the prefill of 1-position prompts into the scratch slot: rows no sequence reads.
            self._pf_len.fill_(1)
            self._pf_slot.fill_(self.scratch_slot)
            pending = [k for k in self.prefill_shapes() if k not in self.prefill_graphs]
            seconds += self.prefill_graphs.capture_all(pending, progress=progress, desc="capturing prefill graphs")
        return seconds

    def prefill_shapes(self) -> list[tuple[int, int]]:
        """The (newcomer-count bucket, prompt-length bucket) shapes of the prefill graphs: those of at most
        ``prefill_positions`` padded positions."""
        return [
            (b, n) for b in self.prefill_batch_buckets for n in self.prefill_buckets if b * n <= self.prefill_positions
        ]

    @property
    def capture_seconds(self) -> float:
        """Total time spent capturing graphs so far (warm-up runs included)."""
        graphs = (self.graphs, self.prefill_graphs)
        return sum(g.capture_seconds for g in graphs if g is not None)

    @torch.no_grad()
    def _graph_step(self, b: int, span: int) -> None:
        self._run_rows(b, span, noisy=True)

    # -- BatchModel -------------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, batch: Batch[TalkerRequest]) -> list[TalkerOut]:
        """Prefill ``batch.prefill``, then advance every row by one frame.

        With ``ahead``, a row's frame is the one the previous call launched (a newcomer's first comes with the
        next call): the decode step is launched before this call hands out its outputs and returns, so the
        host's work between steps (outputs, the scheduler, codec jobs) runs while the device computes.
        """
        outputs: dict[int, TalkerOut] = {}
        self._due = 0
        self._collect()
        claimed: list[TalkerSeq] = []
        for seq in batch.prefill:
            try:
                self._admit(seq)
            except Exception as exc:  # one newcomer's failure must not end the running rows
                self._reject(seq, exc, outputs)
                continue
            claimed.append(seq)
        newcomers, admitted = self._embed_all(claimed, outputs)
        if self.prefill_budget:
            rows = self._prefill_in_budget(newcomers, admitted, batch.decode, outputs)
        else:
            rows = self._prefill_all(newcomers, admitted, outputs)
            self.prefill_log.append(sum(x.shape[0] for _, x in admitted))
            rows.extend(batch.decode)
        go = [seq for seq in rows if self._state(seq).launchable()]
        if go:
            self._launch(go)
            if not self.ahead:
                self._collect()
        for seq in rows:
            outputs[seq.seq_id] = self._hand_out(seq)
        if self.after_step is not None:
            self.after_step()
        return [outputs[seq.seq_id] for seq in (*batch.prefill, *batch.decode)]

    def _hand_out(self, seq: TalkerSeq) -> TalkerOut:
        """The row's collected frame, if any; finished once it has no frame left to draw."""
        st = self._state(seq)
        pending, st.pending = st.pending, None
        if pending is None:  # launched this call (ahead): its frame comes with the next one
            return SeqOutput(seq.seq_id, finished=st.steps >= st.max_frames and st.frames >= st.max_frames)
        codes, i, eos = pending
        if eos:
            if 0 < st.frames < st.window:  # the codec stage decodes what it holds as the first window
                self._due += 1
            return SeqOutput(seq.seq_id, finished=True)
        final = st.frames + 1 >= st.max_frames
        if st.frames == 0:
            first = seq.payload.first_window
            st.window = first.decide(self.load()) if first is not None else 0
        frame = CodecFrames(torch.from_numpy(codes[i : i + 1]), start_frame=st.frames, final=final)
        st.frames += 1
        if st.frames == st.window or (final and st.frames < st.window):
            self._due += 1  # this frame completes the request's first window: its codec job comes next
        return SeqOutput(seq.seq_id, item=frame, finished=final)

    def _launch(self, seqs: list[TalkerSeq]) -> None:
        """Launch one decode step over ``seqs`` (not waited for on CUDA; :meth:`_collect` takes its codes)."""
        states = [self._state(seq) for seq in seqs]
        b = self._decode(states)
        for st in states:
            st.steps += 1
            st.length += 1
        event = None
        if self.device.type == "cuda":
            self._codes_host[:b].copy_(self.codes_out[:b], non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        self._inflight = _InFlight(seqs, states, b, event)

    def _collect(self) -> None:
        """Wait for the launched decode step and keep each of its rows' codes until the row is handed out.

        Rows released since the launch are skipped (their slot may already belong to a newcomer)."""
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return
        if inflight.event is not None:
            inflight.event.synchronize()
            host = self._codes_host
        else:
            host = self.codes_out
        slots = [st.slot for st in inflight.states]
        codes = host[: inflight.b].numpy()[slots]  # a fresh array: each frame is a view of its row
        first = codes[:, 0].tolist()
        for i, (seq, st) in enumerate(zip(inflight.seqs, inflight.states, strict=True)):
            if seq.model_state is st and self._states.get(st.slot) is st:
                st.pending = (codes, i, first[i] == self.eos and not st.ignore_eos)

    # -- PipelinedModel ---------------------------------------------------------------------------------

    def settle(self) -> None:
        """Wait for the decode step the previous call launched (stepping ahead) and keep its frames; the scheduler
        calls it before picking the next batch when ``Tuning.admit_after_collect`` is on, so requests that
        arrived while that step ran are prefilled into the next launch. Nothing to wait for without stepping ahead."""
        self._collect()

    def jobs_due(self) -> int:
        """Requests whose first audio window the last call's frames completed (their codec jobs come next)."""
        return self._due

    # -- internals --------------------------------------------------------------------------------------

    def _admit(self, seq: TalkerSeq) -> None:
        """Check the request and take its slot (its prompt is embedded with the step's other newcomers)."""
        req = self._take_slot(seq, TalkerRequest)
        slot = seq.slot
        prompt = req.prompt
        max_frames = req.max_new_tokens if req.ignore_eos else req.max_new_tokens - 1
        n = prompt.prefill_len
        if n + max_frames > self.max_len:
            raise InvalidRequestError(
                f"prompt ({n} positions) + max_new_tokens ({req.max_new_tokens}) exceeds the context "
                f"of {self.max_len} positions",
                "max_new_tokens",
            )
        samples = req.sampling.do_sample or req.subtalker_sampling.do_sample
        self._hold(seq, _SlotState(slot, n, 0, max_frames, 0, req.ignore_eos, samples))

    def _embed_all(
        self, seqs: list[TalkerSeq], outputs: dict[int, TalkerOut]
    ) -> tuple[list[TalkerSeq], list[tuple[int, torch.Tensor]]]:
        """Embed the admitted newcomers' prompts together and store their trailing text; returns the newcomers
        that remain with (slot, prefill embeddings ``[n, H]``) each. When the joint embedding fails, each prompt
        is embedded alone, so only the failing ones end."""
        if not seqs:
            return [], []
        try:
            embedded = embed_prompts(self.talker, self.cfg, [seq.payload.prompt for seq in seqs])
        except Exception as exc:
            if len(seqs) == 1:
                self._reject(seqs[0], exc, outputs)
                return [], []
            embedded = None
        kept: list[TalkerSeq] = []
        admitted: list[tuple[int, torch.Tensor]] = []
        trailing_lens: list[int] = []
        for i, seq in enumerate(seqs):
            try:
                prefill, trailing = (
                    embedded[i]
                    if embedded is not None
                    else embed_prompts(self.talker, self.cfg, [seq.payload.prompt])[0]
                )
                self._write_trailing(seq.slot, trailing)
            except Exception as exc:
                self._reject(seq, exc, outputs)
                continue
            kept.append(seq)
            admitted.append((seq.slot, prefill))
            trailing_lens.append(trailing.shape[0])
        self._write_rows(kept, trailing_lens)
        return kept, admitted

    def _write_rows(self, seqs: list[TalkerSeq], trailing_lens: list[int]) -> None:
        """The newcomers' per-slot state, for all of them at once: a value written into a CUDA tensor from Python
        is a blocking copy, and the 16 of each newcomer cost 12 ms for 56 newcomers on the H200 (run 22)."""
        if not seqs:
            return
        reqs: list[TalkerRequest] = [seq.payload for seq in seqs]
        seeds = [r.seed % (1 << 63) if r.seed is not None else secrets.randbits(63) for r in reqs]
        lengths = [r.prompt.prefill_len for r in reqs]
        no_eos = [int(r.ignore_eos) for r in reqs]
        host = self._host_long([seq.slot for seq in seqs] + lengths + seeds + trailing_lens + no_eos)
        rows, lens, seed, trail, keep_going = host.to(self.device, non_blocking=True).split(len(seqs))
        self.seen.index_fill_(0, rows, False)
        self.steps.index_fill_(0, rows, 0)
        self.lengths.index_copy_(0, rows, lens)
        self.seeds.index_copy_(0, rows, seed)
        self.trailing_len.index_copy_(0, rows, trail)
        self.no_eos.index_copy_(0, rows, keep_going.bool())
        slots = [seq.slot for seq in seqs]
        self.held_talker_params.write(slots, rows, [r.sampling for r in reqs], self._upload)
        self.held_cp_params.write(slots, rows, [r.subtalker_sampling for r in reqs], self._upload)

    def _prefill_all(
        self, seqs: list[TalkerSeq], admitted: list[tuple[int, torch.Tensor]], outputs: dict[int, TalkerOut]
    ) -> list[TalkerSeq]:
        """Prefill the admitted newcomers together (one by one when that fails); returns those that joined."""
        return self._prefill_each(seqs, admitted, self._prefill, outputs)

    def _prefill_in_budget(
        self,
        newcomers: list[TalkerSeq],
        admitted: list[tuple[int, torch.Tensor]],
        running: Seq[TalkerSeq],
        outputs: dict[int, TalkerOut],
    ) -> list[TalkerSeq]:
        """Prefill at most ``prefill_budget`` prompt positions this call: first the chunks of prompts begun in earlier
        calls (oldest first), then newcomers whose whole prompt fits what is left (together, as without a budget),
        then the first chunk of the next. Returns the rows to hand out (every newcomer and running row still held).
        """
        left = self.prefill_budget
        for seq in running:
            st = self._state(seq)
            if st.prompt is not None and left > 0:
                left -= self._prefill_chunk(seq, st, left, outputs)
        whole: list[TalkerSeq] = []
        items: list[tuple[int, torch.Tensor]] = []
        chunked: list[TalkerSeq] = []
        for seq, (slot, x) in zip(newcomers, admitted, strict=True):
            if not chunked and x.shape[0] <= left:
                whole.append(seq)
                items.append((slot, x))
                left -= x.shape[0]
                continue
            st = self._state(seq)
            st.prompt, st.prefilled = x, 0
            chunked.append(seq)
            if left > 0:
                left -= self._prefill_chunk(seq, st, left, outputs)
        rows = self._prefill_all(whole, items, outputs)
        self.prefill_log.append(self.prefill_budget - left)
        rows += [seq for seq in chunked if seq.seq_id not in outputs]
        return rows + [seq for seq in running if seq.seq_id not in outputs]

    def _prefill_chunk(self, seq: TalkerSeq, st: _SlotState, most: int, outputs: dict[int, TalkerOut]) -> int:
        """The next ``most`` positions (at most) of a chunked prompt, attending to the positions already written;
        the last chunk sets the row's hidden state, so it decodes from the next launch. Returns positions used."""
        assert st.prompt is not None
        start = st.prefilled
        x = st.prompt[start : start + most]
        n = x.shape[0]
        try:
            positions = torch.arange(start, start + n, device=self.device)[None]
            hidden = self.talker(x[None], positions, self.kv.prefill(st.slot, start))
        except Exception as exc:
            self._reject(seq, exc, outputs)
            return n
        st.prefilled += n
        if st.prefilled == st.prompt.shape[0]:
            self.hidden[st.slot] = hidden[0, -1]
            st.prompt = None
        return n

    def _prefill(self, admitted: list[tuple[int, torch.Tensor]]) -> None:
        """The talker forward of every newcomer of the step: in groups at (count, length) bucket shapes, each a
        prefill graph (or its eager twin with ``pad_eager``); prompts longer than every length bucket in one eager
        forward, right-padded to the longest."""
        if self.prefill_graphs is not None or self.pad_eager:
            admitted = self._prefill_grouped(admitted)
            if not admitted:
                return
        k = len(admitted)
        lengths = [x.shape[0] for _, x in admitted]
        t = max(lengths)
        if k == 1:
            slot, x = admitted[0]
            hidden = self.talker(x[None], torch.arange(t, device=self.device)[None], self.kv.prefill(slot))
            self.hidden[slot] = hidden[0, -1]
            return
        x = torch.nn.utils.rnn.pad_sequence([x for _, x in admitted], batch_first=True)
        slots = torch.tensor([slot for slot, _ in admitted], dtype=torch.long, device=self.device)
        lens = torch.tensor(lengths, dtype=torch.long, device=self.device)
        positions = torch.arange(t, device=self.device)[None].expand(k, -1)
        hidden = self.talker(x, positions, self._prefill_attend(slots, t, padded_causal_mask(lens, t)))
        self.hidden[slots] = hidden[torch.arange(k, device=self.device), lens - 1]

    def _prefill_grouped(self, admitted: list[tuple[int, torch.Tensor]]) -> list[tuple[int, torch.Tensor]]:
        """Prefill the newcomers whose prompts fit a length bucket, longest first, in groups as large as the
        longest prompt's bucket allows (:meth:`prefill_shapes`); returns the others (prompts past every bucket)."""
        fits = sorted(
            (item for item in admitted if pick(self.prefill_buckets, item[1].shape[0]) is not None),
            key=lambda item: -item[1].shape[0],
        )
        i = 0
        while i < len(fits):
            n = pick(self.prefill_buckets, fits[i][1].shape[0])
            assert n is not None
            most = max((b for b in self.prefill_batch_buckets if b * n <= self.prefill_positions), default=0)
            if most == 0:
                break  # no graph holds even one prompt of this length: the rest prefill eagerly
            group = fits[i : i + most]
            self._prefill_group(group, n)
            i += len(group)
        done = {id(item) for item in fits[:i]}
        return [item for item in admitted if id(item) not in done]

    def _prefill_group(self, group: list[tuple[int, torch.Tensor]], n: int) -> None:
        """One prefill graph (or its eager twin) at the (count bucket, ``n``) shape for ``group``: its prompts
        right-padded in the static buffer with zeros (finite padding: masked keys still meet their values in a
        product), the padding rows prefilling a 1-position prompt into the scratch slot. A handful of launches
        whatever the group's size."""
        k = len(group)
        b = pick(self.prefill_batch_buckets, k)
        assert b is not None and b * n <= self.prefill_positions
        lengths = [x.shape[0] for _, x in group]
        x = self._pf_x[: b * n].view(b, n, -1)
        x.zero_()
        x[:k, : max(lengths)] = torch.nn.utils.rnn.pad_sequence([p for _, p in group], batch_first=True)
        meta = self._host_long(lengths + [1] * (b - k) + [slot for slot, _ in group] + [self.scratch_slot] * (b - k))
        lens, slots = meta.to(self.device, non_blocking=True).split(b)
        self._pf_len[:b].copy_(lens)
        self._pf_slot[:b].copy_(slots)
        if self.prefill_graphs is None:
            self._padded_prefill(b, n)
            return
        key = (b, n)
        if key not in self.prefill_graphs:
            self.prefill_graphs.capture(key)  # runs it once on these newcomers' own rows
        self.prefill_graphs.replay(key)
        self.prefill_graph_calls += 1

    @torch.no_grad()
    def _padded_prefill(self, b: int, t: int) -> None:
        """Prefill of the prompts in the static buffer (viewed ``[b, t, H]``, each ``_pf_len`` long) into slots
        ``_pf_slot[:b]`` at length ``t`` (static)."""
        slots, lens = self._pf_slot[:b], self._pf_len[:b]
        positions = self._pf_positions[:, :t].expand(b, -1)
        attend = self._prefill_attend(slots, t, padded_causal_mask(lens, t))
        hidden = self.talker(self._pf_x[: b * t].view(b, t, -1), positions, attend)
        self.hidden[slots] = hidden[self._pf_rows[:b], lens - 1]

    def _write_trailing(self, slot: int, trailing: torch.Tensor) -> None:
        n = trailing.shape[0]
        if n > self.trailing.shape[1]:
            cap = max(n, 2 * self.trailing.shape[1])
            grown = self.trailing.new_zeros(self._slots, cap, self.trailing.shape[2])
            grown[:, : self.trailing.shape[1]] = self.trailing
            self.trailing = grown
            if self.graphs is not None and len(self.graphs):
                # The graphs read the old buffer: drop them; they are captured again as shapes come up.
                log.warning("trailing text of %d positions: re-capturing CUDA graphs", n)
                self.graphs.clear()
        self.trailing[slot, :n] = trailing

    def _decode(self, states: list[_SlotState]) -> int:
        """Launch one frame for each row into ``codes_out``; returns the rows computed (slots ``0..b-1``)."""
        slots = [st.slot for st in states]
        n = max(slots) + 1
        span = max(st.length for st in states) + 1
        self._mark_active(slots)  # the mask changes only when rows join, leave or pause
        noisy = self.pad_eager or any(st.samples for st in states)
        b = self._replay_or_run(n, span, (), lambda b, span: self._run_rows(b, span, noisy=noisy))
        self.decode_rows.append(b)
        return b

    def _run_rows(self, b: int, span: int, noisy: bool) -> None:
        """The decode step over slots ``0..b-1`` with attention over ``span`` positions (static tensors only).

        Rows marked in ``active`` advance; the others compute along and are discarded.
        """
        talker = self.talker
        rows, act = self._rows[:b], self.active[:b]
        h, steps, lengths, seen = self.hidden[:b], self.steps[:b], self.lengths[:b], self.seen[:b]
        tp, cp = self.talker_params.head(b), self.cp_params.head(b)

        logits = talker.head(h).float()
        logits = apply_repetition_penalty(logits, seen, tp.repetition_penalty)
        logits = mask_tokens(logits, self.suppress)
        ban_eos = (steps < MIN_NEW_TOKENS) | self.no_eos[:b]
        logits[:, self.eos] = logits[:, self.eos].masked_fill(ban_eos, float("-inf"))

        noise_t = noise_cp = None
        if noisy:
            noise = rng.exponential(rng.row_keys(self.seeds[:b], steps), self.noise_width)
            noise_t = noise[:, : self.vocab]
            noise_cp = noise[:, self.vocab :].view(b, CP_STEPS, CODEBOOK_SIZE)
        c0 = talker.sample(logits, tp, noise_t)
        seen.scatter_(1, c0[:, None], seen.gather(1, c0[:, None]) | act[:, None])

        rest = talker.code_predictor.generate(h, talker.embed_codec(c0), cp, noise_cp)
        codes = torch.cat([c0[:, None], rest], dim=1)
        x = talker.embed_frames(codes)
        has_text = steps < self.trailing_len[:b]
        idx = steps.clamp(max=self.trailing.shape[1] - 1)
        text = torch.where(has_text[:, None], self.trailing[rows, idx], self.tts_pad[None])
        x = (x + text)[:, None]
        write = torch.where(act, lengths, self.max_len)
        hidden = talker(x, lengths[:, None], self.kv.decode_rows(rows, write, lengths, span))
        self.hidden[:b] = torch.where(act[:, None], hidden[:, 0], h)
        inc = act.long()
        steps += inc
        lengths += inc
        self.codes_out[:b] = codes

    # -- synchronous driver (tests, offline use) ----------------------------------------------------------

    def generate_codes(self, requests: Seq[TalkerRequest], join_steps: Seq[int] | None = None) -> list[torch.Tensor]:
        """Run ``requests`` to completion through the scheduler on this thread; codes ``[n_frames, 16]`` per request.

        ``join_steps[i]`` delays request ``i`` until that many steps have run (newcomers joining a running
        batch); requests beyond the free slots wait for one to free up. Raises the first request's error.
        """
        results = run_offline(self, requests, join_steps, name="qwen3-tts-offline")
        for result in results:
            if result.error is not None:
                raise result.error
        return [
            torch.cat([f.codes for f in r.items]) if r.items else torch.zeros(0, NUM_CODE_GROUPS, dtype=torch.long)
            for r in results
        ]
