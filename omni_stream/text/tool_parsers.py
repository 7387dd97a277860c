"""Tool calls in a model's own output format, parsed as the text streams (pure; no model, no I/O).

Formats (what the chat templates of :mod:`omni_stream.models.causal_lm.checkpoint`, and the released models,
teach):

- :attr:`ToolFormat.HERMES` (Qwen3): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, any number,
  with free text around them. Text that could be the start of ``<tool_call>`` is held back until it is known
  not to be; a call is handed out whole when its closing tag arrives (or when the text ends).
- :attr:`ToolFormat.LLAMA_JSON` (Llama 3.1+ JSON tool calling): the whole reply is one call
  ``{"name": ..., "parameters": {...}}`` (or several joined by ``;``). A reply whose first non-blank character
  is ``{`` is held back to its end and parsed; any other reply is plain text, streamed as it comes.

Whatever does not parse as a call (bad JSON, no name) is given back as the text it was, so nothing the model
wrote is lost. With ``parallel`` False only a reply's first call is kept.
"""

from __future__ import annotations

import json
import secrets
from enum import StrEnum
from typing import Any

from omni_stream.text.tools import ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class ToolFormat(StrEnum):
    HERMES = "hermes"
    LLAMA_JSON = "llama_json"


def call_id() -> str:
    """A fresh call id in OpenAI's form (``call_`` and 24 hex digits)."""
    return f"call_{secrets.token_hex(12)}"


def _call(body: Any, args_key: str) -> ToolCall | None:
    if not isinstance(body, dict) or not isinstance(body.get("name"), str) or not body["name"]:
        return None
    args = body.get(args_key, body.get("arguments", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(call_id(), body["name"], json.dumps(args, ensure_ascii=False))


def parse_hermes_call(text: str) -> ToolCall | None:
    """The call inside one ``<tool_call>`` block (its text between the tags), or None."""
    try:
        return _call(json.loads(text), "arguments")
    except ValueError:
        return None


def parse_llama_calls(text: str) -> list[ToolCall] | None:
    """The calls of a whole Llama JSON reply (objects joined by ``;``), or None when it is not calls."""
    decoder = json.JSONDecoder()
    calls, pos, text = [], 0, text.strip()
    while pos < len(text):
        try:
            body, end = decoder.raw_decode(text, pos)
        except ValueError:
            return None
        call = _call(body, "parameters")
        if call is None:
            return None
        calls.append(call)
        pos = end
        while pos < len(text) and text[pos] in " \t\r\n;":
            pos += 1
    return calls or None


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0


class ToolCallParser:
    """Text deltas in; (text to show, calls completed) out (see the module docstring)."""

    __slots__ = ("_after_call", "_buf", "_in_call", "_undecided", "calls", "cut_call", "format", "parallel")

    def __init__(self, format: ToolFormat, parallel: bool = True) -> None:
        self.format = format
        self.parallel = parallel
        self.calls = 0  # calls handed out so far
        # After finish(): the text of a call that never parsed (a Hermes call whose closing tag never came, a Llama
        # reply that began with "{" and is no call: the reply ran out of tokens inside it), the end of the text
        # finish() gave back; "" when there was none. A spoken reply never speaks it.
        self.cut_call = ""
        self._buf = ""
        self._in_call = False
        # a Hermes call just closed: the newline the template writes after it is no text of the reply, whichever
        # push it comes in (a model writes "</tool_call>" and "\n" as two tokens)
        self._after_call = False
        self._undecided = format is ToolFormat.LLAMA_JSON  # until the first non-blank character is seen

    def push(self, text: str) -> tuple[str, list[ToolCall]]:
        self._buf += text
        if self.format is ToolFormat.LLAMA_JSON:
            return self._push_llama()
        return self._push_hermes()

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The rest at the end of the text: a held-back tail, or a call whose closing tag never came."""
        buf, self._buf = self._buf, ""
        if self.format is ToolFormat.LLAMA_JSON:
            if not buf.strip():
                return buf, []
            if not buf.lstrip().startswith("{"):
                return buf, []
            calls = parse_llama_calls(buf)
            if calls:
                return "", self._keep(calls)
            self.cut_call = buf  # a reply that began as a call and never became one
            return buf, []
        if self._in_call:
            self._in_call = False
            call = parse_hermes_call(buf)
            if call is not None:
                return "", self._keep([call])
            self.cut_call = OPEN + buf
            return self.cut_call, []
        if self._after_call and buf.startswith("\n"):
            buf = buf[1:]
        self._after_call = False
        return buf, []

    def _keep(self, calls: list[ToolCall]) -> list[ToolCall]:
        if not self.parallel:
            calls = calls[: max(0, 1 - self.calls)]
        self.calls += len(calls)
        return calls

    def _push_llama(self) -> tuple[str, list[ToolCall]]:
        if self._undecided:
            if not self._buf.strip():
                return "", []
            self._undecided = False
            self._in_call = self._buf.lstrip().startswith("{")
        if self._in_call:
            return "", []  # a JSON reply: parsed whole at the end
        out, self._buf = self._buf, ""
        return out, []

    def _push_hermes(self) -> tuple[str, list[ToolCall]]:
        shown: list[str] = []
        calls: list[ToolCall] = []
        while True:
            if self._in_call:
                end = self._buf.find(CLOSE)
                if end < 0:
                    break
                body, self._buf = self._buf[:end], self._buf[end + len(CLOSE) :]
                self._in_call = False
                call = parse_hermes_call(body)
                if call is None:
                    shown.append(OPEN + body + CLOSE)
                else:
                    calls += self._keep([call])
                    self._after_call = True
                continue
            if self._after_call:  # the template's separator after a call, once it has come
                if not self._buf:
                    break
                self._after_call = False
                if self._buf.startswith("\n"):
                    self._buf = self._buf[1:]
                    continue
            start = self._buf.find(OPEN)
            if start < 0:
                keep = _partial_suffix(self._buf, OPEN)
                shown.append(self._buf[: len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep :]
                break
            shown.append(self._buf[:start])
            self._buf = self._buf[start + len(OPEN) :]
            self._in_call = True
        return "".join(shown), calls
