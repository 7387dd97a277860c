"""GPU-only: the code-predictor loop runs without host syncs and captures as one CUDA graph; the runner runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from omni_stream.models.qwen3_tts.checkpoint import hub_config, load_lm
from omni_stream.models.qwen3_tts.config import load_config
from omni_stream.models.qwen3_tts.prompt import prepare_request
from omni_stream.models.qwen3_tts.runner import Qwen3TTSRunner
from omni_stream.requests import SamplingParams, SpeechRequest
from omni_stream.runtime.sampling import SamplingTensors

pytestmark = pytest.mark.gpu


def _real_size(tmp_path: Path, size: str = "0.6b"):
    (tmp_path / "config.json").write_text(json.dumps(hub_config("custom_voice", size, tiny=False)))
    return load_lm(tmp_path, load_format="dummy", dtype=torch.bfloat16, device="cuda")


def test_code_predictor_loop_is_sync_free_and_graph_capturable(tmp_path) -> None:
    lm = _real_size(tmp_path)
    cp = lm.talker.code_predictor
    b, h = 4, lm.config.talker.decoder.hidden_size
    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(b, h, device="cuda", dtype=torch.bfloat16, generator=gen)
    c0 = torch.randn(b, h, device="cuda", dtype=torch.bfloat16, generator=gen)
    params = SamplingTensors.from_params(
        [SamplingParams(), SamplingParams(do_sample=False), SamplingParams(top_k=5), SamplingParams(top_p=0.7)], "cuda"
    )
    noise = torch.empty(b, 15, 2048, device="cuda").exponential_(generator=gen)
    with torch.no_grad():
        cp.generate(hidden, c0, params, noise)  # allocates the batch's scratch buffers
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            eager = cp.generate(hidden, c0, params, noise)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            cp.generate(hidden, c0, params, noise)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = cp.generate(hidden, c0, params, noise)
        graph.replay()
        assert torch.equal(static_out, eager)
        hidden.copy_(torch.randn(b, h, device="cuda", dtype=torch.bfloat16, generator=gen))
        noise.exponential_(generator=gen)
        graph.replay()
        assert torch.equal(static_out, cp.generate(hidden, c0, params, noise))
    assert eager.shape == (b, 15) and int(eager.max()) < 2048


def test_runner_on_gpu_real_size(tmp_path) -> None:
    from omni_stream.models.qwen3_tts.checkpoint import write_tokenizer
    from omni_stream.models.qwen3_tts.tokenizer import TextTokenizer

    lm = _real_size(tmp_path)
    write_tokenizer(tmp_path)
    cfg = load_config(tmp_path)
    tok = TextTokenizer(tmp_path)
    runner = Qwen3TTSRunner(lm, max_batch_size=4, max_len=256)
    reqs = [
        prepare_request(
            SpeechRequest(text="Hello world.", voice=v, max_new_tokens=9, ignore_eos=True, seed=i), cfg, tok
        )
        for i, v in enumerate(("ryan", "vivian", "aiden"))
    ]
    out = runner.generate_codes(reqs, join_steps=[0, 2, 3])
    assert [o.shape for o in out] == [(9, 16)] * 3
    assert runner.num_active == 0
    again = runner.generate_codes(reqs, join_steps=[0, 2, 3])
    assert all(torch.equal(a, b) for a, b in zip(out, again, strict=True))  # seeded sampling reproduces
