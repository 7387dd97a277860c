"""What every text-generation backend (native, vLLM in process, a remote OpenAI-compatible server) must do.

Plain async functions over a :class:`TextBackend`: an engine whose text model is the backend under test, a way to
wait until the backend has acted on every abort so far, and a count of the requests it still holds. A backend's
test module builds one and runs :data:`CHECKS` (or :func:`run_contract`). The checks use greedy decoding and
``ignore_eos`` where they need a known length, and read only what every backend gives: streamed
:class:`TextDelta` chunks of the ``text`` stage, ``usage["text"]``, and errors raised before anything streams.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from omni_stream.chunks import TextDelta
from omni_stream.engine import AsyncEngine, Usage
from omni_stream.errors import InvalidRequestError, RequestCancelled
from omni_stream.requests import GREEDY, ChatMessage, Role, SamplingParams, TextRequest

PROMPT = "Hello there! Tell me a story about a quick brown fox."


@dataclass(slots=True, frozen=True)
class TextBackend:
    """The engine under test; ``settle()`` returns once the backend has acted on every abort so far;
    ``live()`` counts the requests (slots, sequences) it still holds."""

    engine: AsyncEngine
    settle: Callable[[], Awaitable[None]]
    live: Callable[[], int]

    @property
    def max_context(self) -> int:
        return self.engine.models.text().info.max_context


@dataclass(slots=True)
class Reply:
    deltas: list[TextDelta]
    usage: Usage

    @property
    def text(self) -> str:
        return "".join(d.text for d in self.deltas)

    @property
    def finish_reason(self) -> str | None:
        return self.deltas[-1].finish_reason if self.deltas else None


def chat(text: str = PROMPT, **fields) -> TextRequest:
    return TextRequest(messages=(ChatMessage(Role.USER, text),), **fields)


async def reply(engine: AsyncEngine, request: TextRequest) -> Reply:
    """Stream ``request`` to its end; checks the shape every stream must have."""
    stream = engine.chat(request)
    deltas: list[TextDelta] = []
    async with stream:
        async for out in stream:
            assert out.stage == "text" and isinstance(out.chunk, TextDelta), out
            assert not deltas or not deltas[-1].final, "a delta after the final one"
            deltas.append(out.chunk)
            assert out.last == out.chunk.final
    assert deltas and deltas[-1].final and deltas[-1].finish_reason in ("stop", "length"), deltas[-1:]
    assert all(d.text for d in deltas[:-1]), "an empty delta before the final one"
    return Reply(deltas, stream.usage["text"])


async def expect_error_before_output(engine: AsyncEngine, request: TextRequest, param: str) -> InvalidRequestError:
    """``request`` fails with InvalidRequestError naming ``param``, at the call or the first read, before any delta."""
    try:
        stream = engine.chat(request)
    except InvalidRequestError as exc:
        assert exc.param == param, (exc.param, str(exc))
        return exc
    got = []
    with pytest.raises(InvalidRequestError) as info:
        async with stream:
            async for out in stream:
                got.append(out)
    assert got == [] and info.value.param == param, (got, info.value.param, str(info.value))
    return info.value


# --- the checks -----------------------------------------------------------------------------------------------


async def check_deltas_join_into_one_growing_reply(backend: TextBackend) -> None:
    """A longer greedy reply continues the shorter one: deltas are the reply's pieces, in order, none taken back."""
    short = await reply(backend.engine, chat(max_tokens=8, sampling=GREEDY, ignore_eos=True))
    long = await reply(backend.engine, chat(max_tokens=24, sampling=GREEDY, ignore_eos=True))
    # only the short reply's last character may differ: bytes of an unfinished character end it as U+FFFD
    assert long.text.startswith(short.text.rstrip("\ufffd")), (short.text, long.text)
    assert len(long.text) >= len(short.text.rstrip("\ufffd"))


