"""The native text family through the engine: chat streaming, threads, load options, checkpoints, the default."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import transformers
from lm_helpers import tiny_lm_checkpoint

from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.errors import ConfigError
from omni_stream.family import ModelKind, TextFamily
from omni_stream.family_registry import resolve_family
from omni_stream.models.causal_lm import family as family_mod
from omni_stream.models.causal_lm.checkpoint import SPECIALS, write_dummy_checkpoint
from omni_stream.models.causal_lm.config import load_config
from omni_stream.models.causal_lm.model import build_lm
from omni_stream.models.causal_lm.tokenizer import ChatTokenizer
from omni_stream.requests import GREEDY, ChatMessage, Role, SamplingParams, TextRequest
from omni_stream.runtime.weights import count_parameters

CONFIGS = Path(__file__).resolve().parents[1] / "benchmarks" / "configs"


def chat(text: str, **fields) -> TextRequest:
    return TextRequest(messages=(ChatMessage(Role.USER, text),), **fields)


async def load(path: Path, **options) -> AsyncEngine:
    return await AsyncEngine.load({"llm": ModelSource(path, kind=ModelKind.TEXT)}, progress=False, **options)


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
async def test_chat_deltas_join_to_the_decode_of_the_generated_tokens(tmp_path_factory, arch):
    path = tiny_lm_checkpoint(tmp_path_factory, arch)
    async with await load(path) as engine:
        family = engine.models.text()
        assert isinstance(family, TextFamily) and family.info.model_type == arch
        family.runner.record = True
        request = chat("Café 🎉 日本語, how are you?", max_tokens=40, sampling=SamplingParams(temperature=1.2),
                       seed=3, ignore_eos=True)  # fmt: skip
        stream = engine.chat(request)
        async with stream:
            deltas = [out.chunk async for out in stream]
        tokens = next(iter(family.runner.recorded.values()))
        assert len(tokens) == 40 and "".join(d.text for d in deltas) == family.tokenizer.decode(tokens)
        assert not any("\ufffd" in d.text for d in deltas[:-1]) or "\ufffd" in family.tokenizer.decode(tokens)
        usage = stream.usage["text"]
        assert usage.output_tokens == 40
        assert usage.input_tokens == len(ChatTokenizer(path).encode(request))


async def test_prompts_are_built_off_the_loop_and_text_is_decoded_on_the_worker(tmp_path_factory, monkeypatch):
    path = tiny_lm_checkpoint(tmp_path_factory, "qwen3")
    async with await load(path) as engine:
        family = engine.models.text()
        threads: dict[str, set[int]] = {"encode": set(), "decode": set()}
        real_encode, real_decode = family.tokenizer.encode, family.tokenizer.decode

        def encode(request):
            threads["encode"].add(threading.get_ident())
            return real_encode(request)

        def decode(ids):
            threads["decode"].add(threading.get_ident())
            return real_decode(ids)

        monkeypatch.setattr(family.tokenizer, "encode", encode)
        monkeypatch.setattr(family.runner, "decode_text", decode)
        stream = engine.chat(chat("hello", max_tokens=5, sampling=GREEDY))
        async with stream:
            assert len([o async for o in stream]) >= 1
        loop_thread = threading.get_ident()
        assert threads["encode"] and loop_thread not in threads["encode"]
        assert threads["decode"] == {engine.worker.thread_id}


async def test_max_model_len_sizes_the_context_and_unknown_backend_args_are_refused(tmp_path_factory):
    path = tiny_lm_checkpoint(tmp_path_factory, "qwen3")
    async with await load(path, backend_args={"max_model_len": 96}) as engine:
        family = engine.models.text()
        assert family.info.max_context == 96 == family.runner.kv.max_len - 1
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        await load(path, backend_args={"tensor_parallel_size": 2})
    with pytest.raises(ConfigError, match="exceeds the model's 1024 positions"):
        await load(path, backend_args={"max_model_len": 4096})
    with pytest.raises(ConfigError, match="load_format"):
        await load(path, load_format="pickle")


def test_the_families_are_registered_by_model_type():
    assert resolve_family("qwen3") is resolve_family("llama") is family_mod.load_family


@pytest.mark.parametrize(
    ("name", "params", "arch"),
    [("qwen3-0.6b", 596_049_920, "qwen3"), ("llama-3.2-1b-instruct", 1_235_814_400, "llama")],
)
def test_the_real_configs_have_the_published_sizes(name, params, arch):
    cfg = load_config(CONFIGS / name)
    assert cfg.model_type == arch and cfg.tie_word_embeddings
    assert count_parameters(build_lm(cfg, "meta")) == params
    hf = transformers.AutoConfig.from_pretrained(CONFIGS / name)
    assert (hf.hidden_size, hf.num_hidden_layers, hf.vocab_size) == (cfg.hidden_size, cfg.num_hidden_layers,
                                                                      cfg.vocab_size)  # fmt: skip


def test_llama3_rope_scaling_matches_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = load_config(CONFIGS / "llama-3.2-1b-instruct")
    hf = transformers.AutoConfig.from_pretrained(CONFIGS / "llama-3.2-1b-instruct")
    expected, scale = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    assert scale == 1.0 and cfg.rope_scaling.rope_type == "llama3"
    assert torch.allclose(cfg.inv_freq(), expected.float(), rtol=1e-6, atol=0)


@pytest.mark.parametrize(("name", "eos"), [("qwen3-0.6b", [1002, 1000]), ("llama-3.2-1b-instruct", [1001, 1008, 1009])])
async def test_a_from_config_checkpoint_has_a_tokenizer_for_every_id(tmp_path, name, eos):
    src = tmp_path / "src"
    src.mkdir()
    cfg = dict(json.loads((CONFIGS / name / "config.json").read_text()), hidden_size=64, intermediate_size=128,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=1100,
               bos_token_id=1000)  # fmt: skip
    (src / "config.json").write_text(json.dumps(cfg))
    out = write_dummy_checkpoint(src, tmp_path / "out", dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    arch = cfg["model_type"]
    assert len(tok) == 1100 == len(set(tok.get_vocab().values()))
    assert [tok.convert_ids_to_tokens(1000 + i) for i in range(len(SPECIALS[arch]))] == list(SPECIALS[arch])
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == eos
    text = tok.decode(list(range(1100)), skip_special_tokens=True)
    assert "<unused_999>" in text and "<|" not in text
    async with await load(out) as engine:  # it loads and chats with its own weights
        stream = engine.chat(chat("hi", max_tokens=4, sampling=GREEDY, ignore_eos=True))
        async with stream:
            assert [o.chunk async for o in stream][-1].finish_reason == "length"


@pytest.mark.parametrize("kind", ["chat", "chat-llama"])
def test_make_checkpoint_cli_writes_a_checkpoint_transformers_loads(tmp_path, kind):
    out = tmp_path / kind
    cmd = [sys.executable, "-m", "omni_stream.cli", "make-checkpoint", "--tiny", "--kind", kind, str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert model.config.model_type == {"chat": "qwen3", "chat-llama": "llama"}[kind]
    assert transformers.AutoTokenizer.from_pretrained(out).chat_template


def test_the_embedded_default_is_built_once_atomically(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        path = family_mod.embedded_default_checkpoint(tmp_path)
    assert (path / family_mod.EMBEDDED_MARKER).exists() and "babbles" in caplog.text
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [path.name]  # no temp leftovers
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert family_mod.embedded_default_checkpoint(tmp_path) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime


async def test_from_pretrained_without_arguments_loads_the_tiny_tts_and_the_tiny_lm(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("OMNI_STREAM_CACHE", str(tmp_path))
    async with await AsyncEngine.from_pretrained(progress=False) as engine:
        assert engine.models.kinds[:2] == (ModelKind.SPEECH, ModelKind.TEXT)  # then the other kinds' defaults
        text = engine.models.text()
        assert text.embedded and text.info.model_name == family_mod.EMBEDDED_NAME  # type: ignore[attr-defined]
        # room for a voice turn beside a tool: a random Whisper's bounded transcript (128 of its tokens) in this
        # tokenizer's few hundred tokens, with a tool's schema and the reply's room
        babble = "".join(chr(c) for c in range(0x4E00, 0x4E00 + 400))  # what random multilingual tokens read as
        assert text.info.max_context >= engine.count_text_tokens(babble, ModelKind.TEXT) + 1024
        stream = engine.chat(chat("hi", max_tokens=6))
        async with stream:
            assert [o.chunk async for o in stream][-1].final
    assert (tmp_path / "checkpoints" / family_mod.EMBEDDED_NAME / family_mod.EMBEDDED_MARKER).exists()
