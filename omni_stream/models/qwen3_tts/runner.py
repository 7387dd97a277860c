"""Qwen3TTSRunner: the talker + code predictor as a :class:`~omni_stream.batch.BatchModel`.

One step: newcomers are prefilled into their slots of the static KV cache (each at its own length, while
other slots keep their rows), then every row in the step decodes together: sample code 0 from the last
talker hidden state (per-row parameters), run the 15-step code predictor, form the next talker input (sum
of the 16 codebook embeddings + the row's next trailing text embedding, ``tts_pad`` after) and advance the
talker by one position. One batched device-to-host copy per step carries all rows' codes; each row gets
one :class:`CodecFrames` (16 codes) per step.

Length rule (reference parity): ``max_new_tokens = N`` allows N code-0 samples, and the last one never gets
residual codes, so at most N - 1 frames; an EOS code 0 ends the sequence and its frame is dropped.
``ignore_eos`` (benchmarks) bans EOS and yields exactly N frames.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from omni_stream.batch import Batch, SeqOutput, Sequence
from omni_stream.chunks import CodecFrames
from omni_stream.errors import InvalidRequestError
from omni_stream.models.qwen3_tts.config import CODEBOOK_SIZE, CONTROL_ID_SPAN, NUM_CODE_GROUPS
from omni_stream.models.qwen3_tts.prompt import TalkerRequest, embed_prompt, embed_tts_pad
from omni_stream.models.qwen3_tts.talker import Qwen3TTSLM
from omni_stream.requests import RequestState
from omni_stream.runtime.kv_cache import KVShape, SlotKVCache
from omni_stream.runtime.sampling import (
    SamplingTensors,
    apply_repetition_penalty,
    exponential_noise,
    mask_tokens,
    sample,
)

MIN_NEW_TOKENS = 2  # the reference bans EOS for the first two code-0 samples
CP_STEPS = NUM_CODE_GROUPS - 1


@dataclass(slots=True)
class _SlotState:
    """Host-side mirror of one running sequence (worker thread only)."""

    slot: int
    length: int  # talker positions written to the KV cache
    steps: int  # code-0 samples drawn so far
    max_frames: int
    frames: int
    ignore_eos: bool
    samples: bool  # talker or sub-talker samples (needs random draws each step)
    generator: torch.Generator | None


class Qwen3TTSRunner:
    """Batched talker decoding over a slot-indexed static KV cache (see module docstring)."""

    def __init__(self, lm: Qwen3TTSLM, *, max_batch_size: int = 8, max_len: int = 4096) -> None:
        """``max_len``: talker positions per slot (prompt + frames; 12.5 frames per second of audio)."""
        self.lm = lm.eval()
        self.cfg = cfg = lm.config
        self.talker = talker = lm.talker
        w = talker.codec_head.weight
        self.device, self.dtype = w.device, w.dtype
        d = cfg.talker.decoder
        self.max_len = min(max_len, d.max_position_embeddings)
        self._slots = max_batch_size
        self.kv = SlotKVCache(
            KVShape(d.num_hidden_layers, max_batch_size, d.num_key_value_heads, self.max_len, d.head_dim),
            dtype=self.dtype,
            device=self.device,
        )
        s, dev = max_batch_size, self.device
        self.vocab = d.vocab_size
        self.eos = cfg.talker.codec_eos_token_id
        self.hidden = torch.zeros(s, d.hidden_size, dtype=self.dtype, device=dev)
        self.seen = torch.zeros(s, self.vocab, dtype=torch.bool, device=dev)
        self.steps = torch.zeros(s, dtype=torch.long, device=dev)
        self.no_eos = torch.zeros(s, dtype=torch.bool, device=dev)
        self.talker_params = SamplingTensors.empty(s, dev)
        self.cp_params = SamplingTensors.empty(s, dev)
        self.trailing = torch.zeros(s, 16, d.hidden_size, dtype=self.dtype, device=dev)
        self.trailing_len = torch.zeros(s, dtype=torch.long, device=dev)
        self.suppress = torch.zeros(self.vocab, dtype=torch.bool, device=dev)
        self.suppress[self.vocab - CONTROL_ID_SPAN :] = True
        self.suppress[self.eos] = False
        self.tts_pad = embed_tts_pad(talker, cfg)
        self._states: dict[int, _SlotState] = {}

    # -- BatchModel -------------------------------------------------------------------------------------

    @property
    def max_batch_size(self) -> int:
        return self._slots

    @property
    def num_active(self) -> int:
        """Slots currently holding a sequence."""
        return len(self._states)

    @torch.no_grad()
    def step(self, batch: Batch) -> list[SeqOutput]:
        """Prefill ``batch.prefill``, then advance every row by one frame."""
        outputs: dict[int, SeqOutput] = {}
        rows: list[Sequence] = []
        for seq in batch.prefill:
            try:
                self._prefill(seq)
            except InvalidRequestError as exc:
                self.release(seq)
                outputs[seq.seq_id] = SeqOutput(seq.seq_id, finished=True, error=exc)
                continue
            rows.append(seq)
        rows.extend(batch.decode)
        active: list[Sequence] = []
        for seq in rows:
            st = self._state(seq)
            if st.frames >= st.max_frames:
                outputs[seq.seq_id] = SeqOutput(seq.seq_id, finished=True)
            else:
                active.append(seq)
        if active:
            states = [self._state(seq) for seq in active]
            codes = self._decode(states)
            first = codes[:, 0].tolist()
            for i, (seq, st) in enumerate(zip(active, states, strict=True)):
                st.steps += 1
                st.length += 1
                if first[i] == self.eos and not st.ignore_eos:
                    outputs[seq.seq_id] = SeqOutput(seq.seq_id, finished=True)
                    continue
                final = st.frames + 1 >= st.max_frames
                frame = CodecFrames(codes[i : i + 1].clone(), start_frame=st.frames, final=final)
                st.frames += 1
                outputs[seq.seq_id] = SeqOutput(seq.seq_id, item=frame, finished=final)
        return [outputs[seq.seq_id] for seq in (*batch.prefill, *batch.decode)]

    def release(self, seq: Sequence) -> None:
        """Free the sequence's slot state; the static rows are simply reused by the slot's next owner."""
        st = seq.model_state
        if isinstance(st, _SlotState) and self._states.get(st.slot) is st:
            del self._states[st.slot]
        seq.model_state = None

    # -- internals --------------------------------------------------------------------------------------

    def _state(self, seq: Sequence) -> _SlotState:
        st = seq.model_state
        if not isinstance(st, _SlotState):
            raise RuntimeError(f"sequence {seq.seq_id} was not prefilled by this runner")
        return st

    def _prefill(self, seq: Sequence) -> None:
        req = seq.payload
        if not isinstance(req, TalkerRequest):
            raise TypeError(f"payload must be a TalkerRequest, got {type(req).__name__}")
        slot = seq.slot
        if not 0 <= slot < self._slots:
            raise ValueError(f"slot {slot} is outside 0..{self._slots - 1}")
        if slot in self._states:
            raise RuntimeError(f"slot {slot} is still held by another sequence")
        prompt = req.prompt
        max_frames = req.max_new_tokens if req.ignore_eos else req.max_new_tokens - 1
        n = prompt.prefill_len
        if n + max_frames > self.max_len:
            raise InvalidRequestError(
                f"prompt ({n} positions) + max_new_tokens ({req.max_new_tokens}) exceeds the context "
                f"of {self.max_len} positions",
                "max_new_tokens",
            )
        prefill, trailing = embed_prompt(self.talker, self.cfg, prompt)
        positions = torch.arange(n, device=self.device)[None]
        hidden = self.talker(prefill[None], positions, self.kv.prefill(slot))
        self.hidden[slot] = hidden[0, -1]
        self._write_trailing(slot, trailing)
        self.seen[slot] = False
        self.steps[slot] = 0
        self.no_eos[slot] = req.ignore_eos
        self.talker_params.write(slot, req.sampling)
        self.cp_params.write(slot, req.subtalker_sampling)
        samples = req.sampling.do_sample or req.subtalker_sampling.do_sample
        generator = None
        if samples:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(req.seed if req.seed is not None else secrets.randbits(63))
        st = _SlotState(slot, n, 0, max_frames, 0, req.ignore_eos, samples, generator)
        self._states[slot] = st
        seq.model_state = st

    def _write_trailing(self, slot: int, trailing: torch.Tensor) -> None:
        n = trailing.shape[0]
        if n > self.trailing.shape[1]:
            cap = max(n, 2 * self.trailing.shape[1])
            grown = self.trailing.new_zeros(self._slots, cap, self.trailing.shape[2])
            grown[:, : self.trailing.shape[1]] = self.trailing
            self.trailing = grown
        self.trailing[slot, :n] = trailing
        self.trailing_len[slot] = n

    def _decode(self, states: list[_SlotState]) -> torch.Tensor:
        """One frame for each row; returns the rows' codes ``[B, 16]`` on the CPU (one copy)."""
        talker = self.talker
        slots = torch.tensor([st.slot for st in states], dtype=torch.long, device=self.device)
        lengths = torch.tensor([st.length for st in states], dtype=torch.long, device=self.device)
        bound = max(st.length for st in states) + 1
        h = self.hidden[slots]
        steps = self.steps[slots]
        tp = self.talker_params.index(slots)
        cp = self.cp_params.index(slots)

        logits = talker.codec_head(h).float()
        logits = apply_repetition_penalty(logits, self.seen[slots], tp.repetition_penalty)
        logits = mask_tokens(logits, self.suppress)
        ban_eos = (steps < MIN_NEW_TOKENS) | self.no_eos[slots]
        logits[:, self.eos] = logits[:, self.eos].masked_fill(ban_eos, float("-inf"))

        noise_t = noise_cp = None
        if any(st.samples for st in states):
            noise = exponential_noise(
                [st.generator for st in states], self.vocab + CP_STEPS * CODEBOOK_SIZE, self.device
            )
            noise_t = noise[:, : self.vocab]
            noise_cp = noise[:, self.vocab :].view(len(states), CP_STEPS, CODEBOOK_SIZE)
        c0 = sample(logits, tp, noise_t)
        self.seen[slots, c0] = True

        rest = talker.code_predictor.generate(h, talker.embed_codec(c0), cp, noise_cp)
        codes = torch.cat([c0[:, None], rest], dim=1)
        x = talker.embed_frames(codes)
        has_text = steps < self.trailing_len[slots]
        idx = steps.clamp(max=self.trailing.shape[1] - 1)
        text = torch.where(has_text[:, None], self.trailing[slots, idx], self.tts_pad[None])
        x = (x + text)[:, None]
        hidden = talker(x, lengths[:, None], self.kv.decode(slots, lengths, bound))
        self.hidden[slots] = hidden[:, 0]
        self.steps[slots] = steps + 1
        return codes.cpu()

    # -- synchronous driver (tests, offline use) ----------------------------------------------------------

    def generate_codes(self, requests: Seq[TalkerRequest], join_steps: Seq[int] | None = None) -> list[torch.Tensor]:
        """Run ``requests`` to completion without a scheduler; codes ``[n_frames, 16]`` int64 per request.

        ``join_steps[i]`` delays request ``i`` until that many steps have run (newcomers joining a running
        batch); requests beyond the free slots wait for one to free up.
        """
        join = list(join_steps) if join_steps is not None else [0] * len(requests)
        seqs = [Sequence(seq_id=i, payload=r) for i, r in enumerate(requests)]
        frames: list[list[torch.Tensor]] = [[] for _ in requests]
        errors: dict[int, BaseException] = {}
        waiting = list(range(len(requests)))
        running: list[Sequence] = []
        free = list(range(self._slots))
        step = 0
        try:
            while waiting or running:
                newcomers = []
                for i in [i for i in waiting if join[i] <= step]:
                    if not free:
                        break
                    seq = seqs[i]
                    seq.slot, seq.state = free.pop(0), RequestState.RUNNING
                    newcomers.append(seq)
                    waiting.remove(i)
                batch = Batch(prefill=tuple(newcomers), decode=tuple(running))
                running = [*running, *newcomers]
                if batch:
                    for out in self.step(batch):
                        seq = seqs[out.seq_id]
                        if out.item is not None:
                            frames[out.seq_id].append(out.item.codes)
                        if out.error is not None:
                            errors[out.seq_id] = out.error
                        if out.finished:
                            self.release(seq)
                            seq.state = RequestState.FINISHED
                            running.remove(seq)
                            free.append(seq.slot)
                            free.sort()
                step += 1
        finally:
            for seq in running:
                self.release(seq)
        if errors:
            raise next(iter(errors.values()))
        return [torch.cat(f) if f else torch.zeros(0, NUM_CODE_GROUPS, dtype=torch.long) for f in frames]
