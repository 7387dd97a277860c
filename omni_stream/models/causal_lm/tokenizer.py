"""The checkpoint's tokenizer and chat template (transformers' tokenizers), as plain blocking functions.

Prompts are built and tokenized off the event loop (the family calls these through ``anyio.to_thread``);
decoding runs on the device worker, through the Rust ``tokenizers`` object directly where there is one
(no per-call Python clean-up: deltas join to ``decode(ids, skip_special_tokens=True)`` with
``clean_up_tokenization_spaces=False``, which is what the checkpoints we write declare).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omni_stream.errors import ConfigError, InvalidRequestError
from omni_stream.requests import ChatMessage, Role, TextRequest
from omni_stream.text.chat_template import template_messages, template_tools


def byte_level_chars() -> dict[int, str]:
    """Byte-level BPE's character for each byte (GPT-2's table, which its successors keep): printable Latin-1 bytes
    stand for themselves, the other 68 for the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


class ChatTokenizer:
    """``encode`` a request (chat template or raw prompt), ``decode`` ids, ``count`` text tokens."""

    def __init__(self, model_dir: str | Path) -> None:
        # With a tokenizer.json (every fast-tokenizer checkpoint) the tokenizers-backed class reads it directly;
        # AutoTokenizer resolves the class through every model config and costs seconds at each server start.
        if (Path(model_dir) / "tokenizer.json").exists():
            from transformers import PreTrainedTokenizerFast as Tokenizer
        else:
            from transformers import AutoTokenizer as Tokenizer  # type: ignore[assignment]
        try:
            self._tok = Tokenizer.from_pretrained(str(model_dir))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot load the tokenizer of {model_dir}: {exc}") from exc
        backend = getattr(self._tok, "backend_tokenizer", None)
        self._backend = backend if hasattr(backend, "decode") else None
        self._byte_of: dict[str, int] | None = None  # byte-level BPE: each character of a token stands for a byte
        if self._backend is not None and type(getattr(self._backend, "decoder", None)).__name__ == "ByteLevel":
            self._byte_of = {char: byte for byte, char in byte_level_chars().items()}
        self._special = frozenset(int(i) for i in self._tok.all_special_ids)
        self.has_chat_template = bool(getattr(self._tok, "chat_template", None))
        if self.has_chat_template:
            # The template compiles on its first use (9 ms against 0.3 on a 2-core CPU): here, at load, not in the
            # first request's prompt (a voice agent's first answer after start)
            with contextlib.suppress(InvalidRequestError):  # compiled even where it refuses a lone user message
                self.encode(TextRequest(messages=(ChatMessage(Role.USER, "Hello."),)))

    @property
    def hf(self) -> Any:
        """The transformers tokenizer (constrained decoding builds its token tables from it)."""
        return self._tok

    def is_token(self, text: str) -> bool:
        """Whether ``text`` is one token of the vocabulary (an added tag such as ``<tool_call>``, say)."""
        ids = self._tok(text, add_special_tokens=False)["input_ids"]
        return len(ids) == 1 and self._tok.convert_ids_to_tokens(ids[0]) == text

    def __len__(self) -> int:
        return len(self._tok)

    def encode(self, request: TextRequest) -> list[int]:
        """Prompt ids of ``request``: its messages (and offered tools) through the chat template, with the
        generation prompt, or the raw prompt with the tokenizer's special tokens (e.g. BOS)."""
        if request.prompt is not None:
            return list(self._tok(request.prompt)["input_ids"])
        if not self.has_chat_template:
            raise InvalidRequestError("this model has no chat template: send a raw prompt instead", "messages")
        try:
            out: Any = self._tok.apply_chat_template(
                template_messages(request), tools=template_tools(request), add_generation_prompt=True, tokenize=True
            )
        except Exception as exc:  # jinja errors: the template rejects this conversation (e.g. role order)
            raise InvalidRequestError(f"the model's chat template rejects these messages: {exc}", "messages") from exc
        ids = out["input_ids"] if isinstance(out, Mapping) or hasattr(out, "keys") else out
        return [int(i) for i in ids]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens skipped (thread-safe; runs on the device worker)."""
        if self._backend is not None:
            return str(self._backend.decode(list(ids), skip_special_tokens=True))
        return str(self._tok.decode(list(ids), skip_special_tokens=True))

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (a logprob entry's ``bytes``): a byte-level BPE token's characters mapped
        back to their bytes, a SentencePiece byte token ``<0xNN>`` its byte; else (special tokens, whose text is
        skipped, among them) the UTF-8 of its decoded text. A token inside a character has bytes but no text."""
        piece = self._tok.convert_ids_to_tokens(int(token_id))
        if isinstance(piece, str) and token_id not in self._special:
            if self._byte_of is not None and all(char in self._byte_of for char in piece):
                return bytes(self._byte_of[char] for char in piece)
            if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                with contextlib.suppress(ValueError):
                    return bytes.fromhex(piece[3:5])
        return self.decode([token_id]).encode("utf-8")

    def count(self, text: str) -> int:
        """Tokens of ``text`` alone (no special tokens)."""
        return len(self._tok(text, add_special_tokens=False)["input_ids"])
