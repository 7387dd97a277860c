"""Streaming codec windows over slot-indexed decoder states, replayed as CUDA graphs per (batch, window) bucket.

Each streaming request holds one row of a :class:`CodecStatePool` for its lifetime. A window job gathers
the rows of its requests, decodes, and scatters the new states back; on CUDA that whole job is one graph
per (batch bucket, window frames), with static slot and code buffers (padding rows point at a scratch row),
so a 2-frame first window costs one replay instead of hundreds of eager launches. A window of another size
(an utterance's short last window, a ramp from a first window the request fixed, ICL priming) replays too, as
graph-sized pieces one after the other (:func:`window_plan`; exact, as streamed decodes are for any split); a
request's last window instead pads its codes up to one graph window and drops the padding's audio (the decoder
is causal, and the row is not decoded again before its next owner zeroes it). An eager decode of a new length
costs its first time several hundred milliseconds on CUDA (617 ms for a 19-frame tail on the H200,
``benchmarks/results/first_window_probe_1.7b.json``), which a new length of last window would pay again and
again; only windows that no plan covers (window sets without 1) still run eagerly.

:meth:`CodecWindows.issue` only launches a job: on its own ``stream`` (a side stream beside the talker's)
with its inputs copied from pinned host memory and its audio copied back into pinned host memory, so issuing
never waits for the device; the returned :class:`PendingAudio` is read once its event has completed (by a
:class:`~omni_stream.runtime.gpu_completions.Completions` thread). Jobs on one stream run in issue order, which
is what keeps a state row consistent when its request ends and the row's next owner starts while a job of the
previous owner is still running.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from omni_stream.models.qwen3_tts.codec import CodecDecoder
from omni_stream.models.qwen3_tts.codec_stream import CodecStatePool
from omni_stream.runtime.cuda_graphs import GraphSet, batch_buckets, pick
from omni_stream.runtime.load_display import ProgressFactory

DEFAULT_WINDOWS = (1, 2, 4, 8, 16, 25)


def window_plan(n: int, windows: Sequence[int], final: bool) -> list[int] | None:
    """Graph window sizes that decode ``n`` frames in order: the largest that fit, one after another; with
    ``final`` (nothing is decoded after these frames) a remainder that no window equals is padded up to the
    smallest window above it instead, so the sizes then sum to more than ``n``. None when ``windows`` cannot
    cover ``n`` (no 1-frame window and not ``final``).

    >>> window_plan(19, (1, 2, 4, 8, 16, 25), final=False), window_plan(19, (1, 2, 4, 8, 16, 25), final=True)
    ([16, 2, 1], [25])
    """
    if n < 1 or not windows:
        raise ValueError(f"need n >= 1 and some windows, got {n}, {tuple(windows)}")
    sizes = sorted(set(windows), reverse=True)
    plan: list[int] = []
    left = n
    while left:
        if final and left < sizes[0] and left not in sizes:
            plan.append(min(w for w in sizes if w > left))
            return plan
        fits = [w for w in sizes if w <= left]
        if not fits:
            return None
        plan.append(fits[0])
        left -= fits[0]
    return plan


@dataclass(slots=True, frozen=True)
class PendingAudio:
    """A launched window job: host ``pieces`` (``[k_i, samples]`` float32, in job order) valid once ``event`` has
    completed (None: already valid)."""

    pieces: tuple[torch.Tensor, ...]
    event: torch.cuda.Event | None = None

    def arrays(self) -> list[np.ndarray]:
        """One float32 array per window (copies: the host buffers go back to their allocator). Event done first."""
        out: list[np.ndarray] = []
        for piece in self.pieces:
            block = np.array(piece.numpy(), dtype=np.float32, copy=True)
            out.extend(block)
        return out

    def wait(self) -> list[np.ndarray]:
        """Block until the job is done and return its audio (the synchronous path)."""
        if self.event is not None:
            self.event.synchronize()
        return self.arrays()


class CodecWindows:
    """``capacity`` streaming codec states; :meth:`decode` is the batched worker job (see module docstring)."""

    def __init__(
        self,
        decoder: CodecDecoder,
        capacity: int,
        *,
        graphs: bool | None = None,
        windows: Sequence[int] = DEFAULT_WINDOWS,
        max_batch: int | None = None,
        stream: torch.cuda.Stream | None = None,
    ) -> None:
        """``graphs``: None = on CUDA; ``max_batch``: largest graph batch (default ``capacity``); ``stream``: the
        CUDA stream jobs run on (None: the issuing thread's current stream). Windows are split or padded to the
        graph windows (:func:`window_plan`) whenever :attr:`graphs` is set."""
        self.decoder = decoder
        self.capacity = capacity
        self.scratch = capacity  # the pool's last row: padding rows of a graph batch read and write it
        self.pool = CodecStatePool(decoder, capacity + 1)
        self.device = self.pool.buffers[next(iter(self.pool.buffers))].device
        self.q = decoder.cfg.num_quantizers
        self._free = list(range(capacity - 1, -1, -1))
        self._lock = threading.Lock()
        self.use_graphs = self.device.type == "cuda" if graphs is None else graphs
        self.windows = tuple(sorted(windows))
        self.batch_buckets = batch_buckets(max_batch or capacity)
        self._codes: dict[tuple[int, int], torch.Tensor] = {}
        self._slots: dict[int, torch.Tensor] = {}
        self._out: dict[tuple[int, int], torch.Tensor] = {}
        self.graphs = GraphSet(self._graph_step, self.device) if self.use_graphs else None
        self.stream = stream if self.device.type == "cuda" else None
        self.graph_jobs = 0  # graph replays
        self.eager_jobs = 0  # eager decodes
        self.planned_jobs = 0  # decodes of a length no graph has, replayed split or padded

    # -- slots (event loop) ------------------------------------------------------------------------------------

    def acquire(self) -> int | None:
        """A free state row, or None when all are taken (the caller then decodes with a private state)."""
        with self._lock:
            return self._free.pop() if self._free else None

    def release(self, slot: int) -> None:
        """Give the row back; its next owner's first window starts it from zero."""
        with self._lock:
            self._free.append(slot)

    @property
    def in_use(self) -> int:
        """Rows held by requests now."""
        with self._lock:
            return self.capacity - len(self._free)

    # -- graphs ------------------------------------------------------------------------------------------------

    def _static(self, b: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        codes = self._codes.get((b, n))
        if codes is None:
            codes = self._codes[(b, n)] = torch.zeros(b, self.q, n, dtype=torch.long, device=self.device)
        slots = self._slots.get(b)
        if slots is None:
            slots = self._slots[b] = torch.full((b,), self.scratch, dtype=torch.long, device=self.device)
        return codes, slots

    @torch.inference_mode()
    def _graph_step(self, b: int, n: int) -> None:
        codes, slots = self._static(b, n)
        self._out[(b, n)] = self.pool.decode(codes, slots)

    def capture_graphs(self, progress: ProgressFactory | None = None) -> float:
        """Capture every (batch bucket, window) graph, largest first; returns seconds (0 without graphs)."""
        if self.graphs is None:
            return 0.0
        keys = [(b, n) for b in self.batch_buckets for n in self.windows]
        for b, n in keys:
            self._static(b, n)
        # Warm-up and capture runs decode the scratch row only (static slots all point at it).
        return self.graphs.capture_all(keys, progress=progress, desc="capturing codec graphs")

    # -- the batched job (device worker) -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _on_stream(self) -> Iterator[None]:
        if self.stream is None:
            yield
            return
        with torch.cuda.stream(self.stream):
            yield

    def _to_device(self, host: torch.Tensor) -> torch.Tensor:
        """A host tensor on the device; on CUDA through pinned memory, so the copy never waits for the stream."""
        if self.device.type != "cuda":
            return host.to(self.device)
        return host.pin_memory().to(self.device, non_blocking=True)

    def _upload(self, dst: torch.Tensor, host: torch.Tensor) -> None:
        """Copy a host tensor into a static device buffer (through pinned memory on CUDA: never waits)."""
        dst.copy_(host.pin_memory() if self.device.type == "cuda" else host, non_blocking=True)

    def _to_host(self, audio: torch.Tensor) -> torch.Tensor:
        """Device audio into (pinned) host memory, asynchronously on CUDA: read it after the job's event."""
        if self.device.type != "cuda":
            return audio.float().cpu()
        out = torch.empty(audio.shape, dtype=torch.float32, pin_memory=True)
        out.copy_(audio, non_blocking=True)
        return out

    def decode(
        self,
        slots: Sequence[int],
        codes: Sequence[torch.Tensor],
        fresh: Sequence[bool],
        final: Sequence[bool] | None = None,
    ) -> list[np.ndarray]:
        """Decode equal-length windows ``codes[i] [n, 16]`` of the streams in ``slots``; float32 audio each.

        ``fresh[i]``: the stream's first window (its row is zeroed first); ``final[i]``: its last (nothing is
        decoded on that row until its next owner's fresh window). Blocks until done (see :meth:`issue`).
        """
        return self.issue(slots, codes, fresh, final).wait()

    @torch.inference_mode()
    def issue(
        self,
        slots: Sequence[int],
        codes: Sequence[torch.Tensor],
        fresh: Sequence[bool],
        final: Sequence[bool] | None = None,
    ) -> PendingAudio:
        """Launch :meth:`decode`'s job on :attr:`stream` without waiting for the device."""
        with self._on_stream():
            starting = [s for s, f in zip(slots, fresh, strict=True) if f]
            if starting:
                self.pool.reset(self._to_device(torch.tensor(starting, dtype=torch.long)))
            n = int(codes[0].shape[0])
            plan = None
            if self.graphs is not None:
                plan = window_plan(n, self.windows, final=final is not None and all(final))
            # More windows than the largest graph batch: several replays beat one eager decode by far
            # (measured at 64 windows: ~165 ms eager, which stalled every talker step behind it).
            step = self.batch_buckets[-1] if plan is not None else len(slots)
            pieces = tuple(
                self._launch(slots[i : i + step], codes[i : i + step], plan) for i in range(0, len(slots), step)
            )
            event = None
            if self.device.type == "cuda":
                event = torch.cuda.Event()
                event.record()
        return PendingAudio(pieces, event)

    def _launch(self, slots: Sequence[int], codes: Sequence[torch.Tensor], plan: list[int] | None) -> torch.Tensor:
        """Decode at most the largest bucket's windows, by ``plan``'s graph replays (else eagerly); host audio."""
        return self._to_host(self._decode_on_device(slots, torch.stack([c.T for c in codes]), plan))

    def _decode_on_device(self, slots: Sequence[int], host: torch.Tensor, plan: list[int] | None) -> torch.Tensor:
        """Audio ``[k, n * samples per frame]`` of host codes ``[k, 16, n]`` on the device (a graph's output
        buffer when one replay does it: copy it off before that graph replays again)."""
        k, n = len(slots), int(host.shape[2])
        if plan is None:
            self.eager_jobs += 1
            return self.pool.decode(self._to_device(host), self._to_device(torch.tensor(slots, dtype=torch.long)))
        if plan != [n]:
            self.planned_jobs += 1
        outs: list[torch.Tensor] = []
        start = 0
        for w in plan:
            piece = host[:, :, start : start + w]
            if piece.shape[2] < w:  # the padded end of a last window: repeat its last frame's codes
                piece = torch.cat([piece, piece[:, :, -1:].expand(k, piece.shape[1], w - piece.shape[2])], dim=2)
            out = self._replay(slots, piece)
            outs.append(out if len(plan) == 1 else out.clone())  # a later piece may replay the same graph
            start += w
        audio = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        if start > n:  # drop the padding's audio
            audio = audio[:, : audio.shape[1] * n // start]
        return audio

    def _replay(self, slots: Sequence[int], host: torch.Tensor) -> torch.Tensor:
        """One graph replay over host codes ``[k, 16, n]`` (``n`` one of :attr:`windows`); its output buffer."""
        assert self.graphs is not None
        k, n = len(slots), int(host.shape[2])
        b = pick(self.batch_buckets, k)
        assert b is not None, f"{k} windows in one replay: more than the largest graph batch"
        static_codes, static_slots = self._static(b, n)
        if (b, n) not in self.graphs:
            static_slots.fill_(self.scratch)
            self.graphs.capture((b, n))
        index = torch.full((b,), self.scratch, dtype=torch.long)
        index[:k] = torch.tensor(slots, dtype=torch.long)
        self._upload(static_codes[:k], host)
        self._upload(static_slots, index)
        self.graphs.replay((b, n))
        self.graph_jobs += 1
        return self._out[(b, n)][:k]

    @torch.inference_mode()
    def prime(self, slot: int, context: torch.Tensor) -> None:
        """Feed context frames ``[T, 16]`` (ICL reference codes) into a fresh row without returning audio."""
        with self._on_stream():
            index = self._to_device(torch.tensor([slot], dtype=torch.long))
            self.pool.reset(index)
            plan = window_plan(int(context.shape[0]), self.windows, final=False) if self.graphs is not None else None
            self._decode_on_device([slot], context.T.unsqueeze(0).contiguous(), plan)
