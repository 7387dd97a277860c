"""Tokenizers built offline for tiny and dummy checkpoints (real checkpoints ship their own files).

The CLIP tokenizer is byte-level with no merges: every byte is a token, so any prompt encodes, ids stay below
514 and fit any CLIP text encoder's vocabulary. The Qwen2 tokenizer is a small byte-level BPE with the special
tokens Qwen-Image-Edit's prompt template and processor use, at the ids :data:`QWEN_SPECIALS` order gives them.
"""

from __future__ import annotations

from typing import Any

QWEN_SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# Text the BPE is trained on: the edit template's system prompt, so that it tokenizes into whole words.
_QWEN_CORPUS = (
    "Describe the key features of the input image (color, shape, size, texture, objects, background), then explain "
    "how the user's text instruction should alter or modify the image. Generate a new image that meets the user's "
    "requirements while maintaining consistency with the original input where appropriate. system user assistant "
    "make it snowy winter summer night day a photo of a cat dog red green blue"
)


def clip_tokenizer(model_max_length: int = 77) -> Any:
    """A byte-level CLIP tokenizer (``<|startoftext|>`` = 0, ``<|endoftext|>`` = 1, 514 tokens)."""
    from transformers import CLIPTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    chars = list(bytes_to_unicode().values())
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for suffix in ("", "</w>"):
        for char in chars:
            vocab.setdefault(char + suffix, len(vocab))
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=model_max_length)


def qwen_tokenizer(vocab_size: int = 400) -> Any:
    """A byte-level BPE ``Qwen2Tokenizer`` with :data:`QWEN_SPECIALS` at ids 0-6."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(QWEN_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([_QWEN_CORPUS] * 4, trainer)
    merges = [
        tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in json.loads(bpe.to_str())["model"]["merges"]
    ]
    tokenizer = Qwen2Tokenizer(vocab=bpe.get_vocab(), merges=merges)  # type: ignore[arg-type]  # pairs work
    tokenizer.add_tokens(list(QWEN_SPECIALS), special_tokens=True)
    return tokenizer
