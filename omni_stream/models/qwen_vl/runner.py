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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from omni_stream.models.causal_lm.detokenize import Decode
from omni_stream.models.causal_lm.runner import CausalLMRunner, LMOut, LMRequest, LMSeq, prefill_attention
from omni_stream.models.qwen_vl.model import QwenVLForGeneration
from omni_stream.models.qwen_vl.vision import PreparedImage
from omni_stream.runtime.slot_runner import padded_causal_mask


@dataclass(slots=True, frozen=True)
class VLRequest(LMRequest):
    """An :class:`LMRequest` whose prompt may show images: ``images`` in prompt order, ``positions`` ``[3, n]``
    (None: a text prompt, positions 0..n-1) and the decode positions' ``rope_delta``."""

    images: tuple[PreparedImage, ...] = ()
    positions: np.ndarray | None = None
    rope_delta: int = 0


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
    ) -> None:
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

    def _prefill_all(self, admitted: list[tuple[LMSeq, torch.Tensor]], outputs: dict[int, LMOut]) -> list[LMSeq]:
        seqs = [seq for seq, _ in admitted]
        items = [(seq.slot, ids, seq.payload) for seq, ids in admitted]
        return self._prefill_each(seqs, items, self._prefill_vl, outputs)

    def _prefill_vl(self, prompts: list[tuple[int, torch.Tensor, LMRequest]]) -> None:
        """One forward over every newcomer's prompt, images spliced in; K/V rows to each one's slot."""
        dev = self.device
        lengths = [ids.shape[0] for _, ids, _ in prompts]
        t = max(lengths)
        ids = torch.nn.utils.rnn.pad_sequence([ids for _, ids, _ in prompts], batch_first=True)
        x = self.lm.embed(ids)
        positions = torch.arange(t, device=dev)[None, None].repeat(3, len(prompts), 1)
        images: list[PreparedImage] = []
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
            patches = torch.from_numpy(np.concatenate([im.patches for im in images])).to(dev)
            grids = torch.tensor([im.grid for im in images], dtype=torch.long, device=dev)
            features = self.vl.encode_images(patches, grids)
            where = ids == self.image_token_id
            if int(where.sum()) != features.shape[0]:
                raise ValueError(f"{int(where.sum())} image tokens in the prompts for {features.shape[0]} features")
            x[where] = features.to(x.dtype)  # row-major: each prompt's images in order, prompts in order
            self.images_encoded += len(images)
        slots = torch.tensor([slot for slot, _, _ in prompts], dtype=torch.long, device=dev)
        lens = torch.tensor(lengths, dtype=torch.long, device=dev)
        self.rope_delta[slots] = torch.tensor(deltas, dtype=torch.long, device=dev)
        mask = padded_causal_mask(lens, t) if min(lengths) != t else None
        attend = self._prefill_attend(slots, t, mask, prefill_attention)
        hidden = self.lm(x, positions, attend)
        self.hidden[slots] = hidden[torch.arange(len(prompts), device=dev), lens - 1]
        if self.record:
            self.prefill_log.append((len(prompts), t, "eager"))
