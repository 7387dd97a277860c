"""``session.truncation``: which conversation messages a response's prompt keeps, so it fits the text model.

Pure policy over token counts (the driver counts each message with the text model's tokenizer, off the event
loop, and asks :func:`fit` which to keep):

- ``auto`` (default): everything when it fits; else the oldest messages leave the prompt one by one until it does.
- ``retention_ratio`` r (0..1): when the prompt does not fit, the oldest messages leave until the conversation
  after the instructions takes at most r of the room it has (so a long conversation is cut back in one go, and
  the following turns reuse the same prefix instead of shifting it every turn).
- ``disabled``: a prompt that does not fit fails the response (``context_length_exceeded``).

Always kept: the instructions (the leading system message) and the newest message (the turn being answered). A
response fails only when those two and the room for the reply do not fit. Room for the reply: the response's
``max_output_tokens``, else :data:`REPLY_ROOM` (at most a quarter of the context). Each message costs its text's
tokens plus :data:`MESSAGE_TOKENS` for the chat template's markers, and the prompt :data:`PROMPT_TOKENS` more (the
generation prompt): estimates on the safe side, so a kept prompt fits the model's own exact check.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from omni_stream.requests import ChatMessage, Role

MESSAGE_TOKENS = 8  # role and end markers of one message under a chat template (Qwen3: 5, Llama 3: 5)
PROMPT_TOKENS = 16  # the generation prompt and a margin (Qwen3's empty thinking block is 6)
REPLY_ROOM = 256  # tokens kept for a reply without max_output_tokens (at most a quarter of the context)
# A bound on a text's tokens without tokenizing it (:func:`token_bound`): a token of any tokenizer that covers bytes
# (byte-level BPE, byte fallback) or maps what it does not know to one token spans at least one byte of the
# normalized text, and Unicode normalization grows UTF-8 text at most 11-fold (NFKC's worst character, U+FDFA);
# the margin covers a dummy prefix space and the special tokens a tokenizer adds around a text.
NORMALIZED_GROWTH = 11
TOKEN_BOUND_MARGIN = 8


class TruncationType(StrEnum):
    AUTO = "auto"
    DISABLED = "disabled"
    RETENTION_RATIO = "retention_ratio"


@dataclass(slots=True, frozen=True)
class Truncation:
    type: TruncationType = TruncationType.AUTO
    retention_ratio: float = 1.0

    def wire(self) -> Any:
        if self.type is TruncationType.RETENTION_RATIO:
            return {"type": "retention_ratio", "retention_ratio": self.retention_ratio}
        return self.type.value


class ContextExceeded(Exception):
    """The prompt cannot fit: the message says how much room the kept messages need and the context offers."""


def reply_room(max_tokens: int | None, context: int) -> int:
    return max_tokens if max_tokens is not None else min(REPLY_ROOM, context // 4)


def token_bound(text: str) -> int:
    """At least as many tokens as ``text`` has under any tokenizer (see :data:`NORMALIZED_GROWTH`), without
    tokenizing: a prompt that fits with these bounds fits with the exact counts."""
    return NORMALIZED_GROWTH * len(text.encode("utf-8", "surrogatepass")) + TOKEN_BOUND_MARGIN


def fits_whole(tokens: list[int], context: int, max_tokens: int | None, tools: int = 0) -> bool:
    """Whether every message fits (``tokens[i]``: message i's text tokens, or a bound on them), so :func:`fit`
    keeps them all."""
    room = reply_room(max_tokens, context - tools)
    return sum(t + MESSAGE_TOKENS for t in tokens) <= context - tools - room - PROMPT_TOKENS


def fit(
    messages: list[ChatMessage],
    tokens: list[int],
    context: int,
    max_tokens: int | None,
    truncation: Truncation,
    tools: int = 0,
) -> list[ChatMessage]:
    """The messages a prompt keeps (in order); ``tokens[i]``: the text tokens of ``messages[i]``; ``tools``: the
    tokens the offered tools' schemas take of the context."""
    if not messages:
        return messages
    cost = [t + MESSAGE_TOKENS for t in tokens]
    room = reply_room(max_tokens, context - tools)  # a quarter of what the tools leave, as before they were apart
    budget = context - tools - room - PROMPT_TOKENS
    fixed = cost[0] if messages[0].role is Role.SYSTEM and len(messages) > 1 else 0
    first = 1 if fixed else 0  # the first droppable message
    if fits_whole(tokens, context, max_tokens, tools):
        return messages
    newest = cost[-1]
    if fixed + newest > budget or truncation.type is TruncationType.DISABLED:
        need = sum(cost) if truncation.type is TruncationType.DISABLED else fixed + newest
        raise ContextExceeded(
            f"the prompt ({need + PROMPT_TOKENS} tokens with the instructions"
            f"{'' if truncation.type is TruncationType.DISABLED else ' and the newest turn alone'}) and the reply's "
            f"{room} tokens do not fit the text model's context of {context} tokens"
            + (f", {tools} of which the tools' schemas take" if tools else "")
            + (" (session.truncation is disabled)" if truncation.type is TruncationType.DISABLED else "")
        )
    limit = budget - fixed
    if truncation.type is TruncationType.RETENTION_RATIO:
        limit = max(newest, int(limit * truncation.retention_ratio))
    kept = sum(cost[first:])
    drop = first
    while kept > limit and drop < len(messages) - 1:
        kept -= cost[drop]
        drop += 1
    return messages[:first] + messages[drop:]
