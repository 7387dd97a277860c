"""``WhisperRunner``: a :class:`~omni_stream.batch_model.BatchModel` that transcribes many utterances in one batch.

It runs the modules of a ``transformers`` ``WhisperForConditionalGeneration`` (the encoder as it is; the decoder
layer by layer over slot-indexed static caches). One step:

1. encodes the newcomers' log-mel features together and stores each one's cross-attention keys and values in
   its slot (``[layers, slots, heads, 1500, head_dim]``; the encoder never runs again for that request). The
   encoder runs at a bucketed batch size (powers of two up to ``max_batch_size``; the padding rows encode silence
   into a spare slot), from static buffers, so on CUDA each bucket is a CUDA graph captured at load
   (:meth:`WhisperRunner.capture_graphs`): a burst of a size seen for the first time costs what it costs the
   tenth time;
2. advances every running row by one decoder call: rows with several pending inputs (a prompt) in one padded
   call, rows with one (the last token) in another; self-attention keys and values go to the row's slot at its
   own positions (``[layers, slots, heads, positions + 1, head_dim]``, the extra position takes padding);
3. picks each row's next token greedily on the device (the checkpoint's suppressed tokens and every timestamp
   token masked, the first one's begin suppression too; language detection takes the best language token),
   with one device-to-host copy per step.

A multilingual request with no language spends its first step on detection (from ``<|startoftranscript|>``
alone, as ``generate()`` does), then decodes its full prompt. Each output is one generated token's
:class:`~omni_stream.chunks.TextDelta` (text held back inside a UTF-8 character, the leading space dropped); the
last is ``final`` with ``finish_reason`` ``stop`` (end of text) or ``length`` (``max_new_tokens`` or the decoder's
positions). ``release`` drops a row's state; its slot's cache rows are overwritten by the next owner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
from torch.nn import functional as F

from omni_stream.batch_model import Batch, SeqOutput, Sequence
from omni_stream.chunks import TextDelta
from omni_stream.models.whisper.detokenizer import Detokenizer
from omni_stream.models.whisper.prompt import WhisperPrompt, WhisperTokens
from omni_stream.runtime.cuda_graphs import GraphSet, batch_buckets, pick
from omni_stream.runtime.step_record import StepRecord


@dataclass(slots=True, frozen=True)
class WhisperInput:
    """One utterance: log-mel ``features`` ``[n_mels, frames]`` (float32, CPU), its prompt, a token budget."""

    features: torch.Tensor
    prompt: WhisperPrompt
    max_new_tokens: int


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


class WhisperRunner(StepRecord):
    """Batched greedy Whisper (see module docstring).

    ``record=True`` logs ``("step", prefill_ids, decode_ids)``, ``("encode", newcomers, batch, "graph"|"eager")``,
    ``("admit", seq_id, request_id)``, ``("language",
    seq_id, token)``, ``("token", seq_id, token)`` and ``("release", seq_id)`` events to ``log`` and counts
    releases (tests).
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
    ):
        """``graphs``: replay CUDA graphs of the encoder per batch bucket (None: on CUDA devices)."""
        cfg = model.config
        self.encoder = model.model.encoder
        self.decoder = model.model.decoder
        self.proj_out = model.proj_out
        self.tokens = tokens
        super().__init__(record=record)
        self._max_batch_size = max_batch_size
        self._decode_text = tokenizer.backend_tokenizer.decode
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
        # The encoder's static inputs (graphs replay over them) and its batch buckets
        self.encode_buckets = batch_buckets(max_batch_size)
        frames = 2 * cfg.max_source_positions  # log-mel frames of the 30 s window (the convolutions halve them)
        self._enc_in = torch.zeros(max_batch_size, cfg.num_mel_bins, frames, **kw)
        self._enc_slots = torch.full((max_batch_size,), self.spare, dtype=torch.long, device=self.device)
        use_graphs = self.device.type == "cuda" if graphs is None else graphs
        self.encode_graphs = GraphSet(self._encode, self.device) if use_graphs else None

    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size

    # --- BatchModel -----------------------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self, batch: Batch) -> list[SeqOutput]:
        self.record_step(batch)
        if batch.prefill:
            self._admit(batch.prefill)
        seqs = [s for s in (*batch.prefill, *batch.decode) if isinstance(s.model_state, _Row)]
        # Prompts (several inputs) and single tokens go in separate calls: padding a lone token to a prompt's
        # length would cost the whole batch that many positions.
        # Within a call, rows go in slot order: consecutive slots read the caches as views, not copies.
        seqs.sort(key=lambda s: s.slot)
        groups = [
            [s for s in seqs if len(s.model_state.pending) > 1],
            [s for s in seqs if len(s.model_state.pending) == 1],
        ]
        order = [s for g in groups for s in g]
        if not order:
            return []
        logits = torch.cat([self._decode(g) for g in groups if g])
        first = self._upload([s.model_state.generated == 0 for s in order], torch.bool)
        masked = logits.masked_fill(self.suppress, -math.inf)
        masked = masked.masked_fill(first[:, None] & self.begin_suppress, -math.inf)
        text_next = masked.argmax(-1)
        lang_next = self.lang_ids[logits[:, self.lang_ids].argmax(-1)]
        picks = torch.stack((text_next, lang_next), 1).cpu().tolist()  # the step's one device-to-host copy
        return [self._advance(seq, text, lang) for seq, (text, lang) in zip(order, picks, strict=True)]

    # --- admission ------------------------------------------------------------------------------------------

    def capture_graphs(self) -> float:
        """Capture the encoder for every batch bucket, largest first; returns seconds (0 without graphs)."""
        if self.encode_graphs is None:
            return 0.0
        self._enc_slots.fill_(self.spare)  # a capture writes the spare slot only
        missing = [(b,) for b in self.encode_buckets if (b,) not in self.encode_graphs]
        with torch.inference_mode():
            return self.encode_graphs.capture_all(missing, desc="capturing encoder graphs")

    def _admit(self, seqs: tuple[Sequence, ...]) -> None:
        """Encode the newcomers together at their batch bucket; their cross-attention keys and values go to their
        slots (the padding rows' to the spare one)."""
        n = len(seqs)
        b = pick(self.encode_buckets, n)
        assert b is not None  # the scheduler admits at most max_batch_size
        features = torch.stack([s.payload.features for s in seqs])
        if self.device.type == "cuda":
            features = features.pin_memory()
        self._enc_in[:n].copy_(features, non_blocking=True)
        self._enc_in[n:b].zero_()
        self._enc_slots[:n].copy_(self._upload([s.slot for s in seqs]))
        self._enc_slots[n:b].fill_(self.spare)
        replayed = self.encode_graphs is not None and self.encode_graphs.replay((b,))
        if not replayed:
            self._encode(b)
        if self.record:
            self.log.append(("encode", n, b, "graph" if replayed else "eager"))
        for seq in seqs:
            payload: WhisperInput = seq.payload
            prompt = payload.prompt
            phase, pending = (
                (_Phase.DETECT, [self.tokens.sot]) if prompt.detect else (_Phase.DECODE, [*prompt.tokens()])
            )
            max_new = max(1, min(payload.max_new_tokens, self.positions - prompt.length))
            seq.model_state = _Row(phase, pending, 0, 0, max_new, Detokenizer(self._decode_text, self.tokens.eot))
            self.live.add(seq.seq_id)
            if self.record:
                self.log.append(("admit", seq.seq_id, seq.request_id))

    def _encode(self, b: int) -> None:
        """The encoder over the first ``b`` static inputs, keys and values into their slots (static tensors only)."""
        encoded = self.encoder(self._enc_in[:b]).last_hidden_state  # [b, 1500, d]
        slots = self._enc_slots[:b]
        for i, layer in enumerate(self.decoder.layers):
            attn = layer.encoder_attn
            self.cross_k[i].index_copy_(0, slots, self._heads(attn.k_proj(encoded), b))
            self.cross_v[i].index_copy_(0, slots, self._heads(attn.v_proj(encoded), b))

    def _upload(self, values: list[Any], dtype: torch.dtype = torch.long) -> torch.Tensor:
        """A small host list on the device; on CUDA through pinned memory, so the copy does not wait for the
        kernels already queued."""
        host = torch.tensor(values, dtype=dtype)
        if self.device.type != "cuda":
            return host
        return host.pin_memory().to(self.device, non_blocking=True)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return x.view(n, -1, self.heads, self.head_dim).transpose(1, 2)

    # --- one decoder call over rows -------------------------------------------------------------------------

    def _decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """Feed each row its pending inputs at its own positions; the logits after each row's last input."""
        rows: list[_Row] = [s.model_state for s in seqs]
        n, width = len(rows), max(len(r.pending) for r in rows)
        dev = self.device
        tokens = self._upload([r.pending + [self.tokens.eot] * (width - len(r.pending)) for r in rows])
        start = self._upload([r.position for r in rows])
        lengths = self._upload([len(r.pending) for r in rows])
        offsets = torch.arange(width, device=dev)
        positions = start[:, None] + offsets  # [n, width]
        valid = offsets[None] < lengths[:, None]
        writes = torch.where(valid, positions, self.positions)  # padding lands on the spare position
        keys = max(r.position + len(r.pending) for r in rows)
        mask = (torch.arange(keys, device=dev)[None, None] <= positions[:, :, None])[:, None]  # [n, 1, width, keys]
        slots = [s.slot for s in seqs]
        slot_idx = self._upload(slots)
        contiguous = slots == list(range(slots[0], slots[0] + n))

        def rows_of(buf: torch.Tensor) -> torch.Tensor:
            return buf[slots[0] : slots[0] + n] if contiguous else buf.index_select(0, slot_idx)

        dec = self.decoder
        h = (
            dec.embed_tokens(tokens) * self.embed_scale
            + dec.embed_positions.weight[positions.clamp(max=self.positions - 1)]
        )
        for i, layer in enumerate(dec.layers):
            attn = layer.self_attn
            x = layer.self_attn_layer_norm(h)
            q = self._heads(attn.q_proj(x) * attn.scaling, n)
            k = attn.k_proj(x).view(n, width, self.heads, self.head_dim)
            v = attn.v_proj(x).view(n, width, self.heads, self.head_dim)
            self.self_k[i][slot_idx[:, None], :, writes] = k
            self.self_v[i][slot_idx[:, None], :, writes] = v
            k_all, v_all = rows_of(self.self_k[i])[:, :, :keys], rows_of(self.self_v[i])[:, :, :keys]
            out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, scale=1.0)
            h = h + attn.out_proj(out.transpose(1, 2).reshape(n, width, -1))
            cross = layer.encoder_attn
            x = layer.encoder_attn_layer_norm(h)
            q = self._heads(cross.q_proj(x) * cross.scaling, n)
            out = F.scaled_dot_product_attention(q, rows_of(self.cross_k[i]), rows_of(self.cross_v[i]), scale=1.0)
            h = h + cross.out_proj(out.transpose(1, 2).reshape(n, width, -1))
            x = layer.final_layer_norm(h)
            h = h + layer.fc2(layer.activation_fn(layer.fc1(x)))
        h = dec.layer_norm(h[torch.arange(n, device=dev), lengths - 1])
        for row in rows:
            row.position += len(row.pending)
        return self.proj_out(h).float()

    # --- after the pick -------------------------------------------------------------------------------------

    def _advance(self, seq: Sequence, token: int, language: int) -> SeqOutput:
        row: _Row = seq.model_state
        if self.record:
            self.log.append(("language" if row.phase is _Phase.DETECT else "token", seq.seq_id,
                             language if row.phase is _Phase.DETECT else token))  # fmt: skip
        if row.phase is _Phase.DETECT:
            payload: WhisperInput = seq.payload
            row.phase, row.pending, row.position = _Phase.DECODE, [*payload.prompt.tokens(language)], 0
            return SeqOutput(seq.seq_id)  # no text this step
        row.generated += 1
        if token == self.tokens.eot:
            return SeqOutput(seq.seq_id, TextDelta(row.detok.flush(), row.generated - 1, True, "stop"), True)
        text = row.detok.push(token)
        if row.generated >= row.max_new:
            return SeqOutput(seq.seq_id, TextDelta(text + row.detok.flush(), row.generated - 1, True, "length"), True)
        row.pending = [token]
        return SeqOutput(seq.seq_id, TextDelta(text, row.generated - 1))
