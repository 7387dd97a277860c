"""A tiny random-weight Qwen3 chat checkpoint in hub layout, built offline (for the text-backend tests).

Byte-level BPE trained in code on a few sentences (specials ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``),
a ChatML chat template, ``Qwen3ForCausalLM`` with hidden 64, 2 layers, 4 heads / 2 KV heads of 32 (vLLM's CPU
attention has no smaller head size), tied embeddings, weights drawn with std 0.5 so that greedy decoding wanders
instead of repeating one token (about 0.1 M parameters, 0.5 MB on disk). ``eos_token_id`` is ``<|im_end|>``, one of
320 tokens: sampled generations rarely stop early; tests that need ``max_tokens`` tokens set ``ignore_eos``.
"""

from __future__ import annotations

import json
from pathlib import Path

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "Hello there! How are you today? I am fine, thank you.",
    "The quick brown fox jumps over the lazy dog.",
    "Streaming text deltas join to the full reply, one token at a time.",
    "Ünïcødé wörds, 数字 and emoji 🙂 must never break a character.",
]
MAX_CONTEXT = 512


def write_tiny_chat_checkpoint(path: str | Path, *, seed: int = 0, max_context: int = MAX_CONTEXT) -> Path:
    """Write the checkpoint into ``path`` (created) and return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(CORPUS, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHATML
    tok.save_pretrained(path)

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # vLLM CPU attention supports 32, 64, 80, ... only
        max_position_embeddings=max_context,
        tie_word_embeddings=True,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=None,
        torch_dtype="float32",
        initializer_range=0.5,  # spread the random logits: greedy output varies instead of repeating one token
    )
    model = Qwen3ForCausalLM(config)
    model.save_pretrained(path)
    # Random weights: no sampling defaults of a trained model; greedy unless a request says otherwise.
    (path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": config.eos_token_id, "pad_token_id": config.pad_token_id}) + "\n"
    )
    return path
