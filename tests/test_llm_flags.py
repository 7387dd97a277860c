"""``serve``'s language-model options: typed ``--llm-arg`` values that reach the backend unchanged."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from lm_helpers import tiny_lm_checkpoint
from serving_helpers import LiveServer, text_server
from test_serving_cli import free_port, wait_healthy
from tiny_models import tiny_tts

from omni_stream.errors import ConfigError
from omni_stream.models.vllm_text.params import engine_args
from omni_stream.realtime import llm_flags, server

SCALE_OUT = [
    "--llm-arg", "tensor_parallel_size=2",
    "--llm-arg", "pipeline-parallel-size=2",
    "--llm-arg", "gpu_memory_utilization=0.5",
    "--llm-arg", "distributed_executor_backend=ray",
    "--llm-arg", "enforce_eager=true",
    "--llm-arg", "max_model_len=4096",
    "--llm-arg", "served_model_name=[\"big\", \"big-alias\"]",
    "--llm-arg", "quantization=none",
]  # fmt: skip
SCALE_OUT_ARGS = {
    "tensor_parallel_size": 2,
    "pipeline_parallel_size": 2,
    "gpu_memory_utilization": 0.5,
    "distributed_executor_backend": "ray",
    "enforce_eager": True,
    "max_model_len": 4096,
    "served_model_name": ["big", "big-alias"],
    "quantization": None,
}


def serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    server.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(
    ("text", "value"),
    [("2", 2), ("-3", -3), ("0.5", 0.5), ("1e-3", 1e-3), ("true", True), ("False", False), ("none", None),
     ("null", None), ("ray", "ray"), ("[1, 2]", [1, 2]), ('{"a": 1}', {"a": 1}), ("[not json", "[not json"), ("", "")],
)  # fmt: skip
def test_llm_arg_values_are_typed(text, value):
    parsed = llm_flags.parse_value(text)
    assert parsed == value and type(parsed) is type(value)


def test_vllm_engine_arguments_pass_through_typed_and_unchanged():
    options = llm_flags.engine_options(serve_args("--llm", "/models/big", "--llm-backend", "vllm", *SCALE_OUT))
    assert options == {"llm": "/models/big", "llm_family": "vllm", "backend_args": SCALE_OUT_ARGS}
    # ... and become AsyncEngineArgs(model=<checkpoint>, **those) with nothing renamed, added or dropped.
    assert engine_args(Path("/models/big"), options["backend_args"]) == {"model": "/models/big", **SCALE_OUT_ARGS}


def test_the_native_backend_keeps_the_checkpoints_model_type():
    assert llm_flags.engine_options(serve_args("--llm", "/models/small")) == {
        "llm": "/models/small",
        "llm_family": None,
        "backend_args": {},
    }


def test_the_remote_backend_gets_model_and_key_as_backend_arguments():
    args = serve_args("--llm-endpoint", "http://h:8000", "--llm-model", "m", "--llm-api-key", "k")
    assert llm_flags.engine_options(args) == {
        "llm_endpoint": "http://h:8000",
        "backend_args": {"model": "m", "api_key": "k"},
    }


def test_no_language_model_options_means_no_language_model():
    assert llm_flags.engine_options(serve_args()) == {}


@pytest.mark.parametrize(
    "argv",
    [
        ["--llm", "d", "--llm-endpoint", "http://h"],
        ["--llm-endpoint", "http://h", "--llm-backend", "vllm"],
        ["--llm", "d", "--llm-model", "m"],
        ["--llm-arg", "a=1"],
        ["--llm-backend", "vllm"],
    ],
)
def test_contradictory_options_are_refused(argv):
    with pytest.raises(SystemExit):
        llm_flags.engine_options(serve_args(*argv))


@pytest.mark.parametrize("item", ["no-equals", "=1", "two words=1"])
def test_malformed_llm_args_are_usage_errors(item, capsys):
    with pytest.raises(SystemExit):
        serve_args("--llm-arg", item)
    assert "expected KEY=VALUE" in capsys.readouterr().err


def test_a_model_engine_argument_is_refused_for_vllm():
    with pytest.raises(ConfigError, match="drop the 'model' engine argument"):
        engine_args(Path("/models/big"), {"model": "other"})


@pytest.fixture(scope="module")
def lm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """Our own server with a text model: the upstream of the serve subprocesses below."""
    with text_server(tiny_lm_checkpoint(tmp_path_factory, "qwen3")) as server:
        yield server


def test_serve_with_an_llm_endpoint_loads_the_remote_model(lm_server, tmp_path):
    """``omni-stream serve --model TTS --llm-endpoint URL`` as a subprocess: both models load."""
    model = lm_server.engine.models.text().info.model_name
    port = free_port()
    cmd = [sys.executable, "-m", "omni_stream.cli", "serve", "--port", str(port), "--log-level", "warning"]
    cmd += ["--model", str(tiny_tts()), "--voices-dir", str(tmp_path / "voices")]
    cmd += ["--llm-endpoint", lm_server.url + "/v1", "--llm-model", model, "--llm-arg", "connect_timeout=3"]
    proc = subprocess.Popen(cmd, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert f"{model} (text, openai)" in out and "(speech, qwen3_tts)" in out, out


def test_serve_refuses_unknown_remote_options_at_start(lm_server):
    cmd = [sys.executable, "-m", "omni_stream.cli", "serve", "--port", str(free_port())]
    cmd += ["--llm-endpoint", lm_server.url, "--llm-arg", "tensor_parallel_size=2"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "unknown options for the OpenAI-compatible backend: tensor_parallel_size" in done.stdout + done.stderr
