"""GPU only: the Whisper encoder's CUDA graphs (one per batch bucket, captured at load) give the eager encoder's
transcripts, and a burst of a new size replays a graph instead of running eagerly."""

from __future__ import annotations

import pytest
import torch
from asr_helpers import utterance

from omni_stream.batch_model import Batch, Sequence
from omni_stream.engine import AsyncEngine
from omni_stream.family import ModelKind
from omni_stream.transcription.spec import TranscriptionRequest

pytestmark = pytest.mark.gpu
pytest_plugins = ("asr_fixtures",)


def transcribe(runner, payloads, group: list[int]) -> dict[int, str]:
    seqs = [Sequence(i, payloads[i], slot=k) for k, i in enumerate(group)]
    texts = dict.fromkeys(group, "")
    batch, live = Batch(prefill=tuple(seqs)), list(seqs)
    while live:
        for out in runner.step(batch):
            if out.item is not None:
                texts[out.seq_id] += out.item.text
            if out.finished:
                live = [s for s in live if s.seq_id != out.seq_id]
        batch = Batch(decode=tuple(live))
    for seq in seqs:
        runner.release(seq)
    return texts


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
async def test_encoder_graphs_equal_the_eager_encoder_at_every_bucket(tiny_whisper):
    async with await AsyncEngine.from_pretrained(
        tiny_whisper, device="cuda", dtype="float32", max_batch_size=8, progress=False
    ) as engine:
        family = engine.models.get(ModelKind.TRANSCRIPTION)
        runner = family.runner
        assert runner.encode_graphs is not None and len(runner.encode_graphs) == len(runner.encode_buckets)
        runner.record = True
        audios = [utterance("noise", 0.5 + 0.3 * i, seed=i) for i in range(5)]
        payloads = [family._prepare(a, TranscriptionRequest(a, 16000, max_tokens=8), None) for a in audios]
        graphed = transcribe(runner, payloads, [0, 1, 2, 3, 4])  # five newcomers: the bucket of eight
        encodes = [e for e in runner.log if e[0] == "encode"]
        assert encodes == [("encode", 5, 8, "graph")]
        graphs, runner.encode_graphs = runner.encode_graphs, None
        try:
            eager = transcribe(runner, payloads, [0, 1, 2, 3, 4])
        finally:
            runner.encode_graphs = graphs
        assert graphed == eager
