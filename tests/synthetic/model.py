"""The synthetic talker (a BatchModel) and codec: deterministic codes in, a known tone out.

Frame ``k`` of a request with tone ``t`` has codes ``[k % size, t, (k * (j - 1) + t) % size for j >= 2]``;
the codec reads the tone from code 1 and the frame index from the window's ``start_frame``.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from omni_stream.batch_model import Batch, SeqOutput
from omni_stream.chunks import CodecFrames
from omni_stream.runtime.step_record import StepRecord
from omni_stream.speech.stages import CodecWindow
from synthetic.config import Faults, SyntheticConfig, tone_samples


class SyntheticFault(RuntimeError):
    """Raised on purpose by the synthetic family's fault markers and hooks."""


_MARKER = re.compile(r"\[\[fail:(step|seq|stage)(?:@(\d+))?\]\]")


def parse_faults(text: str) -> tuple[str, Faults]:
    """Strip ``[[fail:step@K]]``, ``[[fail:seq@K]]``, ``[[fail:stage@K]]`` markers (K defaults to 0) from text."""
    found: dict[str, int] = {}
    for kind, at in _MARKER.findall(text):
        found[f"{kind}_at"] = int(at) if at else 0
    return _MARKER.sub("", text), Faults(**found)


@dataclass(slots=True, frozen=True)
class TalkerInput:
    """What one sequence generates: ``n_frames`` frames of tone ``tone``."""

    n_frames: int
    tone: int
    faults: Faults = field(default_factory=Faults)


class SyntheticTalker(StepRecord):
    """A BatchModel whose step emits one CodecFrames per sequence, after ``step_cost_ms`` of worker-thread sleep.

    Like a model over a slot-indexed static cache, a step computes rows ``0 .. max(slot)`` (idle rows along,
    their results dropped); ``rows`` holds that count for recent steps, so a test can see what a step costs.

    Test hooks: ``before_step(batch)`` runs at the start of every step (raise from it to fail the batch);
    with ``record=True`` the model logs ``("step", prefill_ids, decode_ids)`` and ``("release", seq_id)``
    events to ``log`` and counts releases in ``released``. ``live`` holds admitted, unreleased seq ids.
    """

    def __init__(self, config: SyntheticConfig, max_batch_size: int = 32, *, record: bool = False) -> None:
        self.config = config
        self._max_batch_size = max_batch_size
        super().__init__(record=record)
        self.step_threads: set[int] = set()
        self.steps = 0
        self.rows: deque[int] = deque(maxlen=4096)  # rows computed by each recent step
        self.before_step: Callable[[Batch], None] | None = None
        self.step_cost_s = config.step_cost_ms / 1000.0

    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size

    def step(self, batch: Batch) -> list[SeqOutput]:
        self.step_threads.add(threading.get_ident())
        self.steps += 1
        self.record_step(batch)
        for seq in batch.prefill:
            seq.model_state = 0  # next frame index
            self.live.add(seq.seq_id)
        if self.step_cost_s > 0:
            time.sleep(self.step_cost_s)  # releases the GIL, as a device kernel would
        if self.before_step is not None:
            self.before_step(batch)
        seqs = (*batch.prefill, *batch.decode)
        for seq in seqs:
            if seq.payload.faults.step_at == seq.model_state:
                raise SyntheticFault(f"synthetic step failure at frame {seq.model_state} (sequence {seq.seq_id})")
        # Slot-indexed rows 0..max(slot), as a static-cache model computes them; idle rows stay zero.
        n_rows = max(s.slot for s in seqs) + 1 if seqs else 0
        self.rows.append(n_rows)
        slots = np.fromiter((s.slot for s in seqs), dtype=np.int64, count=len(seqs))
        frames = np.zeros(n_rows, np.int64)
        tones = np.zeros(n_rows, np.int64)
        frames[slots] = [s.model_state for s in seqs]
        tones[slots] = [s.payload.tone for s in seqs]
        codes = self._codes(frames, tones)[torch.from_numpy(slots)]
        outputs = []
        for i, seq in enumerate(seqs):
            frame = seq.model_state
            if seq.payload.faults.seq_at == frame:
                outputs.append(SeqOutput(seq.seq_id, error=SyntheticFault(f"synthetic sequence failure at {frame}")))
                continue
            final = frame + 1 >= seq.payload.n_frames
            item = CodecFrames(codes=codes[i : i + 1], start_frame=frame, final=final)
            seq.model_state = frame + 1
            outputs.append(SeqOutput(seq.seq_id, item=item, finished=final))
        return outputs

    def _codes(self, frames: np.ndarray, tones: np.ndarray) -> torch.Tensor:
        size, n_cb = self.config.codebook_size, self.config.n_codebooks
        mult = np.arange(n_cb, dtype=np.int64) - 1
        codes = (frames[:, None] * mult[None, :] + tones[:, None]) % size
        codes[:, 0] = frames % size
        codes[:, 1] = tones
        return torch.from_numpy(codes)


class SyntheticCodec:
    """Decodes windows of codes of many requests in one call (run it through ``submit_batched``)."""

    def __init__(self, config: SyntheticConfig) -> None:
        self.config = config
        self.cost_s = config.codec_cost_ms / 1000.0
        self.batch_sizes: Counter[int] = Counter()  # calls per batch size

    def decode(self, windows: list[CodecWindow]) -> list[np.ndarray]:
        self.batch_sizes[len(windows)] += 1
        if self.cost_s > 0:
            time.sleep(self.cost_s)
        tones = torch.cat([w.pieces[0][:1, 1] for w in windows]).tolist()  # one host copy per batch
        return [
            tone_samples(self.config, tone, w.start_frame, w.n_frames) for w, tone in zip(windows, tones, strict=True)
        ]
