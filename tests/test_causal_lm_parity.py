"""Greedy fp32 tokens of the native Qwen3 and Llama equal transformers' ``generate()`` on the same directory."""

from __future__ import annotations

import pytest
import torch
import transformers
from lm_helpers import drive, load_tiny, tiny_lm_checkpoint

from omni_stream.models.causal_lm.checkpoint import random_state, tiny_config, write_weights
from omni_stream.models.causal_lm.config import load_config
from omni_stream.models.causal_lm.runner import LMRequest
from omni_stream.requests import GREEDY, ChatMessage, Role, SamplingParams, TextRequest

PROMPTS = ("Hello there, how are you?", "Café 🎉 日本語", "The quick brown fox jumps over the lazy dog. " * 3)


def reference(path, ids: list[int], n: int, **kw) -> list[int]:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0, **kw)
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
async def test_greedy_tokens_equal_transformers_generate(tmp_path_factory, arch):
    path = tiny_lm_checkpoint(tmp_path_factory, arch)
    lm = load_tiny(path)
    runner = lm.runner(slots=2, max_len=256)
    for text in PROMPTS:
        request = lm.request(text, max_tokens=40, sampling=GREEDY, ignore_eos=True)
        (run,) = await drive(runner, [request])
        assert run.tokens == reference(path, list(request.prompt_ids), 40, eos_token_id=None), text
        assert len(set(run.tokens)) > 1  # the comparison is not of one repeated token
        assert run.text == lm.tokenizer.decode(run.tokens) and run.finish_reason == "length"


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
async def test_repetition_penalty_follows_transformers(tmp_path_factory, arch):
    path = tiny_lm_checkpoint(tmp_path_factory, arch)
    lm = load_tiny(path)
    penalized = SamplingParams(do_sample=False, temperature=1.0, top_k=0, repetition_penalty=1.3)
    request = lm.request(PROMPTS[0], max_tokens=40, sampling=penalized, ignore_eos=True)
    (run,) = await drive(lm.runner(slots=1), [request])
    assert run.tokens == reference(path, list(request.prompt_ids), 40, repetition_penalty=1.3, eos_token_id=None)


async def test_generation_ends_at_the_eos_of_generation_config_where_transformers_does(tmp_path_factory):
    path = tiny_lm_checkpoint(tmp_path_factory, "llama")
    lm = load_tiny(path)
    request = lm.request(PROMPTS[0], max_tokens=60, sampling=GREEDY)
    (run,) = await drive(lm.runner(slots=1), [request])
    assert run.tokens == reference(path, list(request.prompt_ids), 60)  # transformers reads the same EOS ids
    assert len(run.tokens) < 60 and run.tokens[-1] in lm.eos and run.finish_reason == "stop"
    assert run.text == lm.tokenizer.decode(run.tokens)  # the EOS id adds no text


def test_raw_prompts_get_the_tokenizers_special_tokens(tmp_path_factory):
    path = tiny_lm_checkpoint(tmp_path_factory, "llama")
    llama, bos = load_tiny(path), load_config(path).bos_token_id
    ids = llama.tokenizer.encode(TextRequest(prompt="Hello"))
    assert ids[0] == bos and llama.tokenizer.decode(ids) == "Hello"  # <|begin_of_text|> first, skipped in text
    chat = llama.tokenizer.encode(TextRequest(messages=(ChatMessage(Role.USER, "Hello"),)))
    assert chat[0] == bos and chat.count(bos) == 1  # the template's BOS, not a second one from the tokenizer


async def test_a_sharded_checkpoint_loads_to_the_same_tokens(tmp_path_factory, tmp_path):
    path = tiny_lm_checkpoint(tmp_path_factory, "qwen3")
    lm = load_tiny(path)
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "chat_template.jinja"):  # fmt: skip
        (sharded / name).write_bytes((path / name).read_bytes())
    first = lm.tokenizer.encode(TextRequest(prompt="<|endoftext|>"))[0]
    write_weights(sharded, random_state(tiny_config("qwen3", len(lm.tokenizer), first), dtype=torch.float32,
                                        seed=0, tiny=True), shards=3)  # fmt: skip
    assert len(list(sharded.glob("model-*-of-00003.safetensors"))) == 3
    request = lm.request(PROMPTS[1], max_tokens=12, sampling=GREEDY, ignore_eos=True)
    (whole,) = await drive(lm.runner(slots=1), [request])
    (parts,) = await drive(load_tiny(sharded).runner(slots=1), [LMRequest(request.prompt_ids, 12, GREEDY,
                                                                         ignore_eos=True)])  # fmt: skip
    assert parts.tokens == whole.tokens == reference(sharded, list(request.prompt_ids), 12, eos_token_id=None)
