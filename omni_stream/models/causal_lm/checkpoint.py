"""Random-weight causal-LM checkpoints in the hub layout, built offline (tests, the embedded default, benchmarks).

``omni-stream make-checkpoint --tiny --kind chat OUT`` writes a tiny Qwen3 (``--kind chat-llama``: a tiny Llama
with llama3 rotary scaling and an untied head): ``config.json``, ``generation_config.json``, ``model.safetensors``
and a byte-level BPE tokenizer trained here with ``tokenizers`` on a few sentences (every byte is a token, so any
UTF-8 text encodes, and characters of several bytes are often split across tokens), with the architecture's chat
template (ChatML for Qwen3, the Llama 3 header format for Llama) and special tokens.
``--from-config DIR`` writes random weights at the sizes of ``DIR/config.json`` (Qwen3 or Llama) with a tokenizer of
the full vocabulary: the trained tokens, fillers up to the real first special id (``bos_token_id``), the special
tokens at their real ids and reserved ones up to ``vocab_size``, so every id the model can sample decodes.
transformers reads every checkpoint written here (``AutoModelForCausalLM``, ``AutoTokenizer``).
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from omni_stream.errors import ConfigError
from omni_stream.models.causal_lm.config import ARCHITECTURES, parse_config
from omni_stream.models.causal_lm.model import build_lm
from omni_stream.runtime.weights import init_dummy, parse_dtype

KIND_ARCH = {"chat": "qwen3", "chat-llama": "llama"}

CORPUS = (
    "Hello world, this is a tiny chat model.",
    "The quick brown fox jumps over the lazy dog.",
    "How are you today? I am fine, thank you! What about you?",
    "Streaming text arrives token by token, one delta at a time.",
    "Café, naïve, über, señor: déjà vu.",
    "日本語のテキスト、中文文本。",
    "Emoji too 🎉🙂👍.",
    "Numbers 0 1 2 3 4 5 6 7 8 9 and 3.50 dollars.",
)
TRAIN_VOCAB = 640  # an upper bound: the corpus yields fewer merges

# Chat templates in each architecture's format, tools included. Qwen3's (Hermes style): the tools as JSON lines
# in <tools></tools> in the system turn, each call as <tool_call>{"name", "arguments"}</tool_call>, tool results
# as <tool_response> blocks in a user turn. Llama 3's JSON tool calling: the tools in the system turn, a call as
# the whole reply {"name", "parameters"} (several joined by "; "), results in "ipython" turns. Without tools
# both render plain ChatML / Llama 3 headers.
_QWEN_TOOLS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\nFor each function call, return a json "
    "object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
CHATML = (
    "{% set first = 0 %}"
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% set first = 1 %}{% endif %}"
    + _QWEN_TOOLS
    + "<|im_end|>\n{% endif %}"
    "{% for message in messages[first:] %}"
    "{% if message['role'] == 'assistant' %}<|im_start|>assistant\n{{ message['content'] or '' }}"
    "{% for call in message['tool_calls'] or [] %}"
    "{% if not loop.first or message['content'] %}\n{% endif %}"
    '<tool_call>\n{"name": "{{ call[\'function\'][\'name\'] }}", "arguments": '
    "{{ call['function']['arguments'] | tojson }}}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or loop.previtem['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ message['content'] }}\n</tool_response>"
    "{% if loop.last or loop.nextitem['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_LLAMA_TOOLS = (
    "You have access to the following functions. To call a function, respond with a JSON object of the form "
    '{"name": function name, "parameters": dictionary of argument name and its value}, and nothing else.\n\n'
    "{% for tool in tools %}{{ tool | tojson }}\n\n{% endfor %}"
)
LLAMA3 = (
    "{{ bos_token }}{% set first = 0 %}"
    "{% if tools %}<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n\n"
    + _LLAMA_TOOLS
    + "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] | trim }}{% set first = 1 %}{% endif %}"
    "<|eot_id|>{% endif %}"
    "{% for message in messages[first:] %}"
    "{% if message['role'] == 'assistant' and message['tool_calls'] %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{% for call in message['tool_calls'] %}{% if not loop.first %}; {% endif %}"
    "{\"name\": \"{{ call['function']['name'] }}\", \"parameters\": {{ call['function']['arguments'] | tojson }}}"
    "{% endfor %}<|eot_id|>"
    "{% elif message['role'] == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>"
    "{% else %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def _keep_newlines(template: str) -> str:
    """transformers renders templates with ``trim_blocks``, which drops the newline right after a block tag: write
    those newlines as expressions."""
    return template.replace("%}\n", '%}{{ "\\n" }}')


CHATML, LLAMA3 = _keep_newlines(CHATML), _keep_newlines(LLAMA3)
# Qwen3's tags around calls and results are tokens of their own that are not special: they survive decoding
# with special tokens skipped, so the text of a reply shows its calls.
TAG_TOKENS = {"qwen3": ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"), "llama": ()}
# Special tokens from the first special id on, in id order (the real layouts of Qwen3 and Llama 3).
SPECIALS = {
    "qwen3": ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    "llama": (
        "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
        "<|eom_id|>", "<|eot_id|>",
    ),
}  # fmt: skip
TINY = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, max_position_embeddings=1024, rope_theta=10000.0, hidden_act="silu", attention_bias=False,
)  # fmt: skip


# -- tokenizer -----------------------------------------------------------------------------------------------


def build_tokenizer(arch: str, first_special: int | None = None, vocab_size: int | None = None) -> Any:
    """A ``PreTrainedTokenizerFast``: byte-level BPE trained on :data:`CORPUS`, the chat template and specials.

    ``first_special``: id of the first special token (fillers ``<unused_N>`` pad the regular vocabulary up to it;
    None: right after the trained tokens); ``vocab_size``: reserved special tokens fill the ids up to it.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TRAIN_VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    trained.train_from_iterator(CORPUS, trainer)
    model = json.loads(trained.to_str())["model"]
    vocab: dict[str, int] = dict(model["vocab"])
    pairs = [m.split(" ") if isinstance(m, str) else m for m in model["merges"]]
    merges = [(str(a), str(b)) for a, b in pairs]
    regular = len(vocab) if first_special is None else first_special
    if regular < len(vocab):
        raise ConfigError(f"the first special id ({first_special}) leaves no room for {len(vocab)} regular tokens")
    for i in range(len(vocab), regular):
        vocab[f"<unused_{i}>"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    specials = list(SPECIALS[arch])
    if vocab_size is not None:
        names = (f"<|reserved_special_token_{i}|>" for i in range(vocab_size))
        room = vocab_size - regular - len(specials) - len(TAG_TOKENS[arch])
        specials += [n for n in names if n not in specials][:room]
    tags = TAG_TOKENS[arch]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in tags])
    if arch == "llama":
        bos = "<|begin_of_text|>"
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, regular)]
        )
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token=bos, eos_token="<|eot_id|>", clean_up_tokenization_spaces=False
        )
        fast.chat_template = LLAMA3
    else:
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", clean_up_tokenization_spaces=False
        )
        fast.chat_template = CHATML
    return fast


