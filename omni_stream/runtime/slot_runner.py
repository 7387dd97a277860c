"""SlotKVRunner: the skeleton every batched decoder over a slot-indexed static KV cache shares.

A runner is a :class:`~omni_stream.batch_model.BatchModel`: the scheduler hands each sequence the lowest free
slot, the runner keeps per-slot state on the device (the KV cache's rows, lengths, steps, seeds, an ``active``
row mask) and a host-side mirror per sequence (its slot state, on ``seq.model_state``). What a family's runner
shares with every other lives here, once:

- the decoder kernels chosen for the device (:func:`select_kernels`), the cache and the per-slot tensors;
- taking a newcomer's slot (:meth:`SlotKVRunner._take_slot`: the payload's type, the slot in range and free),
  releasing it, ending one newcomer with its error without touching the running rows (:meth:`_reject`);
- prefilling the newcomers of a step together, and one by one when that fails, so only the failing ones end
  (:meth:`_prefill_each`); causal attention over right-padded prompts that writes each prompt's K/V rows into its
  slot (:meth:`_prefill_attend`);
- the decode step over slots ``0..b-1`` (``b`` covers the highest slot of the step, so the cost follows the live
  rows): the row mask uploaded only when the step's rows change (:meth:`_mark_active`), the step replayed from a
  CUDA graph per (batch bucket, attention-span bucket, mode) or run eagerly at the exact shape
  (:meth:`_replay_or_run`), idle rows computing along and writing a scratch column.

A subclass brings its model: the payload it admits, how a prompt becomes the first hidden state, and what one
decode step computes (``_run_rows``, captured by :attr:`graphs`) and hands out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import torch

from omni_stream.batch_model import SeqOutput, Sequence
from omni_stream.errors import InvalidRequestError
from omni_stream.runtime import rng
from omni_stream.runtime.cuda_graphs import GraphSet, batch_buckets, idle_rows, length_buckets, pick
from omni_stream.runtime.decoder_kernels import DecodeKernels, default_kernels
from omni_stream.runtime.kv_cache import Attend, KVShape, SlotKVCache, attention
from omni_stream.runtime.load_display import ProgressFactory

log = logging.getLogger(__name__)


class SlotState(Protocol):
    """What the skeleton reads of a runner's per-sequence state: its slot and the positions written."""

    slot: int
    length: int


P = TypeVar("P")  # the payload the runner admits
O = TypeVar("O")  # the item one step makes for one sequence
S = TypeVar("S", bound=SlotState)
T = TypeVar("T")
# (q, k, v, mask) -> attention output; mask None: the function's own causal rule
AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def select_kernels(device: torch.device, fused: DecodeKernels | bool | None) -> DecodeKernels | None:
    """The decoder layers' kernels: ``fused`` None or True: the Triton kernels on CUDA where Triton is installed
    (True: an error elsewhere), False: the modules, or a :class:`DecodeKernels` set as given."""
    kernels = default_kernels(device) if fused is None or fused is True else fused or None
    if fused is True and kernels is None:
        raise ValueError("fused kernels need a CUDA device with Triton installed")
    return kernels


def padded_causal_mask(lengths: torch.Tensor, t: int) -> torch.Tensor:
    """``[B, 1, T, T]``: causal, and no key past each prompt's own length (right-padded prompts from position 0)."""
    pos = torch.arange(t, device=lengths.device)
    causal = pos[None, :] <= pos[:, None]
    return (causal[None] & (pos[None, :] < lengths[:, None])[:, None, :])[:, None]