async def check_usage_counts_tokens(backend: TextBackend) -> None:
    """``ignore_eos`` + ``max_tokens=N``: exactly N output tokens, finish ``length``; a longer prompt counts more."""
    a = await reply(backend.engine, chat(max_tokens=7, sampling=GREEDY, ignore_eos=True))
    b = await reply(backend.engine, chat(PROMPT + " Make it a long one, with a twist.", max_tokens=3, ignore_eos=True))
    assert a.usage.output_tokens == 7 and a.finish_reason == "length"
    assert b.usage.output_tokens == 3 and b.finish_reason == "length"
    assert 0 < a.usage.input_tokens < b.usage.input_tokens
    assert a.usage.total_tokens == a.usage.input_tokens + 7


async def check_finish_reasons_length_and_stop(backend: TextBackend) -> None:
    """A stop string taken from the greedy reply ends the text just before its first occurrence, reason ``stop``."""
    full = await reply(backend.engine, chat(max_tokens=32, sampling=GREEDY, ignore_eos=True))
    text = full.text
    assert full.finish_reason == "length" and len(text) >= 6, text
    start = next((k for k in range(len(text) // 3, len(text) - 2) if "\ufffd" not in text[k : k + 3]), None)
    assert start is not None, f"no stop string to take from {text!r}"
    stop = text[start : start + 3]
    cut = await reply(backend.engine, chat(max_tokens=32, sampling=GREEDY, ignore_eos=True, stop=("\x00zz", stop)))
    assert cut.text == text[: text.index(stop)] and cut.finish_reason == "stop"
    assert cut.usage.output_tokens < 32  # generation stopped there, it was not just cut afterwards


async def check_close_and_abort_free_the_request(backend: TextBackend) -> None:
    """Closing a stream mid-way, or ``engine.abort(id)``, leaves nothing held by the backend."""
    engine = backend.engine
    request = chat(max_tokens=backend.max_context // 2, ignore_eos=True)
    stream = engine.chat(request)
    async with stream:
        for _ in range(2):
            await anext(stream)
    await backend.settle()
    assert backend.live() == 0
    request = chat(max_tokens=backend.max_context // 2, ignore_eos=True)
    stream = engine.chat(request)
    got = 0
    with pytest.raises(RequestCancelled):
        async with stream:
            async for _ in stream:
                got += 1
                if got == 2:
                    assert engine.abort(request.request_id)
    await backend.settle()
    assert backend.live() == 0 and not engine.abort(request.request_id)


async def check_errors_come_before_streaming(backend: TextBackend) -> None:
    """``max_tokens`` past the context and prompts longer than the context fail before any delta, naming the field."""
    engine, n = backend.engine, backend.max_context
    await expect_error_before_output(engine, chat(max_tokens=n + 1), "max_tokens")
    await expect_error_before_output(engine, chat(max_tokens=n - 2), "max_tokens")  # no room left after the prompt
    await expect_error_before_output(engine, chat("story " * n), "messages")
    with pytest.raises(InvalidRequestError) as info:
        chat(max_tokens=0)
    assert info.value.param == "max_tokens"
    await backend.settle()
    assert backend.live() == 0


async def check_seeded_sampling_repeats(backend: TextBackend) -> None:
    """The same seed gives the same sampled reply; other seeds give other replies."""
    sampling = SamplingParams(temperature=1.0, top_k=0, top_p=1.0)
    first = await reply(backend.engine, chat(max_tokens=16, sampling=sampling, seed=7, ignore_eos=True))
    again = await reply(backend.engine, chat(max_tokens=16, sampling=sampling, seed=7, ignore_eos=True))
    assert first.text == again.text
    others = [await reply(backend.engine, chat(max_tokens=16, sampling=sampling, seed=s, ignore_eos=True))
              for s in (8, 9, 10)]  # fmt: skip
    assert any(o.text != first.text for o in others)


CHECKS = (
    check_deltas_join_into_one_growing_reply,
    check_usage_counts_tokens,
    check_finish_reasons_length_and_stop,
    check_close_and_abort_free_the_request,
    check_errors_come_before_streaming,
    check_seeded_sampling_repeats,
)


async def run_contract(backend: TextBackend) -> None:
    for check in CHECKS:
        await check(backend)
        await backend.settle()
        assert backend.live() == 0, f"{check.__name__} left requests behind"