def _special_ids(arch: str, first: int) -> dict[str, int]:
    return {name: first + i for i, name in enumerate(SPECIALS[arch])}


def generation_config(arch: str, first_special: int) -> dict[str, Any]:
    """The released models' generation defaults, at this tokenizer's special ids."""
    ids = _special_ids(arch, first_special)
    if arch == "llama":
        eos = [ids["<|end_of_text|>"], ids["<|eom_id|>"], ids["<|eot_id|>"]]
        return {"bos_token_id": ids["<|begin_of_text|>"], "eos_token_id": eos, "do_sample": True,
                "temperature": 0.6, "top_p": 0.9}  # fmt: skip
    end = ids["<|endoftext|>"]
    return {"bos_token_id": end, "eos_token_id": [ids["<|im_end|>"], end], "pad_token_id": end, "do_sample": True,
            "temperature": 0.6, "top_k": 20, "top_p": 0.95}  # fmt: skip


# -- config and weights --------------------------------------------------------------------------------------


def tiny_config(
    arch: str, vocab_size: int, first_special: int, head_dim: int | None = None, positions: int | None = None
) -> dict[str, Any]:
    """A tiny hub ``config.json`` (legacy rotary keys, which transformers 4 and 5 both read); ``head_dim`` and
    ``positions`` (``max_position_embeddings``) None: :data:`TINY`'s."""
    ids = _special_ids(arch, first_special)
    cfg: dict[str, Any] = dict(TINY, vocab_size=vocab_size, torch_dtype="float32")
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    if positions is not None:
        cfg["max_position_embeddings"] = positions
    if arch == "llama":
        # llama3 scaling with a short original context, so every branch of the frequency rule is exercised.
        scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 128}  # fmt: skip
        cfg.update(architectures=["LlamaForCausalLM"], model_type="llama", rms_norm_eps=1e-5, rope_scaling=scaling,
                   tie_word_embeddings=False, mlp_bias=False, bos_token_id=ids["<|begin_of_text|>"],
                   eos_token_id=ids["<|eot_id|>"])  # fmt: skip
    else:
        cfg.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3", rms_norm_eps=1e-6, rope_scaling=None,
                   tie_word_embeddings=True, use_sliding_window=False, sliding_window=None, max_window_layers=2,
                   bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"])  # fmt: skip
    return cfg


