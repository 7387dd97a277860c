"""Constrained decoding for the native text model: llguidance matchers over the checkpoint's tokenizer.

:class:`Grammars` builds one matcher per constrained request, off the event loop and off the device worker (the
family's prepare step): the grammar (:mod:`omni_stream.text.grammar`) is checked there, so a schema llguidance
cannot enforce is a 400 naming the field before anything streams. The runner asks :func:`fill_masks` for the
rows' next-token bitmasks (many rows at once, in llguidance's own threads, the GIL released) and feeds each
sampled token back (``LLMatcher.consume_token``).

The llguidance tokenizer (about a second of one core for a 150k-token vocabulary, milliseconds for the tiny ones)
is built in a thread of its own when the family loads, and shared by every request; one that comes sooner waits.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from omni_stream.errors import InvalidRequestError


def _llguidance() -> Any:
    import llguidance

    return llguidance


class Grammars:
    """Matchers for ``tokenizer`` (a transformers fast tokenizer) over a model of ``vocab_size`` logits."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self._hf = tokenizer
        self.vocab_size = vocab_size
        self._eos = list(eos_token_ids)
        self._tokenizer: Any = None
        self._lock = threading.Lock()
        # Built in the background from the start, so the first constrained request seldom waits for it.
        threading.Thread(target=self._lltokenizer, name="llguidance-tokenizer", daemon=True).start()

    def _lltokenizer(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                import llguidance.hf

                eos = [e for e in self._eos if e < self.vocab_size] or None
                self._tokenizer = llguidance.hf.from_tokenizer(self._hf, n_vocab=self.vocab_size, eos_token=eos)
            return self._tokenizer

    def matcher(self, lark: str, field: str) -> Any:
        """A fresh ``LLMatcher`` for the Lark grammar ``lark``; InvalidRequestError naming ``field`` when llguidance
        cannot build it (an unsupported or contradictory schema). Blocking: call it off the loop."""
        llg = _llguidance()
        try:
            grammar = llg.LLMatcher.grammar_from_lark(lark)
        except UnicodeEncodeError:  # a lone surrogate in a schema (a Python caller's; JSON readers refuse them)
            raise InvalidRequestError("the schema holds text that is not valid Unicode", field) from None
        tokenizer = self._lltokenizer()
        error = llg.LLMatcher.validate_grammar(grammar, tokenizer)
        if error:
            first = error.strip().splitlines()[0]
            raise InvalidRequestError(f"the schema cannot be enforced: {first}", field)
        matcher = llg.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidRequestError(f"the schema cannot be enforced: {matcher.get_error()}", field)
        if self._ends_before_it_begins(matcher):
            raise InvalidRequestError("the schema admits no value (a $ref that only refers to itself?)", field)
        return matcher

    def _ends_before_it_begins(self, matcher: Any) -> bool:
        """Whether a fresh matcher allows nothing but EOS though its grammar is not yet matched: llguidance's answer
        for a grammar with no string at all, which would end a forced call or a JSON reply empty, as if complete."""
        if matcher.is_accepting():
            return False
        words = torch.zeros((self.vocab_size + 31) // 32, dtype=torch.int32)
        matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * 4)
        allowed = np.flatnonzero(np.unpackbits(words.numpy().view(np.uint8), bitorder="little")[: self.vocab_size])
        return set(allowed.tolist()) <= set(self._eos)


_executor: Any = None
_executor_lock = threading.Lock()


def executor() -> Any:
    """llguidance's thread pool for masks of many rows (at most 4 threads, one core left to the rest)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = _llguidance().LLExecutor(num_threads=max(1, min(4, (os.cpu_count() or 2) - 1)))
        return _executor


def fill_masks(matchers: Sequence[tuple[Any, int]], bitmask: torch.Tensor) -> None:
    """Write each matcher's next-token bitmask into its row of ``bitmask`` (CPU int32 ``[S, W]``, contiguous)."""
    if not matchers:
        return
    if len(matchers) == 1:
        matcher, row = matchers[0]
        words = bitmask[row]
        matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * 4)
        return
    executor().unsafe_compute_mask_ptr(list(matchers), bitmask.data_ptr(), bitmask.shape[1] * 4, bitmask.shape[0])
