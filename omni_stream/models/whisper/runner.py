"""``WhisperRunner``: a :class:`~omni_stream.batch_model.BatchModel` that transcribes many utterances in one batch.

It runs the modules of a ``transformers`` ``WhisperForConditionalGeneration`` (the encoder as it is; the decoder
layer by layer over slot-indexed static caches). One step:

1. encodes the newcomers' log-mel features together and stores each one's cross-attention keys and values in
   its slot (``[layers, slots + 1, heads, 1500, head_dim]``; the encoder never runs again for that request). The
   encoder runs at a bucketed batch size (powers of two and three times them, up to ``max_batch_size``: a padding
   row costs a real one's 30 s window, so a bucket pads by a third at most; the padding rows encode silence into
   the spare slot past the real ones), from static buffers; with shorter encoder windows set (``windows``:
   :func:`~omni_stream.models.whisper.shapes.encoder_windows`), each window's newcomers are one pass over that
   many frames, and the decoder's cross-attention masks each row's frames past its window;
2. advances every running row by one decoder call over the slots ``0..rows-1`` (a row per slot, so both caches
   are read as views, never gathered; idle slots below the highest live one compute along and feed nothing):
   each row feeds its pending inputs (a prompt, or the last token) at its own positions, keys and values going
   to its slot of the self-attention cache (``[layers, slots, heads, positions + 1, head_dim]``; inputs past a
   row's own, and idle rows, write the extra position, which no query reads);
3. picks each row's next token greedily on the device (the checkpoint's suppressed tokens and every timestamp
   token masked, the first one's begin suppression too; language detection takes the best language token),
   with one device-to-host copy per step.

The decoder call reads its inputs from one static buffer and writes its picks to another, and runs at a bucketed
shape (rows, inputs a row, self-attention span: :class:`~omni_stream.models.whisper.shapes.DecodeShapes`). So on
CUDA the encoder of each batch bucket and the decoder call of each shape are CUDA graphs captured at load
(:meth:`WhisperRunner.capture_graphs`) and replayed: a burst, or a batch, of a size seen for the first time costs
what it costs the tenth time. Elsewhere the same functions run eagerly at the same shapes (``pad_shapes=False``:
the decoder at each step's exact shape, for comparisons).

A multilingual request with no language spends its first step on detection (from ``<|startoftranscript|>``
alone, as ``generate()`` does), then decodes its full prompt. Each output is one generated token's
:class:`~omni_stream.chunks.TextDelta` (text held back inside a UTF-8 character, the leading space dropped); the
last is ``final`` with ``finish_reason`` ``stop`` (end of text) or ``length`` (``max_new_tokens`` or the decoder's
positions). ``release`` drops a row's state; its slot's cache rows are overwritten by the next owner.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
from torch.nn import functional as F

from omni_stream.batch_model import Batch, SeqOutput, Sequence
from omni_stream.chunks import TextDelta
from omni_stream.models.whisper.detokenizer import Detokenizer
from omni_stream.models.whisper.prompt import WhisperPrompt, WhisperTokens
from omni_stream.models.whisper.shapes import DecodeShapes
from omni_stream.runtime.cuda_graphs import GraphSet, batch_buckets, pick
from omni_stream.runtime.step_record import StepRecord

META = 3  # values before a row's inputs in the decoder call's input buffer: start, count, first-token flag


@dataclass(slots=True, frozen=True)
class WhisperInput:
    """One utterance: log-mel ``features`` ``[n_mels, 2 * window]`` (float32, CPU), its prompt, a token budget, and
    its encoder ``window`` in frames (None: the model's whole window)."""

    features: torch.Tensor
    prompt: WhisperPrompt
    max_new_tokens: int
    window: int | None = None


class _Phase(Enum):
    DETECT = "detect"  # feeding <|startoftranscript|> alone; its logits pick the language
    DECODE = "decode"  # feeding the prompt, then each generated token


@dataclass(slots=True)
class _Row:
    """A running sequence's decoder state (worker thread only)."""

    phase: _Phase
    pending: list[int]  # inputs of the next decoder call
    position: int  # tokens in the row's self-attention cache
    generated: int
    max_new: int
    detok: Detokenizer


WhisperSeq = Sequence[WhisperInput]


class WhisperRunner(StepRecord[WhisperInput]):
    """Batched greedy Whisper (see module docstring).

    ``record=True`` logs ``("step", prefill_ids, decode_ids)``, ``("encode", newcomers, batch, window,
    "graph"|"eager")``,
    ``("decode", rows, b, width, span, "graph"|"eager")`` (the decoder call's live rows and its shape),
    ``("admit", seq_id, request_id)``, ``("language", seq_id, token)``, ``("token", seq_id, token)`` and
    ``("release", seq_id)`` events to ``log`` and counts releases (tests).
    """

    def __init__(
        self,
        model: Any,
        tokens: WhisperTokens,
        tokenizer: Any,
        max_batch_size: int,
        *,
        record: bool = False,
        graphs: bool | None = None,
        windows: tuple[int, ...] | None = None,
    ) -> None:
        """``graphs``: replay CUDA graphs of the encoder per batch bucket and window and of the decoder call per shape
        (None: on CUDA devices). ``windows``: the encoder windows in frames, ascending, the last the model's whole
        window (None: that one alone)."""
        cfg = model.config
        self.encoder = model.model.encoder
        self.decoder = model.model.decoder
        self.proj_out = model.proj_out
        self.tokens = tokens
        super().__init__(record=record)
        self._max_batch_size = max_batch_size
        self._decode_text = tokenizer.backend_tokenizer.decode
        self.encoder_calls = 0  # encoder passes and the utterances they encoded (benchmarks read them)
        self.utterances_encoded = 0
        self.encoder_buckets: Counter[int] = Counter()  # passes by the batch bucket they ran at
        self.encoder_windows: Counter[int] = Counter()  # passes by the window (frames) they ran at
        # Benchmarks set ``time_encoder``: on CUDA each pass is bracketed by two timing events, and a step adds the
        # device time of the passes whose events have completed (no wait) to ``encoder_device_ms`` by bucket, so a
        # benchmark tells the encoder's own time from the step's wall time (other models' work in between, waits).
        self.time_encoder = False
        self.encoder_device_ms: defaultdict[int, float] = defaultdict(float)
        self.encoder_timed: Counter[int] = Counter()  # the passes whose device time is in encoder_device_ms
        self._timed: list[tuple[int, torch.cuda.Event, torch.cuda.Event]] = []
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.heads = cfg.decoder_attention_heads
        self.head_dim = cfg.d_model // self.heads
        self.positions = min(cfg.max_target_positions, tokens.max_length)
        self.embed_scale = math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0
        layers = cfg.decoder_layers
        kw = dict(device=self.device, dtype=self.dtype)
        shape_self = (layers, max_batch_size, self.heads, self.positions + 1, self.head_dim)
        # One spare slot past the real ones: a bucket's padding rows write their keys and values there.
        self.spare = max_batch_size
        shape_cross = (layers, max_batch_size + 1, self.heads, cfg.max_source_positions, self.head_dim)
        self.self_k, self.self_v = torch.zeros(shape_self, **kw), torch.zeros(shape_self, **kw)
        self.cross_k, self.cross_v = torch.zeros(shape_cross, **kw), torch.zeros(shape_cross, **kw)
        vocab = cfg.vocab_size
        self.suppress = torch.zeros(vocab, dtype=torch.bool, device=self.device)
        self.suppress[list(tokens.suppress)] = True
        # Decoding without timestamps never picks one (transformers' generate() would read a pair of them as a
        # segment boundary and decode again from there; a real model rarely emits them after <|notimestamps|>).
        self.suppress[tokens.no_timestamps + 1 :] = True
        self.begin_suppress = torch.zeros(vocab, dtype=torch.bool, device=self.device)
        self.begin_suppress[list(tokens.begin_suppress)] = True
        self.lang_ids = torch.tensor(sorted(tokens.languages.values()) or [tokens.eot], device=self.device)
        # The encoder's static inputs (graphs replay over them), its batch buckets and windows
        self.encode_buckets = batch_buckets(max_batch_size, fine=True)
        full = cfg.max_source_positions
        self.windows = windows or (full,)
        if self.windows[-1] != full or list(self.windows) != sorted(set(self.windows)) or self.windows[0] < 1:
            raise ValueError(f"encoder windows must ascend to the model's {full} frames, got {self.windows}")
        frames = 2 * full  # log-mel frames of the 30 s window (the convolutions halve them)
        self._enc_in = torch.zeros(max_batch_size, cfg.num_mel_bins, frames, **kw)
        self._enc_slots = torch.full((max_batch_size,), self.spare, dtype=torch.long, device=self.device)
        # Shorter windows: which of its slot's 1500 cross-attention frames a row reads ([slots + 1, 1, 1, 1500]; set
        # by each pass for its rows). None with the whole window alone: every row reads every frame, unmasked.
        self._frame_ids = torch.arange(full, device=self.device)
        self._cross_keep = (
            torch.ones(max_batch_size + 1, 1, 1, full, dtype=torch.bool, device=self.device)
            if len(self.windows) > 1
            else None
        )
        use_graphs = self.device.type == "cuda" if graphs is None else graphs
        self.encode_graphs = GraphSet(self._encode, self.device) if use_graphs else None
        # The decoder call's static inputs: a call of b rows and width w reads the first b * (META + w) values as
        # [b, META + w] (start position, inputs fed, first-token flag, then the inputs), so each shape's graph has
        # its own fixed view and one contiguous copy fills it. Its picks ([slots, 2]: text, language) come back.
        self.shapes = DecodeShapes.build(max_batch_size, self.positions, tokens.max_prompt_length)
        width = max(tokens.max_prompt_length, self.shapes.widths[-1])
        self._dec_in = torch.zeros(max_batch_size * (META + width), dtype=torch.long, device=self.device)
        cuda = self.device.type == "cuda"
        self._dec_host = torch.zeros_like(self._dec_in, device="cpu").pin_memory() if cuda else self._dec_in
        self._picks = torch.zeros(max_batch_size, 2, dtype=torch.long, device=self.device)
        self._offsets = torch.arange(width, device=self.device)
        self._key_positions = torch.arange(self.positions, device=self.device)
        self._rows = torch.arange(max_batch_size, device=self.device)
        self.pad_shapes = True
        self.decode_graphs = GraphSet(self._run, self.device) if use_graphs else None

    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size

    # --- BatchModel -----------------------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self, batch: Batch[WhisperInput]) -> list[SeqOutput[TextDelta]]:
        self.record_step(batch)
        if self._timed:
            self._add_encoder_times()
        if batch.prefill:
            self._admit(batch.prefill)
        live = [(s, s.model_state) for s in (*batch.prefill, *batch.decode) if isinstance(s.model_state, _Row)]
        if not live:
            return []
        # One call a step: a newcomer's prompt widens that step's call for every row (once per request), which
        # costs less than a second call over the same slots would.
        rows = [row for _, row in live]
        exact = (
            max(s.slot for s, _ in live) + 1,
            max(len(r.pending) for r in rows),
            max(r.position + len(r.pending) for r in rows),
        )
        shape = self.shapes.pick(*exact) if self.pad_shapes else None
        b, w, span = shape or exact
        self._fill(live, b, w)
        replayed = shape is not None and self.decode_graphs is not None and self.decode_graphs.replay(shape)
        if not replayed:
            self._run(b, w, span)
        if self.record:
            self.log.append(("decode", len(live), b, w, span, "graph" if replayed else "eager"))
        picks = self._picks[:b].tolist()  # the step's one device-to-host copy
        for row in rows:
            row.position += len(row.pending)
        return [self._advance(seq, row, *picks[seq.slot]) for seq, row in live]

    # --- CUDA graphs ----------------------------------------------------------------------------------------

    def capture_graphs(self) -> float:
        """Capture the encoder for every batch bucket and the decoder call for every shape
        (:meth:`DecodeShapes.keys`), largest first; returns seconds (0 without graphs). Needs no running
        sequence: a capture writes only the spare slot (encoder) and each row's extra position (decoder)."""
        seconds = 0.0
        with torch.inference_mode():
            if self.encode_graphs is not None:
                self._enc_slots.fill_(self.spare)
                passes = [(b, w) for b in self.encode_buckets for w in self.windows]
                missing = [k for k in passes if k not in self.encode_graphs]
                seconds += self.encode_graphs.capture_all(missing, desc="capturing encoder graphs")
            if self.decode_graphs is not None:
                self._dec_in.zero_()  # every row idle: it feeds nothing
                keys = [k for k in self.shapes.keys() if k not in self.decode_graphs]
                seconds += self.decode_graphs.capture_all(keys, desc="capturing decoder graphs")
        return seconds

    # --- admission ------------------------------------------------------------------------------------------

    def _admit(self, seqs: tuple[WhisperSeq, ...]) -> None:
        """Encode the newcomers, a pass per window (together at their batch bucket); their cross-attention keys and
        values go to their slots (the padding rows' to the spare one)."""
        by_window: defaultdict[int, list[WhisperSeq]] = defaultdict(list)
        for seq in seqs:
            by_window[self.window_of(seq.payload)].append(seq)
        for window, group in sorted(by_window.items()):
            self._encode_group(group, window)
        for seq in seqs:
            payload = seq.payload
            prompt = payload.prompt
            phase, pending = (
                (_Phase.DETECT, [self.tokens.sot]) if prompt.detect else (_Phase.DECODE, [*prompt.tokens()])
            )
            max_new = max(1, min(payload.max_new_tokens, self.positions - prompt.length))
            seq.model_state = _Row(phase, pending, 0, 0, max_new, Detokenizer(self._decode_text, self.tokens.eot))
            self.live.add(seq.seq_id)
            if self.record:
                self.log.append(("admit", seq.seq_id, seq.request_id))

    def window_of(self, payload: WhisperInput) -> int:
        """The window an utterance is encoded in (its own, or the whole one); a ValueError for one not set."""
        window = self.windows[-1] if payload.window is None else payload.window
        if window not in self.windows:
            raise ValueError(f"encoder window {window} is not one of {self.windows}")
        return window

    def _encode_group(self, seqs: list[WhisperSeq], window: int) -> None:
        """One encoder pass over ``seqs`` (all of one window) at their batch bucket."""
        n = len(seqs)
        b = pick(self.encode_buckets, n)
        assert b is not None  # the scheduler admits at most max_batch_size
        frames = 2 * window
        # Each payload's features are its window's already (a slice only for one made longer): no call a newcomer,
        # as every torch call from this thread may wait for the interpreter under load; on CUDA stacked straight
        # into pinned memory (one copy of up to ~1.5 MB an utterance, not two)
        parts = [f if f.shape[-1] == frames else f[:, :frames] for f in (s.payload.features for s in seqs)]
        if self.device.type == "cuda":
            features = torch.empty((n, *parts[0].shape), dtype=parts[0].dtype, pin_memory=True)
            torch.stack(parts, out=features)
        else:
            features = torch.stack(parts)
        self._enc_in[:n, :, : 2 * window].copy_(features, non_blocking=True)
        self._enc_in[n:b].zero_()
        self._enc_slots[:n].copy_(self._upload([s.slot for s in seqs]))
        self._enc_slots[n:b].fill_(self.spare)
        timed = self.time_encoder and self.device.type == "cuda"
        if timed:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        replayed = self.encode_graphs is not None and self.encode_graphs.replay((b, window))
        if not replayed:
            self._encode(b, window)
        if timed:
            end.record()
            self._timed.append((b, start, end))
        self.encoder_calls += 1
        self.utterances_encoded += n
        self.encoder_buckets[b] += 1
        self.encoder_windows[window] += 1
        if self.record:
            self.log.append(("encode", n, b, window, "graph" if replayed else "eager"))

    def _add_encoder_times(self) -> None:
        """Add the device time of each timed pass whose end event has completed (a query, never a wait)."""
        pending = []
        for b, start, end in self._timed:
            if end.query():
                self.encoder_device_ms[b] += start.elapsed_time(end)
                self.encoder_timed[b] += 1
            else:
                pending.append((b, start, end))
        self._timed = pending

    def _encode(self, b: int, window: int) -> None:
        """The encoder over the first ``b`` static inputs' first ``window`` frames, keys and values into the first
        ``window`` frames of their slots (static tensors only)."""
        encoded = self._encoder_states(self._enc_in[:b, :, : 2 * window])  # [b, window, d]
        slots = self._enc_slots[:b]
        for i, layer in enumerate(self.decoder.layers):
            attn = layer.encoder_attn
            k, v = self._heads(attn.k_proj(encoded), b), self._heads(attn.v_proj(encoded), b)
            self.cross_k[i, :, :, :window].index_copy_(0, slots, k)
            self.cross_v[i, :, :, :window].index_copy_(0, slots, v)
        if self._cross_keep is not None:
            keep = (self._frame_ids < window).expand(b, 1, 1, -1)
            self._cross_keep.index_copy_(0, slots, keep)

    def _encoder_states(self, features: torch.Tensor) -> torch.Tensor:
        """``transformers``' Whisper encoder over ``[b, n_mels, 2 * frames]``: its forward, whose input must be the
        whole window's 3000 log-mel frames, with the positions of the first ``frames`` (the whole window: the same
        operations as its forward, the same values)."""
        enc = self.encoder
        h = F.gelu(enc.conv2(F.gelu(enc.conv1(features)))).permute(0, 2, 1)
        h = h + enc.embed_positions.weight[: h.shape[1]]
        for layer in enc.layers:
            out = layer(h, None)
            h = out[0] if isinstance(out, tuple) else out  # a tuple in older transformers releases
        return enc.layer_norm(h)

    def _upload(self, values: list[int], dtype: torch.dtype = torch.long) -> torch.Tensor:
        """A small host list on the device; on CUDA through pinned memory, so the copy does not wait for the
        kernels already queued."""
        host = torch.tensor(values, dtype=dtype)
        if self.device.type != "cuda":
            return host
        return host.pin_memory().to(self.device, non_blocking=True)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return x.view(n, -1, self.heads, self.head_dim).transpose(1, 2)

    # --- one decoder call over the slots --------------------------------------------------------------------

    def _inputs(self, buffer: torch.Tensor, b: int, w: int) -> torch.Tensor:
        return buffer[: b * (META + w)].view(b, META + w)

    def _fill(self, live: list[tuple[WhisperSeq, _Row]], b: int, w: int) -> None:
        """The call's inputs for rows ``0..b-1`` (a row per slot; slots without a sequence feed nothing), one
        host-to-device copy from pinned memory."""
        host = self._inputs(self._dec_host, b, w)
        table = host.numpy()
        table[:, :META] = 0
        table[:, META:] = self.tokens.eot  # any id: inputs past a row's own are never read
        for seq, row in live:
            n = len(row.pending)
            table[seq.slot, :META] = (row.position, n, row.generated == 0)
            table[seq.slot, META : META + n] = row.pending
        if self._dec_host is not self._dec_in:  # CUDA: the pinned host buffer's copy (on the CPU they are one)
            self._inputs(self._dec_in, b, w).copy_(host, non_blocking=True)

    def _run(self, b: int, w: int, span: int) -> None:
        """One decoder call over slots ``0..b-1``, ``w`` inputs a row, self-attention over ``span`` positions, from
        the static inputs to the static picks (static tensors only, no host sync: what a CUDA graph captures).

        Row ``i`` feeds its ``count`` inputs at positions ``start..start+count-1``; its keys and values go there in
        slot ``i`` (the rest of the row's inputs write position ``positions``, which no query reads), each query
        attends the positions up to its own, and the logits after the row's last input pick its next text token
        and its best language token."""
        x = self._inputs(self._dec_in, b, w)
        start, count, first = x[:, 0], x[:, 1], x[:, 2].bool()
        offsets = self._offsets[:w]
        positions = start[:, None] + offsets  # [b, w]
        writes = torch.where(offsets[None] < count[:, None], positions, self.positions)
        mask = (self._key_positions[:span] <= positions[:, :, None])[:, None]  # [b, 1, w, span]
        rows = self._rows[:b]
        keep = None if self._cross_keep is None else self._cross_keep[:b]  # each row's window of cross frames
        dec = self.decoder
        h = (
            dec.embed_tokens(x[:, META:]) * self.embed_scale
            + dec.embed_positions.weight[positions.clamp(max=self.positions - 1)]
        )
        for i, layer in enumerate(dec.layers):
            attn = layer.self_attn
            y = layer.self_attn_layer_norm(h)
            q = self._heads(attn.q_proj(y) * attn.scaling, b)
            self.self_k[i][rows[:, None], :, writes] = attn.k_proj(y).view(b, w, self.heads, self.head_dim)
            self.self_v[i][rows[:, None], :, writes] = attn.v_proj(y).view(b, w, self.heads, self.head_dim)
            keys, values = self.self_k[i][:b, :, :span], self.self_v[i][:b, :, :span]
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=1.0)
            h = h + attn.out_proj(out.transpose(1, 2).reshape(b, w, -1))
            cross = layer.encoder_attn
            y = layer.encoder_attn_layer_norm(h)
            q = self._heads(cross.q_proj(y) * cross.scaling, b)
            out = F.scaled_dot_product_attention(q, self.cross_k[i][:b], self.cross_v[i][:b], attn_mask=keep, scale=1.0)
            h = h + cross.out_proj(out.transpose(1, 2).reshape(b, w, -1))
            y = layer.final_layer_norm(h)
            h = h + layer.fc2(layer.activation_fn(layer.fc1(y)))
        logits = self.proj_out(dec.layer_norm(h[rows, (count - 1).clamp(min=0)])).float()
        masked = logits.masked_fill(self.suppress, -math.inf)
        masked = masked.masked_fill(first[:, None] & self.begin_suppress, -math.inf)
        self._picks[:b, 0] = masked.argmax(-1)
        self._picks[:b, 1] = self.lang_ids[logits[:, self.lang_ids].argmax(-1)]

    # --- after the pick -------------------------------------------------------------------------------------

    def _advance(self, seq: WhisperSeq, row: _Row, token: int, language: int) -> SeqOutput[TextDelta]:
        if self.record:
            self.log.append(("language" if row.phase is _Phase.DETECT else "token", seq.seq_id,
                             language if row.phase is _Phase.DETECT else token))  # fmt: skip
        if row.phase is _Phase.DETECT:
            row.phase, row.pending, row.position = _Phase.DECODE, [*seq.payload.prompt.tokens(language)], 0
            return SeqOutput(seq.seq_id)  # no text this step
        row.generated += 1
        if token == self.tokens.eot:
            return SeqOutput(seq.seq_id, TextDelta(row.detok.flush(), row.generated - 1, True, "stop"), True)
        text = row.detok.push(token)
        if row.generated >= row.max_new:
            return SeqOutput(seq.seq_id, TextDelta(text + row.detok.flush(), row.generated - 1, True, "length"), True)
        row.pending = [token]
        return SeqOutput(seq.seq_id, TextDelta(text, row.generated - 1))