def random_state(cfg_dict: Mapping[str, Any], *, dtype: torch.dtype, seed: int, tiny: bool) -> dict[str, torch.Tensor]:
    """Random weights for ``cfg_dict`` (tiny: jittered norms, so the output depends on every layer)."""
    lm = build_lm(parse_config(cfg_dict), "meta")
    init_dummy(lm, seed=seed, dtype=dtype, norm_jitter=0.1 if tiny else 0.0)
    return {k: v.contiguous() for k, v in lm.state_dict().items()}


def write_weights(out: Path, state: dict[str, torch.Tensor], shards: int = 1) -> None:
    """``model.safetensors``, or ``shards`` files ``model-0000i-of-0000n.safetensors`` plus the index."""
    meta = {"format": "pt"}
    if shards <= 1:
        save_file(state, str(out / "model.safetensors"), metadata=meta)
        return
    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        part = names[i::shards]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: state[k] for k in part}, str(out / file), metadata=meta)
        weight_map.update(dict.fromkeys(part, file))
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def write_tiny_checkpoint(
    out: str | Path,
    arch: str = "qwen3",
    *,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    shards: int = 1,
    head_dim: int | None = None,
    positions: int | None = None,
) -> Path:
    """A tiny random ``arch`` chat checkpoint in the hub layout; returns its directory. ``head_dim`` None: 16
    (vLLM's CPU attention needs 32 or more); ``positions`` None: 1024."""
    if arch not in ARCHITECTURES:
        raise ConfigError(f"arch must be one of {ARCHITECTURES}, got {arch!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(arch)
    first = tok.convert_tokens_to_ids(SPECIALS[arch][0])
    cfg = tiny_config(arch, len(tok), first, head_dim, positions)
    if dtype != torch.float32:
        cfg["torch_dtype"] = "bfloat16"
    tok.save_pretrained(str(out))
    _write_json(out / "config.json", cfg)
    _write_json(out / "generation_config.json", generation_config(arch, first))
    write_weights(out, random_state(cfg, dtype=dtype, seed=seed, tiny=True), shards)
    return out


def write_dummy_checkpoint(
    config_dir: str | Path, out: str | Path, *, dtype: torch.dtype = torch.bfloat16, seed: int = 0, weights: bool = True
) -> Path:
    """Random weights at the sizes of ``config_dir/config.json``, a full-vocabulary tokenizer, the generation config
    of ``config_dir`` (else the architecture's). ``weights=False`` writes no weight file (``load_format="dummy"``)."""
    src = Path(config_dir)
    cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    arch = parse_config(cfg).model_type
    first = cfg.get("bos_token_id")
    if not isinstance(first, int):
        raise ConfigError(f"{src / 'config.json'}: bos_token_id (the first special id) is needed to lay out tokens")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(arch, first_special=first, vocab_size=int(cfg["vocab_size"])).save_pretrained(str(out))
    _write_json(out / "config.json", cfg)
    if (src / "generation_config.json").exists():
        shutil.copyfile(src / "generation_config.json", out / "generation_config.json")
    else:
        _write_json(out / "generation_config.json", generation_config(arch, first))
    if weights:
        write_weights(out, random_state(cfg, dtype=dtype, seed=seed, tiny=False))
    return out


def make(args: argparse.Namespace) -> Path:
    """``make-checkpoint`` for the text kinds (``omni_stream.make_checkpoint``)."""
    dtype = parse_dtype(args.dtype, "cpu")
    if args.tiny:
        return write_tiny_checkpoint(args.out, KIND_ARCH[args.kind], dtype=dtype, seed=args.seed)
    return write_dummy_checkpoint(args.from_config, args.out, dtype=dtype, seed=args.seed)
