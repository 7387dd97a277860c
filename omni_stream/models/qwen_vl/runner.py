"""QwenVLRunner: the causal LM's batched runner with images in prompts and multimodal rotary positions.

Everything the causal LM's runner does (slot KV cache, sampling, grammars, penalties, log-probabilities, stop
strings, the decode step as one CUDA graph per bucket) holds unchanged; this runner changes the prefill and the
positions:

- a step's newcomers are prefilled together, text-only and image prompts alike: the images of every newcomer go
  through the vision tower in one call, and their embeddings replace the embeddings of the ``<|image_pad|>``
  tokens (each image's tokens in order); positions are the prompt's three rows (t, h, w) from
  :func:`~omni_stream.models.qwen_vl.vision.rope_positions` (text-only prompts: 0..n-1 on each axis);
- each slot keeps its rotary delta (``max position + 1 - prompt length``; 0 without images) in
  :attr:`rope_delta`, which the model adds to the decode step's positions (a static tensor, so graphs keep it).

A lone newcomer is not padded to a prefill bucket (no prefill graphs: the vision tower's shapes follow the
images anyway).

Frame sessions (``max_sessions`` of them, each up to ``session_rows`` cache rows, in a cache of their own): a
session's frames go through the vision tower and are prefilled into its rows as they arrive (:meth:`session_append`:
only the new frame's tokens run through the layers), so a query whose prompt starts with the session's rows
(:class:`~.frames.SessionView`) copies those rows into its slot and prefills only its own tokens (the questions of
several sessions admitted in one step together, in one forward). A session holds at most ``max_frames`` frames and
``session_rows`` rows: past either, the oldest frames leave (down to three quarters of ``max_frames``, so a rebuild
comes once every quarter window of frames, not with every frame) and the remaining frames' rows are rebuilt from
their stored features in one forward (the vision tower does not run again). Every path gives the tokens of the whole
prompt prefilled at once. Frames of several sessions that wait for the worker together (:meth:`session_append_many`)
go through the vision tower in one call; each session's rows are then written in turn.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from omni_stream.errors import ConfigError, InvalidRequestError
from omni_stream.models.causal_lm.detokenize import Decode
from omni_stream.models.causal_lm.runner import CausalLMRunner, LMOut, LMRequest, LMSeq, prefill_attention
from omni_stream.models.qwen_vl.frames import EncodedFrame, SessionView
from omni_stream.models.qwen_vl.model import QwenVLForGeneration
from omni_stream.models.qwen_vl.vision import PreparedImage, image_prompt_tokens, rope_positions
from omni_stream.runtime.kv_cache import KVShape, SlotKVCache
from omni_stream.runtime.slot_runner import padded_causal_mask


@dataclass(slots=True, frozen=True)
class VLRequest(LMRequest):
    """An :class:`LMRequest` whose prompt may show images: ``images`` in prompt order (patches for the vision tower,
    or a session's frames already encoded), ``positions`` ``[3, n]`` (None: a text prompt, positions 0..n-1), the
    decode positions' ``rope_delta``, and ``cached``: the session view whose rows the prompt starts with."""

    images: tuple[PreparedImage | EncodedFrame, ...] = ()
    positions: np.ndarray | None = None
    rope_delta: int = 0
    cached: SessionView | None = None


@dataclass(slots=True, frozen=True)
class FrameIn:
    """One frame for a session: the image (:func:`~.frames.frozen`), its key (:func:`~.frames.image_key`) and its
    patches."""

    sid: int
    image: np.ndarray
    key: bytes
    prepared: PreparedImage


@dataclass(slots=True)
class _Session:
    """A frame session's state (worker thread only): its prefix ids, frames and the view last published (its rows
    hold the view's ids unless ``stale``)."""

    sid: int
    prefix: tuple[int, ...]
    max_frames: int
    frames: list[EncodedFrame]
    view: SessionView
    stale: bool = False  # a rebuild failed part way: its rows are not the view's until a write succeeds


class QwenVLRunner(CausalLMRunner):
    """Batched decoding of Qwen2.5-VL over a slot-indexed KV cache (see the module docstring)."""

    def __init__(
        self,
        model: QwenVLForGeneration,
        decode: Decode,
        *,
        eos_token_ids: tuple[int, ...] = (),
        max_batch_size: int = 8,
        max_len: int = 2048,
        graphs: bool | None = None,
        record: bool = False,
        max_sessions: int = 0,
        session_rows: int | None = None,
    ) -> None:
        """``max_sessions``: frame sessions held at once; ``session_rows``: cache rows of each (default half of
        ``max_len``, the other half left to queries and replies)."""
        super().__init__(
            model,
            decode,
            eos_token_ids=eos_token_ids,
            max_batch_size=max_batch_size,
            max_len=max_len,
            graphs=graphs,
            fused=False,  # the fused layer kernels take no q/k/v biases
            record=record,
        )
        self.vl = model
        self.image_token_id = model.vl_config.image_token_id
        self.prefill_graphs = None
        self.pad_lone_prefill = False
        self.rope_delta = torch.zeros(self.max_batch_size, dtype=torch.long, device=self.device)
        model.position_offset = self.rope_delta
        self.images_encoded = 0  # images through the vision tower (tests, metrics)
        self.vision_calls = 0
        self.tokens_prefilled = 0  # prompt and frame tokens run through the layers (tests, metrics)
        self.session_rebuilds = 0
        self.session_rows = session_rows if session_rows is not None else self.max_len // 2
        if not 0 < self.session_rows <= self.max_len:
            raise ConfigError(
                f"backend_args session_rows: must be in 1..{self.max_len} (max_model_len), got {self.session_rows}"
            )
        cfg = model.config
        shape = KVShape(cfg.num_hidden_layers, max_sessions, cfg.num_key_value_heads, self.session_rows, cfg.head_dim)
        self.session_kv = SlotKVCache(shape, dtype=self.dtype, device=self.device) if max_sessions else None
        self._sessions: dict[int, _Session] = {}
        self._free_sessions = list(range(max_sessions))
        self._generations = 0
        # What prepare threads read: replaced whole (never mutated) on every change, so a reader sees one state.
        self.views: dict[int, SessionView] = {}

    def _prefill_all(self, admitted: list[tuple[LMSeq, tuple[int, ...]]], outputs: dict[int, LMOut]) -> list[LMSeq]:
        fresh, continued = [], []
        for seq, prompt_ids in admitted:
            ids = torch.tensor(prompt_ids, dtype=torch.long, device=self.device)  # images are spliced in by id
            view = seq.payload.cached if isinstance(seq.payload, VLRequest) else None
            live = self._sessions.get(view.sid) if view is not None else None
            if view is not None and live is not None and not live.stale and live.view.generation == view.generation:
                continued.append((seq, ids))
            else:  # no session, or its rows were rebuilt since the prompt matched them: the whole prompt
                fresh.append((seq, ids))
        joined = self._prefill_each(
            [seq for seq, _ in fresh], [(seq.slot, ids, seq.payload) for seq, ids in fresh], self._prefill_vl, outputs
        )
        joined += self._prefill_each(
            [seq for seq, _ in continued],
            [(seq.slot, ids, seq.payload) for seq, ids in continued],
            self._prefill_continued,
            outputs,
        )
        return joined

    def _features(self, images: list[PreparedImage | EncodedFrame]) -> torch.Tensor:
        """LM embeddings ``[tokens, H]`` of ``images`` in order: stored features as they are, the others through
        the vision tower in one call."""
        dev = self.device
        todo = [im for im in images if isinstance(im, PreparedImage)]
        encoded: list[torch.Tensor] = []
        if todo:
            self.vision_calls += 1
            patches = torch.from_numpy(np.concatenate([im.patches for im in todo])).to(dev)
            grids = torch.tensor([im.grid for im in todo], dtype=torch.long, device=dev)
            encoded = list(self.vl.encode_images(patches, grids).split([im.tokens for im in todo]))
            self.images_encoded += len(todo)
        it = iter(encoded)
        return torch.cat([next(it) if isinstance(im, PreparedImage) else im.features for im in images])

    def _prefill_vl(self, prompts: list[tuple[int, torch.Tensor, LMRequest]]) -> None:
        """One forward over every newcomer's prompt, images spliced in; K/V rows to each one's slot."""
        dev = self.device
        lengths = [ids.shape[0] for _, ids, _ in prompts]
        t = max(lengths)
        ids = torch.nn.utils.rnn.pad_sequence([ids for _, ids, _ in prompts], batch_first=True)
        x = self.lm.embed(ids)
        positions = torch.arange(t, device=dev)[None, None].repeat(3, len(prompts), 1)
        images: list[PreparedImage | EncodedFrame] = []
        deltas = []
        for i, (_, prompt, req) in enumerate(prompts):
            vl = req if isinstance(req, VLRequest) else None
            deltas.append(vl.rope_delta if vl is not None else 0)
            if vl is None or not vl.images:
                continue
            images.extend(vl.images)
            if vl.positions is None or vl.positions.shape != (3, prompt.shape[0]):
                raise ValueError("an image prompt needs its positions [3, n]")
            positions[:, i, : prompt.shape[0]] = torch.from_numpy(vl.positions).to(dev)
        if images:
            features = self._features(images)
            where = ids == self.image_token_id
            if int(where.sum()) != features.shape[0]:
                raise ValueError(f"{int(where.sum())} image tokens in the prompts for {features.shape[0]} features")
            x[where] = features.to(x.dtype)  # row-major: each prompt's images in order, prompts in order
        slots = torch.tensor([slot for slot, _, _ in prompts], dtype=torch.long, device=dev)
        lens = torch.tensor(lengths, dtype=torch.long, device=dev)
        self.rope_delta[slots] = torch.tensor(deltas, dtype=torch.long, device=dev)
        mask = padded_causal_mask(lens, t) if min(lengths) != t else None
        attend = self._prefill_attend(slots, t, mask, prefill_attention)
        hidden = self.lm(x, positions, attend)
        self.hidden[slots] = hidden[torch.arange(len(prompts), device=dev), lens - 1]
        self.tokens_prefilled += sum(lengths)
        if self.record:
            self.prefill_log.append((len(prompts), t, "eager"))

    def _prefill_continued(self, prompts: list[tuple[int, torch.Tensor, LMRequest]]) -> None:
        """Prompts that start with their sessions' rows, in one forward: each one's session rows copied into its
        slot, then every prompt's own tokens (right-padded to the longest) prefilled after its rows."""
        assert self.session_kv is not None
        dev = self.device
        rests, starts, deltas, positions = [], [], [], []
        for slot, ids, req in prompts:
            assert isinstance(req, VLRequest) and req.cached is not None and req.positions is not None
            start, sid = req.cached.length, req.cached.sid
            self.kv.k[:, slot, :, :start] = self.session_kv.k[:, sid, :, :start]
            self.kv.v[:, slot, :, :start] = self.session_kv.v[:, sid, :, :start]
            rest = ids[start:]
            if bool((rest == self.image_token_id).any()):
                raise ValueError("a prompt continuing a session's rows has images of its own")
            rests.append(rest)
            starts.append(start)
            deltas.append(req.rope_delta)
            positions.append(torch.from_numpy(req.positions[:, start:]))
        lengths = [rest.shape[0] for rest in rests]
        t = max(lengths)
        pos = torch.zeros(3, len(prompts), t, dtype=torch.long)
        for i, p in enumerate(positions):
            pos[:, i, : p.shape[1]] = p
        slots = torch.tensor([slot for slot, _, _ in prompts], dtype=torch.long, device=dev)
        first = torch.tensor(starts, dtype=torch.long, device=dev)
        lens = torch.tensor(lengths, dtype=torch.long, device=dev)
        ids = torch.nn.utils.rnn.pad_sequence(rests, batch_first=True)
        bound = max(a + n for a, n in zip(starts, lengths, strict=True))
        hidden = self.lm(self.lm.embed(ids), pos.to(dev), self.kv.prefill_rows(slots, first, lens, bound))
        self.hidden[slots] = hidden[torch.arange(len(prompts), device=dev), lens - 1]
        self.rope_delta[slots] = torch.tensor(deltas, dtype=torch.long, device=dev)
        self.tokens_prefilled += sum(lengths)
        if self.record:
            self.prefill_log.append((len(prompts), t, "continued"))

    # -- frame sessions (worker thread) ------------------------------------------------------------------

    def _publish(self) -> None:
        self.views = {sid: s.view for sid, s in self._sessions.items()}

    def session_open(self, prefix: tuple[int, ...], max_frames: int) -> SessionView:
        """A session whose rows start with ``prefix`` (its template's turns up to the user turn's frames). A write
        that fails leaves the slot free."""
        if not self._free_sessions:
            raise InvalidRequestError(
                f"all {len(self._sessions)} frame sessions of this model are open (backend_args max_sessions)",
                "session",
            )
        if max_frames < 1:
            raise InvalidRequestError(f"max_frames must be >= 1, got {max_frames}", "max_frames")
        if len(prefix) >= self.session_rows:
            raise InvalidRequestError(f"the session's prompt leaves no room in {self.session_rows} rows", "session")
        sid = self._free_sessions[0]
        ids = self._write_rows(sid, prefix, [], 0)
        self._free_sessions.pop(0)
        self._generations += 1  # unique across sessions: a view of a closed session never matches its successor
        self._sessions[sid] = _Session(sid, prefix, max_frames, [], SessionView(sid, self._generations, ids, ()))
        self._publish()
        return self._sessions[sid].view

    def session_close(self, sid: int) -> None:
        """Free the session's rows (queries that matched it prefill their whole prompt)."""
        if self._sessions.pop(sid, None) is not None:
            self._free_sessions.append(sid)
            self._free_sessions.sort()
            self._publish()

    @torch.no_grad()
    def session_append(self, sid: int, image: np.ndarray, key: bytes, prepared: PreparedImage) -> SessionView:
        """Encode one frame and prefill its tokens after the session's rows; past the window the oldest frames
        leave and the rest are rebuilt (see the module docstring). Returns the view now published."""
        (out,) = self.session_append_many([FrameIn(sid, image, key, prepared)])
        if isinstance(out, Exception):
            raise out
        return out

    @torch.no_grad()
    def session_append_many(self, frames: list[FrameIn]) -> list[SessionView | Exception]:
        """:meth:`session_append` of frames of any sessions (the worker's batch of them): their images through the
        vision tower in one call, then each session's rows in arrival order. A frame that cannot be taken (its
        session closed, too many tokens, its write failed) gets its error and the others go on."""
        out: list[SessionView | Exception] = []
        valid: list[FrameIn] = []
        for f in frames:
            s = self._sessions.get(f.sid)
            if s is None:
                out.append(InvalidRequestError("the frame session is closed", "session"))
            elif len(s.prefix) + image_prompt_tokens(f.prepared.tokens) > self.session_rows:
                msg = f"a frame of {f.prepared.tokens} tokens does not fit the session's {self.session_rows} rows"
                out.append(InvalidRequestError(msg, "image"))
            else:
                valid.append(f)
                out.append(s.view)  # replaced below
        if not valid:
            return out
        features = self._features([f.prepared for f in valid]).split([f.prepared.tokens for f in valid])
        encoded = iter(zip(valid, features, strict=True))
        for i, result in enumerate(out):
            if isinstance(result, Exception):
                continue
            f, feats = next(encoded)
            try:
                out[i] = self._append(self._sessions[f.sid], EncodedFrame(f.image, f.key, f.prepared.grid, feats))
            except Exception as exc:  # this frame's waiter alone: the batch's other frames are committed
                out[i] = exc
        return out

    def _append(self, s: _Session, frame: EncodedFrame) -> SessionView:
        """Add ``frame`` to ``s``: the new window computed aside, its rows written, then committed. A write that
        fails leaves the session's frames and view as they were; one that overwrote rows before failing (a
        rebuild) marks the session stale: no query continues its rows until a later write rebuilds them."""
        frames = [*s.frames, frame]
        keep = max(1, s.max_frames - s.max_frames // 4)
        rebuild = len(frames) > s.max_frames
        while (
            len(frames) > (keep if rebuild else s.max_frames) or self._rows_used(s.prefix, frames) > self.session_rows
        ):
            frames.pop(0)
            rebuild = True
        rebuild = rebuild or s.stale
        start = 0 if rebuild else s.view.length
        try:
            ids = self._write_rows(s.sid, s.prefix, frames, start)
        except BaseException:
            if start == 0:  # the published rows were partly overwritten
                s.stale = True
                self._generations += 1  # queries that matched the old view prefill their whole prompt
                s.view = SessionView(s.sid, self._generations, s.view.ids, s.view.frames)
                self._publish()
            raise
        if rebuild:
            self._generations += 1
            self.session_rebuilds += 1
        s.frames = frames
        s.stale = False
        s.view = SessionView(s.sid, self._generations if rebuild else s.view.generation, ids, tuple(frames))
        self._publish()
        return s.view

    def _rows_used(self, prefix: tuple[int, ...], frames: list[EncodedFrame]) -> int:
        return len(prefix) + sum(image_prompt_tokens(f.tokens) for f in frames)

    def _write_rows(self, sid: int, prefix: tuple[int, ...], frames: list[EncodedFrame], start: int) -> tuple[int, ...]:
        """Prefill the ids of ``prefix`` and ``frames`` (each frame's markers around its pads) into slot ``sid``'s
        rows from ``start`` on (rows before ``start`` are left as they are: an append writes its newest frame);
        returns the ids. Changes nothing else: the caller commits once this returns."""
        assert self.session_kv is not None
        cfg = self.vl.vl_config
        ids = list(prefix)
        for f in frames:
            ids += [cfg.vision_start_token_id, *[self.image_token_id] * f.tokens, cfg.vision_end_token_id]
        new = torch.tensor(ids[start:], dtype=torch.long, device=self.device)
        positions, _ = rope_positions(ids, self.image_token_id, [f.grid for f in frames], cfg.vision.spatial_merge_size)
        x = self.lm.embed(new[None])
        where = new[None] == self.image_token_id
        if bool(where.any()):
            written = frames if start == 0 else frames[-1:]  # an append writes the newest frame alone
            x[where] = torch.cat([f.features for f in written]).to(x.dtype)
        pos = torch.from_numpy(positions[:, start:]).to(self.device)[:, None]
        self.lm(x, pos, self.session_kv.prefill(sid, start))
        self.tokens_prefilled += new.shape[0]
        return tuple(ids)
