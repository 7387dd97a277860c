"""Checks every text backend passes, written once, run against each backend by its own test module.

A backend test module builds a :class:`Backend`: an engine whose text model is that backend, a ``reference`` that
says what the backend must produce for a request, obtained another way than the stage under test (a whole
non-streamed generation of the same model), and ``assert_idle``, which fails while the backend still holds
any state of a request (a live sequence upstream, a request in vLLM's engine core). The checks:

- deltas join to the reference text, with the usage the reference reports; greedy is deterministic;
- ``finish_reason`` is ``length`` at ``max_tokens`` and ``stop`` at a stop string (text cut before it);
- closing the stream, cancelling its reader or ``engine.abort`` aborts the generation: the backend is idle
  afterwards, also over random abort points;
- invalid requests raise InvalidRequestError before any delta.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import anyio
import pytest

from omni_stream.chunks import TextDelta
from omni_stream.engine import AsyncEngine
from omni_stream.errors import InvalidRequestError, RequestCancelled
from omni_stream.requests import GREEDY, ChatMessage, Role, SamplingParams, TextRequest


@dataclass(slots=True, frozen=True)
class Reference:
    """What a request must produce: the whole text and its token counts."""

    text: str
    prompt_tokens: int
    completion_tokens: int


@dataclass(slots=True)
class Backend:
    engine: AsyncEngine
    reference: Callable[[TextRequest], Awaitable[Reference]]
    assert_idle: Callable[[], Awaitable[None]]
    # A request that runs long enough to be aborted mid-way (ignore_eos, many tokens).
    long_request: Callable[[], TextRequest]


def chat(text: str, **fields) -> TextRequest:
    return TextRequest(messages=(ChatMessage(Role.USER, text),), **fields)


async def run(engine: AsyncEngine, request: TextRequest) -> tuple[list[TextDelta], dict]:
    """Every delta of ``request`` and its usage by kind."""
    async with engine.chat(request) as stream:
        deltas = [item.chunk async for item in stream]
    return deltas, stream.usage


def assert_well_formed(deltas: list[TextDelta]) -> None:
    assert deltas, "no delta"
    assert deltas[-1].final and deltas[-1].finish_reason is not None
    assert not any(d.final for d in deltas[:-1]), "a delta before the last is marked final"
    assert all(d.text for d in deltas[:-1]), "an empty delta before the last"
    assert [d.index for d in deltas] == sorted(d.index for d in deltas)


async def check_deltas_join_to_the_reference_with_usage(backend: Backend, request: TextRequest) -> None:
    deltas, usage = await run(backend.engine, request)
    expected = await backend.reference(request)
    assert_well_formed(deltas)
    assert "".join(d.text for d in deltas) == expected.text
    text_usage = usage["text"]
    assert (text_usage.input_tokens, text_usage.output_tokens) == (expected.prompt_tokens, expected.completion_tokens)


async def check_greedy_is_deterministic(backend: Backend, request: TextRequest) -> None:
    request = replace(request, sampling=GREEDY)
    first, _ = await run(backend.engine, request)
    second, _ = await run(backend.engine, replace(request, request_id=request.request_id + "-again"))
    assert "".join(d.text for d in first) == "".join(d.text for d in second)


async def check_finish_reason_length_at_max_tokens(backend: Backend, request: TextRequest, max_tokens: int) -> None:
    deltas, usage = await run(backend.engine, replace(request, max_tokens=max_tokens, ignore_eos=True))
    assert_well_formed(deltas)
    assert deltas[-1].finish_reason == "length"
    assert usage["text"].output_tokens == max_tokens


async def check_finish_reason_stop_at_a_stop_string(backend: Backend, request: TextRequest) -> None:
    """Pick a stop string from the middle of the reference text: the text must end right before it."""
    full = (await backend.reference(request)).text
    stop = pick_stop(full)
    cut = full[: full.index(stop)]
    deltas, _ = await run(backend.engine, replace(request, stop=(stop,)))
    assert_well_formed(deltas)
    assert deltas[-1].finish_reason == "stop"
    assert "".join(d.text for d in deltas) == cut


def pick_stop(text: str) -> str:
    """Two letters or digits from the second half of ``text`` (any model's output, random weights too)."""
    for i in range(len(text) // 2, len(text) - 1):
        if text[i : i + 2].isascii() and text[i : i + 2].isalnum():
            return text[i : i + 2]
    raise AssertionError(f"no stop string to cut the reference at: {text!r}")


async def check_close_aborts(backend: Backend, after_deltas: int = 2) -> None:
    stream = backend.engine.chat(backend.long_request())
    seen = 0
    async with stream:
        async for item in stream:
            assert not item.chunk.final, "the long request finished before it could be aborted"
            seen += 1
            if seen == after_deltas:
                break
    await backend.assert_idle()


async def check_cancelling_the_consumer_aborts(backend: Backend, after_deltas: int = 2) -> None:
    """The consuming task is cancelled mid-stream (a client gone, a timeout around the read)."""
    seen = 0
    with anyio.CancelScope() as scope:
        async with backend.engine.chat(backend.long_request()) as stream:
            async for _ in stream:
                seen += 1
                if seen == after_deltas:
                    scope.cancel()  # the next await inside the read is cancelled
    assert scope.cancelled_caught and seen == after_deltas
    await backend.assert_idle()


async def check_engine_abort_by_id(backend: Backend) -> None:
    request = backend.long_request()
    stream = backend.engine.chat(request)
    async with stream:
        await anext(aiter(stream))
        assert backend.engine.abort(request.request_id)
        with pytest.raises(RequestCancelled):
            async for _ in stream:
                pass
    await backend.assert_idle()


async def check_random_aborts_leave_nothing(backend: Backend, n: int = 12, seed: int = 0) -> None:
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


async def check_invalid_requests_raise_before_any_delta(backend: Backend, too_long_prompt: str) -> None:
    max_context = backend.engine.models.text().info.max_context
    for request in (chat("hello", max_tokens=max_context + 10), chat(too_long_prompt, max_tokens=4)):
        got: list[TextDelta] = []
        with pytest.raises(InvalidRequestError) as info:
            async with backend.engine.chat(request) as stream:
                async for item in stream:
                    got.append(item.chunk)
        assert got == [], f"{len(got)} deltas streamed before the error"
        assert info.value.message
    await backend.assert_idle()


SAMPLED = SamplingParams(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
