"""The codec stage: exactly the last audio chunk is final, on and off window boundaries; the first is not held;
through graph windows only, whatever the window sizes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from graph_standins import EagerGraphs
from reference_codec import tiny_checkpoint_dir

from omni_stream.chunks import Audio, CodecFrames
from omni_stream.context import RequestContext
from omni_stream.models.qwen3_tts.codec import load_speech_tokenizer
from omni_stream.models.qwen3_tts.codec_graphs import CodecWindows
from omni_stream.models.qwen3_tts.codec_stage import codec_stage
from omni_stream.worker import DeviceWorker

TOL = 1e-4
INITIAL, STEADY = 2, 4  # windows 2, 4, 4, ...: boundaries after 2, 6, 10, 14 frames


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    return load_speech_tokenizer(tiny_checkpoint_dir(tmp_path_factory), with_encoder=False).eval()


@pytest.fixture
async def worker():
    w = DeviceWorker(threads=1).start()
    yield w
    await w.aclose()


async def _run(
    tokenizer, worker, codes: torch.Tensor, mark_final: bool, log: list[str], pool=None, initial: int = INITIAL
) -> list[Audio]:
    stage = codec_stage(
        tokenizer.decoder,
        worker,
        sample_rate=tokenizer.sample_rate,
        samples_per_frame=tokenizer.samples_per_frame,
        initial_frames=initial,
        steady_frames=STEADY,
        pool=pool,
    )

    async def upstream():
        n = codes.shape[0]
        for i in range(n):
            log.append(f"frame {i}")
            # mark_final=False: the stream ends without a final frame (EOS ends a sequence that way).
            yield CodecFrames(codes[i : i + 1], start_frame=i, final=mark_final and i == n - 1)

    chunks = []
    async for audio in stage(RequestContext(), upstream()):
        log.append(f"audio {len(chunks)}")
        chunks.append(audio)
    return chunks


@pytest.mark.parametrize("mark_final", [True, False], ids=["final-frame", "eos-end"])
@pytest.mark.parametrize("n_frames", [1, 2, 3, 5, 6, 7, 10, 13, 14])
async def test_exactly_the_last_chunk_is_final(tokenizer, worker, n_frames: int, mark_final: bool) -> None:
    codes = torch.randint(0, 2048, (n_frames, 16), generator=torch.Generator().manual_seed(n_frames))
    log: list[str] = []
    chunks = await _run(tokenizer, worker, codes, mark_final, log)
    assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True]
    spf = tokenizer.samples_per_frame
    starts = np.cumsum([0] + [c.n_samples for c in chunks[:-1]])
    assert [c.start_sample for c in chunks] == starts.tolist()
    streamed = np.concatenate([c.samples for c in chunks])
    assert streamed.shape == (n_frames * spf,)
    with torch.inference_mode():
        whole = tokenizer.decoder(codes.T.unsqueeze(0)).reshape(-1).float().numpy()
    assert np.abs(streamed - whole).max() < TOL
    # Only an unmarked stream ending right after its first window needs the empty closing chunk.
    empty = [c for c in chunks if c.n_samples == 0]
    assert len(empty) == (1 if (not mark_final and n_frames == INITIAL) else 0)


async def test_the_first_chunk_goes_out_before_the_next_frame_is_pulled(tokenizer, worker) -> None:
    codes = torch.randint(0, 2048, (9, 16), generator=torch.Generator().manual_seed(0))
    log: list[str] = []
    await _run(tokenizer, worker, codes, False, log)
    assert log[: INITIAL + 1] == ["frame 0", "frame 1", "audio 0"]
    # The second window (frames 2-5) ends exactly on the frames pulled so far: it is handed on once frame 6
    # shows that more follow.
    assert log.index("audio 1") == log.index("frame 6") + 1


@pytest.mark.parametrize("mark_final", [True, False], ids=["final-frame", "eos-end"])
async def test_odd_windows_and_the_last_one_replay_graph_windows_exactly(tokenizer, worker, mark_final) -> None:
    """A first window of 3 frames (split 2 + 1) and a 3-frame tail (padded to 4: the stage says it is the last)
    through a pool whose graphs are windows 1, 2, 4: no eager decode, the whole-utterance waveform."""
    pool = CodecWindows(tokenizer.decoder, 2, graphs=False, windows=(1, 2, 4))
    pool.graphs = EagerGraphs(pool._graph_step)
    pool.capture_graphs()
    codes = torch.randint(0, 2048, (14, 16), generator=torch.Generator().manual_seed(5))  # windows 3, 4, 4, 3
    chunks = await _run(tokenizer, worker, codes, mark_final, [], pool=pool, initial=3)
    assert [c.n_samples // tokenizer.samples_per_frame for c in chunks] == [3, 4, 4, 3]
    assert pool.eager_jobs == 0 and pool.planned_jobs == 2 and pool.graph_jobs == 2 + 1 + 1 + 1
    with torch.inference_mode():
        whole = tokenizer.decoder(codes.T.unsqueeze(0)).reshape(-1).float().numpy()
    assert np.abs(np.concatenate([c.samples for c in chunks]) - whole).max() < TOL
    assert pool.in_use == 0
