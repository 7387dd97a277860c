"""What every text-generation backend (native, vLLM in process, a remote OpenAI-compatible server) must do.

Plain async functions over a :class:`TextBackend`: an engine whose text model is the backend under test, an
``assert_idle`` that fails while the backend still holds any state of a request (a batch slot, a sequence in
vLLM's engine core, a live stream upstream), and a ``reference`` that says what a request must produce, obtained
another way than the stage under test (transformers' ``generate()``, vLLM's non-streamed output, a server's
``stream: false`` answer). A backend's test module builds one and runs every check of :data:`CHECKS`. The checks
use greedy decoding and ``ignore_eos`` where they need a known length, and read only what every backend gives:
streamed :class:`TextDelta` chunks of the ``text`` stage, ``usage["text"]``, and errors raised before anything
streams.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
import pytest

from omni_stream.chunks import TextDelta
from omni_stream.engine import AsyncEngine, Usage
from omni_stream.errors import InvalidRequestError, RequestCancelled
from omni_stream.requests import GREEDY, ChatMessage, Role, SamplingParams, TextRequest

PROMPT = "Hello there! Tell me a story about a quick brown fox."
SAMPLED = SamplingParams(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)


@dataclass(slots=True, frozen=True)
class Reference:
    """What a request must produce: the whole text and its token counts."""

    text: str
    prompt_tokens: int
    completion_tokens: int


@dataclass(slots=True, frozen=True)
class TextBackend:
    """The engine under test; ``assert_idle()`` fails while the backend holds anything of a request (it waits for
    the backend to act on every abort so far first); ``reference(request)`` is the whole output of a greedy
    ``ignore_eos`` request, not streamed by the stage under test. ``names_params``: the backend's refusals name the
    field (a remote server's 400 may carry no ``param``); ``refuses_past_room``: a ``max_tokens`` that does not fit
    after the prompt is refused (``vllm serve`` accepts it and stops where the context ends)."""

    engine: AsyncEngine
    assert_idle: Callable[[], Awaitable[None]]
    reference: Callable[[TextRequest], Awaitable[Reference]]
    names_params: bool = True
    refuses_past_room: bool = True

    @property
    def max_context(self) -> int:
        return self.engine.models.text().info.max_context

    def long_request(self) -> TextRequest:
        """A request that runs long enough to be aborted mid-way."""
        return chat(max_tokens=self.max_context // 2, ignore_eos=True, sampling=SAMPLED, seed=1)


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
    assert [d.index for d in deltas] == sorted(d.index for d in deltas)
    return Reply(deltas, stream.usage["text"])


async def expect_error_before_output(backend: TextBackend, request: TextRequest, param: str) -> InvalidRequestError:
    """``request`` fails with InvalidRequestError (naming ``param`` where the backend names fields), at the call or
    the first read, before any delta."""
    try:
        stream = backend.engine.chat(request)
    except InvalidRequestError as exc:
        assert exc.param == param, (exc.param, str(exc))
        return exc
    got = []
    with pytest.raises(InvalidRequestError) as info:
        async with stream:
            async for out in stream:
                got.append(out)
    assert got == [], f"{len(got)} deltas streamed before the error"
    assert info.value.message
    if backend.names_params:
        assert info.value.param == param, (info.value.param, str(info.value))
    return info.value


# --- the checks -----------------------------------------------------------------------------------------------


async def check_deltas_join_into_one_growing_reply(backend: TextBackend) -> None:
    """A longer greedy reply continues the shorter one: deltas are the reply's pieces, in order, none taken back."""
    short = await reply(backend.engine, chat(max_tokens=8, sampling=GREEDY, ignore_eos=True))
    long = await reply(backend.engine, chat(max_tokens=24, sampling=GREEDY, ignore_eos=True))
    # only the short reply's last character may differ: bytes of an unfinished character end it as U+FFFD
    assert long.text.startswith(short.text.rstrip("\ufffd")), (short.text, long.text)
    assert len(long.text) >= len(short.text.rstrip("\ufffd"))


async def check_deltas_join_to_the_reference_with_usage(backend: TextBackend) -> None:
    """The streamed greedy deltas join to the reference's whole text, with its token counts."""
    request = chat(max_tokens=24, sampling=GREEDY, ignore_eos=True)
    got = await reply(backend.engine, request)
    expected = await backend.reference(request)
    # Random weights end on any byte: a stream may hold back a trailing incomplete character a whole decode shows.
    assert got.text.rstrip("\ufffd") == expected.text.rstrip("\ufffd"), (got.text, expected.text)
    assert len(expected.text) > 8
    assert (got.usage.input_tokens, got.usage.output_tokens) == (expected.prompt_tokens, expected.completion_tokens)


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


async def check_seeded_sampling_repeats(backend: TextBackend) -> None:
    """The same seed gives the same sampled reply; other seeds give other replies."""
    first = await reply(backend.engine, chat(max_tokens=16, sampling=SAMPLED, seed=7, ignore_eos=True))
    again = await reply(backend.engine, chat(max_tokens=16, sampling=SAMPLED, seed=7, ignore_eos=True))
    assert first.text == again.text
    others = [await reply(backend.engine, chat(max_tokens=16, sampling=SAMPLED, seed=s, ignore_eos=True))
              for s in (8, 9, 10)]  # fmt: skip
    assert any(o.text != first.text for o in others)


async def check_close_and_abort_free_the_request(backend: TextBackend) -> None:
    """Closing a stream mid-way, or ``engine.abort(id)``, leaves nothing held by the backend."""
    engine = backend.engine
    stream = engine.chat(backend.long_request())
    async with stream:
        for _ in range(2):
            assert not (await anext(stream)).chunk.final, "the long request finished before it could be closed"
    await backend.assert_idle()
    request = backend.long_request()
    stream = engine.chat(request)
    got = 0
    with pytest.raises(RequestCancelled):
        async with stream:
            async for _ in stream:
                got += 1
                if got == 2:
                    assert engine.abort(request.request_id)
    await backend.assert_idle()
    assert not engine.abort(request.request_id)


async def check_cancelling_the_reader_frees_the_request(backend: TextBackend) -> None:
    """The consuming task is cancelled mid-stream (a client gone, a timeout around the read)."""
    seen = 0
    with anyio.CancelScope() as scope:
        async with backend.engine.chat(backend.long_request()) as stream:
            async for _ in stream:
                seen += 1
                if seen == 2:
                    scope.cancel()  # the next await inside the read is cancelled
    assert scope.cancelled_caught and seen == 2
    await backend.assert_idle()


async def check_random_aborts_leave_nothing(backend: TextBackend, n: int = 8, seed: int = 0) -> None:
    """Requests closed after a random number of deltas (0: before the first), some running side by side."""
    rng = random.Random(seed)
    for _ in range(n):
        streams = [backend.engine.chat(backend.long_request()) for _ in range(rng.randint(1, 3))]
        for stream in streams:
            stop_after = rng.randint(0, 5)
            async with stream:
                if stop_after == 0:
                    continue
                async for _ in stream:
                    stop_after -= 1
                    if stop_after == 0:
                        break
    await backend.assert_idle()


async def check_errors_come_before_streaming(backend: TextBackend) -> None:
    """``max_tokens`` past the context and prompts longer than the context fail before any delta."""
    n = backend.max_context
    await expect_error_before_output(backend, chat(max_tokens=n + 1), "max_tokens")
    past_room = chat(max_tokens=n - 2)  # no room left after the prompt
    if backend.refuses_past_room:
        await expect_error_before_output(backend, past_room, "max_tokens")
    else:
        got = await reply(backend.engine, past_room)
        assert got.usage.input_tokens + got.usage.output_tokens <= n, got.usage
    await expect_error_before_output(backend, chat("story " * n, max_tokens=4), "messages")
    with pytest.raises(InvalidRequestError) as info:
        chat(max_tokens=0)
    assert info.value.param == "max_tokens"
    await backend.assert_idle()


CHECKS = (
    check_deltas_join_into_one_growing_reply,
    check_deltas_join_to_the_reference_with_usage,
    check_usage_counts_tokens,
    check_finish_reasons_length_and_stop,
    check_seeded_sampling_repeats,
    check_close_and_abort_free_the_request,
    check_cancelling_the_reader_frees_the_request,
    check_random_aborts_leave_nothing,
    check_errors_come_before_streaming,
)


def check_id(check: Callable[..., object]) -> str:
    """A check's test id: its name without ``check_``."""
    return check.__name__.removeprefix("check_")