class SlotKVRunner(Generic[P, O, S]):
    """The shared skeleton (see the module docstring) of a runner admitting ``P`` payloads and making ``O`` items
    (a ``BatchModel[P, O]``); subclasses set :attr:`state_type` (their per-sequence state ``S``) and call
    :meth:`_init_slots` from ``__init__``."""

    state_type: type[S]
    kv: SlotKVCache
    graphs: GraphSet | None

    def _init_slots(
        self,
        *,
        device: torch.device,
        dtype: torch.dtype,
        max_batch_size: int,
        max_len: int,
        kv: KVShape,
        graphs: bool | None,
        graph_step: Callable[..., None],
        smallest_span: int,
        noise_width: int,
    ) -> None:
        """The cache (``kv``: its slots may exceed ``max_batch_size`` by scratch slots, its positions must cover
        ``max_len`` plus the scratch column idle rows write), the per-slot tensors, the graph set of ``graph_step``
        (``graphs`` None: on CUDA devices) and the counter-based noise of ``noise_width`` values a row and step."""
        self.device, self.dtype = device, dtype
        self.max_len = max_len
        self._slots = s = max_batch_size
        if kv.num_slots < s or kv.max_len < max_len + 1:
            raise ValueError(f"a cache of {kv.num_slots} slots x {kv.max_len} positions cannot hold {s} x {max_len}")
        # One column past max_len: idle rows of a decode step write their K/V there; no read ever reaches it.
        self.kv = SlotKVCache(kv, dtype=dtype, device=device)
        self.steps = torch.zeros(s, dtype=torch.long, device=device)
        self.lengths = torch.zeros(s, dtype=torch.long, device=device)
        self.seeds = torch.zeros(s, dtype=torch.long, device=device)
        self.active = torch.zeros(s, dtype=torch.bool, device=device)
        self._rows = torch.arange(s, device=device)
        self._active_host = torch.zeros(s, dtype=torch.bool, pin_memory=device.type == "cuda")
        self._active_slots: tuple[int, ...] | None = None  # rows the device mask holds (None: unknown)
        rng.prepare(noise_width, device)
        self._states: dict[int, S] = {}
        self.use_graphs = device.type == "cuda" if graphs is None else graphs
        if self.use_graphs and device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.batch_buckets = batch_buckets(s)
        self.length_buckets = length_buckets(max_len, smallest_span)
        self.pad_eager = False  # eager steps at bucket shapes too (graph-vs-eager comparisons)
        self.graphs = GraphSet(graph_step, device) if self.use_graphs else None
        self.graph_steps = 0
        self.eager_steps = 0

    # -- BatchModel -------------------------------------------------------------------------------------

    @property
    def max_batch_size(self) -> int:
        return self._slots

    @property
    def num_active(self) -> int:
        """Slots currently holding a sequence."""
        return len(self._states)

    def release(self, seq: Sequence[P]) -> None:
        """Free the sequence's slot state; the static rows are simply reused by the slot's next owner."""
        st = seq.model_state
        if isinstance(st, self.state_type) and self._states.get(st.slot) is st:
            del self._states[st.slot]
        seq.model_state = None

    # -- slots ------------------------------------------------------------------------------------------

    def _state(self, seq: Sequence[P]) -> S:
        st = seq.model_state
        if not isinstance(st, self.state_type):
            raise RuntimeError(f"sequence {seq.seq_id} was not prefilled by this runner")
        return st

    def _take_slot(self, seq: Sequence[P], payload_type: type[P]) -> P:
        """The newcomer's payload, checked to be a ``payload_type``, and its slot, checked to be in range and
        free (the caller then sets :meth:`_hold`)."""
        req = seq.payload
        if not isinstance(req, payload_type):
            raise TypeError(f"payload must be a {payload_type.__name__}, got {type(req).__name__}")
        slot = seq.slot
        if not 0 <= slot < self._slots:
            raise ValueError(f"slot {slot} is outside 0..{self._slots - 1}")
        if slot in self._states:
            raise RuntimeError(f"slot {slot} is still held by another sequence")
        return req

    def _hold(self, seq: Sequence[P], st: S) -> None:
        """``seq`` holds ``st.slot`` with its host-side state ``st``."""
        self._states[st.slot] = st
        seq.model_state = st

    def _reject(self, seq: Sequence[P], exc: Exception, outputs: dict[int, SeqOutput[O]]) -> None:
        """End a newcomer with ``exc`` and free its slot state; other rows are untouched."""
        if not isinstance(exc, InvalidRequestError):
            log.error("prefill of sequence %s failed", seq.seq_id, exc_info=exc)
        self.release(seq)
        outputs[seq.seq_id] = SeqOutput(seq.seq_id, finished=True, error=exc)

    def _host_long(self, values: list[int]) -> torch.Tensor:
        """A host int64 tensor, pinned on CUDA (so a non-blocking copy from it never waits for the stream)."""
        return self._host_array(np.asarray(values, dtype=np.int64))

    def _host_array(self, values: np.ndarray) -> torch.Tensor:
        """A host tensor over an int64 array (one copy into pinned memory on CUDA, for a non-blocking upload)."""
        t = torch.from_numpy(values)
        return t.pin_memory() if self.device.type == "cuda" else t

    def _upload(self, values: list[int]) -> torch.Tensor:
        """``values`` as an int64 tensor on the device (a non-blocking copy from pinned memory on CUDA)."""
        return self._host_long(values).to(self.device, non_blocking=True)

    # -- prefill ----------------------------------------------------------------------------------------

    def _prefill_each(
        self,
        seqs: list[Sequence[P]],
        items: list[T],
        prefill: Callable[[list[T]], None],
        outputs: dict[int, SeqOutput[O]],
    ) -> list[Sequence[P]]:
        """``prefill(items)`` for the newcomers ``seqs`` together; returns those that joined the step. A failing
        joint prefill falls back to one per newcomer, so only the failing ones end (the K/V it wrote lies in the
        newcomers' own slots, overwritten by each one's own prefill)."""
        if not items:
            return []
        try:
            prefill(items)
            return seqs
        except Exception as exc:
            if len(items) == 1:
                self._reject(seqs[0], exc, outputs)
                return []
        joined = []
        for seq, item in zip(seqs, items, strict=True):
            try:
                prefill([item])
            except Exception as exc:
                self._reject(seq, exc, outputs)
                continue
            joined.append(seq)
        return joined

    def _prefill_attend(
        self,
        slots: torch.Tensor,
        t: int,
        mask: torch.Tensor | None,
        attend_fn: AttentionFn | None = None,
    ) -> Attend:
        """Attention over prompts starting at position 0 whose K/V rows go to positions ``0..t-1`` of each prompt's
        slot (padding positions land past a prompt's length: masked now, overwritten by its decode steps).
        ``mask``: :func:`padded_causal_mask` or None (``attend_fn``'s own causal rule); ``attend_fn``:
        ``(q, k, v, mask) -> out`` (default: the reference-rounding :func:`~omni_stream.runtime.kv_cache.attention`)."""
        kc, vc = self.kv.k, self.kv.v
        fn = attend_fn or attention

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            kc[layer][slots, :, :t] = k
            vc[layer][slots, :, :t] = v
            return fn(q, k, v, mask)

        return attend

    # -- decode -----------------------------------------------------------------------------------------

    def _mark_active(self, slots: list[int]) -> None:
        """The device's row mask for a step over ``slots``, uploaded only when the rows change (join, leave,
        pause): one host-to-device copy from pinned memory."""
        rows = tuple(slots)
        if rows == self._active_slots:
            return
        host = self._active_host
        host.zero_()
        host.numpy()[slots] = True
        self.active.copy_(host, non_blocking=True)
        self._active_slots = rows

    def _bucket(self, n: int, span: int) -> tuple[int, int] | None:
        b, s = pick(self.batch_buckets, n), pick(self.length_buckets, span)
        return None if b is None or s is None else (b, s)

    def _replay_or_run(self, n: int, span: int, mode: tuple[Any, ...], run: Callable[[int, int], None]) -> int:
        """One decode step over the rows below ``n`` attending to ``span`` positions: the graph of its bucket and
        ``mode`` (captured on first use, every row idle meanwhile), else ``run(b, span)`` eagerly (at the bucket's
        shape with :attr:`pad_eager`). Returns the rows computed (``b``)."""
        bucket = self._bucket(n, span)
        if bucket is not None and self.graphs is not None:
            key = (*bucket, *mode)
            if key not in self.graphs:
                with idle_rows(self.active):
                    self.graphs.capture(key)
            self.graphs.replay(key)
            self.graph_steps += 1
            return bucket[0]
        b, span = bucket if self.pad_eager and bucket is not None else (n, span)
        run(b, span)
        self.eager_steps += 1
        return b

    def _capture_decode(self, modes: tuple[tuple[Any, ...], ...], progress: ProgressFactory | None) -> float:
        """Capture the decode step for every (batch, span) bucket and mode, largest first; seconds (0 without
        graphs). Needs no running sequence: every row is idle while it is captured."""
        if self.graphs is None:
            return 0.0
        keys = [(b, n, *m) for b in self.batch_buckets for n in self.length_buckets for m in modes]
        missing = [k for k in keys if k not in self.graphs]
        with idle_rows(self.active):
            return self.graphs.capture_all(missing, progress=progress, desc="capturing decode graphs")
