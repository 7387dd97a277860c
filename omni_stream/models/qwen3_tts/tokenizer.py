"""Text tokenizer: the checkpoint's Qwen2 byte-level BPE (``vocab.json``, ``merges.txt``, ``tokenizer_config.json``).

Plain blocking functions: callers run them off the event loop.
"""

from __future__ import annotations

from pathlib import Path

from omni_stream.errors import ConfigError


class TextTokenizer:
    """Qwen2 tokenizer loaded from a checkpoint directory; ids are checked against the text vocabulary size."""

    def __init__(self, model_dir: str | Path, text_vocab_size: int | None = None) -> None:
        import transformers

        d = Path(model_dir)
        for name in ("vocab.json", "merges.txt"):
            if not (d / name).exists():
                raise ConfigError(f"tokenizer file {name} not found in {d}")
        # transformers 5 has one (tokenizers-backed) Qwen2Tokenizer; 4.x calls that class Qwen2TokenizerFast.
        cls = getattr(transformers, "Qwen2TokenizerFast", None) or transformers.Qwen2Tokenizer
        self._tok = cls.from_pretrained(str(d))
        self.text_vocab_size = text_vocab_size

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special tokens such as ``<|im_start|>`` written literally are recognised)."""
        ids = list(self._tok(text)["input_ids"])
        if self.text_vocab_size is not None and any(i >= self.text_vocab_size for i in ids):
            raise ConfigError(f"tokenizer produced ids outside the text vocabulary ({self.text_vocab_size})")
        return ids

    def count(self, text: str) -> int:
        """Number of tokens in ``text``."""
        return len(self._tok(text)["input_ids"])
