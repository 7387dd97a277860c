"""GPU only: Whisper's CUDA graphs, captured at load (the encoder per batch bucket, the decoder call per shape),
give the eager paths' transcripts, and a batch of a size seen for the first time replays graphs: nothing is
captured, and nothing runs eagerly, at request time."""

from __future__ import annotations

import asyncio

import pytest
import torch
from asr_helpers import step_together, utterance

from omni_stream.engine import AsyncEngine
from omni_stream.family import ModelKind
from omni_stream.runtime.cuda_graphs import GraphSet
from omni_stream.transcription.spec import TranscriptionRequest

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
pytest_plugins = ("asr_fixtures",)

N = 8  # slots: batch sizes 1..N


def engine(tiny_whisper):
    return AsyncEngine.from_pretrained(tiny_whisper, device="cuda", dtype="float32", max_batch_size=N, progress=False)


def payloads(family, n: int) -> list:
    """Named language, detection, a context prompt (a wide prompt call), a long budget (a wider span), in turn."""
    out = []
    for i in range(n):
        audio = utterance("noise" if i % 2 else f"tone{300 + 100 * i}", 0.4 + 0.3 * i, seed=i)
        kind = i % 4
        request = TranscriptionRequest(
            audio,
            16000,
            language=None if kind == 1 else "en",
            prompt="hello world this is a speech test and this is a voice" if kind == 2 else None,
            max_tokens=80 if kind == 3 else 6 + i,
        )
        out.append(family._prepare(audio, request, family.tokens.language_id(request.language)))
    return out


async def test_encoder_graphs_equal_the_eager_encoder_at_every_bucket(tiny_whisper):
    async with await engine(tiny_whisper) as eng:
        family = eng.models.get(ModelKind.TRANSCRIPTION)
        runner = family.runner
        assert runner.encode_graphs is not None and len(runner.encode_graphs) == len(runner.encode_buckets)
        runner.record = True
        batch = payloads(family, 5)
        graphed = step_together(runner, batch)  # five newcomers: the bucket of six
        encodes = [e for e in runner.log if e[0] == "encode"]
        assert encodes == [("encode", 5, 6, 1500, "graph")]
        runner.time_encoder = True  # a benchmark's timing: each pass's device time by CUDA events, by bucket
        step_together(runner, batch)
        assert runner.encoder_device_ms[6] > 0 and runner.encoder_timed[6] == 1 and not runner._timed  # added later
        runner.time_encoder = False
        graphs, runner.encode_graphs = runner.encode_graphs, None
        try:
            eager = step_together(runner, batch)
        finally:
            runner.encode_graphs = graphs
        assert graphed == eager


async def test_decoder_graphs_give_the_eager_tokens_at_every_batch_size(tiny_whisper):
    """Batch sizes 1..N: the graphed decoder's tokens equal the eager decoder's at the same shapes and at each
    step's exact (unbucketed) shape, and every decoder call replayed a graph."""
    async with await engine(tiny_whisper) as eng:
        family = eng.models.get(ModelKind.TRANSCRIPTION)
        runner = family.runner
        keys = runner.shapes.keys()
        assert runner.decode_graphs is not None and len(runner.decode_graphs) == len(keys)
        runner.record = True
        every = payloads(family, N)
        for n in range(1, N + 1):
            batch = every[:n]
            mark = len(runner.log)
            graphed = step_together(runner, batch)
            calls = [e for e in runner.log[mark:] if e[0] == "decode"]
            assert calls and all(e[-1] == "graph" for e in calls), calls
            graphs, runner.decode_graphs = runner.decode_graphs, None
            try:
                eager = step_together(runner, batch)  # the same shapes, eagerly
                runner.pad_shapes = False
                exact = step_together(runner, batch)  # each step's exact shape, eagerly
            finally:
                runner.decode_graphs, runner.pad_shapes = graphs, True
            assert graphed == eager == exact, n
            assert all(tokens for _, tokens in graphed)


async def test_a_batch_size_seen_for_the_first_time_replays_graphs(tiny_whisper, monkeypatch):
    """Through the engine: bursts of 1, 3, 5 and 8 requests (each size new) run every encoder pass and decoder
    call from a graph captured at load; no capture happens while they run."""
    async with await engine(tiny_whisper) as eng:
        family = eng.models.get(ModelKind.TRANSCRIPTION)
        runner = family.runner
        counts = (len(runner.encode_graphs), len(runner.decode_graphs))
        assert counts == (len(runner.encode_buckets), len(runner.shapes.keys()))

        def no_capture(self, key):
            raise AssertionError(f"a CUDA graph captured at request time: {key}")

        monkeypatch.setattr(GraphSet, "capture", no_capture)
        runner.record = True
        clips = [utterance("noise", 0.5 + 0.2 * i, seed=40 + i) for i in range(N)]

        async def one(audio) -> str:
            request = TranscriptionRequest(audio, language="en", max_tokens=60)  # long enough to overlap
            return "".join([out.chunk.text async for out in eng.generate(request)])

        for size in (1, 3, 5, 8):
            texts = await asyncio.gather(*(one(a) for a in clips[:size]))
            assert all(texts)
        encodes = [e for e in runner.log if e[0] == "encode"]
        calls = [e for e in runner.log if e[0] == "decode"]
        assert encodes and all(e[-1] == "graph" for e in encodes), encodes
        assert calls and all(e[-1] == "graph" for e in calls), [e for e in calls if e[-1] != "graph"]
        assert len({e[2] for e in calls}) >= 3  # calls over several row buckets, each met for the first time
        assert (len(runner.encode_graphs), len(runner.decode_graphs)) == counts


async def test_shorter_windows_replay_graphs_and_give_the_eager_tokens(tiny_whisper):
    """``transcription_window_ms``: an encoder graph per batch bucket and window, captured at load; a step whose
    newcomers span every window replays a graph for each pass (the decoder's cross mask read inside the decoder
    graphs), with the eager paths' tokens."""
    from omni_stream.runtime.settings import Tuning

    tuning = Tuning(transcription_window_ms=4000)
    async with await AsyncEngine.from_pretrained(
        tiny_whisper, device="cuda", dtype="float32", max_batch_size=N, progress=False, tuning=tuning
    ) as eng:
        family = eng.models.get(ModelKind.TRANSCRIPTION)
        runner = family.runner
        assert runner.windows == (200, 400, 800, 1500)
        assert len(runner.encode_graphs) == len(runner.encode_buckets) * len(runner.windows)
        clips = [utterance("noise", s, seed=60 + i) for i, s in enumerate((0.8, 1.1, 4.0, 9.0, 20.0))]
        request = TranscriptionRequest(clips[0], language="en", max_tokens=12)
        batch = [family._prepare(a, request, family.tokens.language_id("en")) for a in clips]
        assert [p.window for p in batch] == [200, 200, 400, 800, 1500]
        runner.record = True
        step_together(runner, batch[2:])  # longer windows' frames left in slots 0-2
        graphed = step_together(runner, list(reversed(batch)))
        encodes = [e for e in runner.log if e[0] == "encode"]
        assert [e[3] for e in encodes[-4:]] == [200, 400, 800, 1500] and all(e[-1] == "graph" for e in encodes)
        graphs = runner.encode_graphs, runner.decode_graphs
        runner.encode_graphs = runner.decode_graphs = None
        try:
            step_together(runner, batch[2:])
            eager = step_together(runner, list(reversed(batch)))
        finally:
            runner.encode_graphs, runner.decode_graphs = graphs
        assert graphed == eager and all(tokens for _, tokens in graphed)
