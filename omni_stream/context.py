"""Per-request context: id, deadline, cancellation, usage counters and timings, shared by every stage of a request.

A request that runs sub-requests (a streamed-text speech stage runs one speech request per sentence) gives each a
:meth:`RequestContext.child`: same deadline, wait budget and usage counters; its own id and timings; cancelling
the parent releases the child's slots synchronously too.

Releases run under the context's ``guard`` (the engine sets its device worker's lock, and children inherit it):
a request that holds slots in several models (an LLM and two sentences' speech) gives them all back at once,
so the worker can never schedule a step between two of them. Without it, the worker could run a burst of
steps for the second sequence while the event loop waits to take the lock again after the first.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TypeVar

import anyio

from omni_stream.errors import DeadlineExceeded
from omni_stream.requests import Timings, next_request_id

T = TypeVar("T")

_release_keys = itertools.count()  # not id(): a stale unregister must never remove a later registration


@dataclass(slots=True)
class TokenCount:
    """One model's usage within a request: tokens in (of which ``input_audio_tokens`` were audio, e.g. a cloning
    reference's codec frames in a speech prompt), tokens (or codec frames) out."""

    input_tokens: int = 0
    output_tokens: int = 0
    input_audio_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def _expire(future: asyncio.Future[T], request_id: str, what: str, budget: float) -> None:
    if not future.done():
        future.set_exception(DeadlineExceeded(f"request {request_id}: {what} took longer than {budget:.3f} s"))


@dataclass(slots=True)
class RequestContext:
    """What every stage of one request shares. Mutable; lives on the event loop.

    ``deadline`` is absolute ``time.monotonic()`` seconds for the whole request (None: none).
    ``wait_timeout`` bounds any single wait inside the engine (seconds; None: only the deadline).
    """

    request_id: str = field(default_factory=next_request_id)
    deadline: float | None = None
    wait_timeout: float | None = 120.0
    timings: Timings = field(default_factory=Timings)
    # Usage by model kind ("speech": text tokens in, codec frames out; "text": prompt and generated tokens).
    usage: dict[str, TokenCount] = field(default_factory=dict)
    # Set by the pipeline that runs the request: cancelling it stops every stage.
    cancel_scope: anyio.CancelScope | None = field(default=None, repr=False)
    cancelled: bool = False
    # Held while the releases run (the device worker's lock, reentrant): all of them, children's included, take
    # effect between two steps of the worker.
    guard: AbstractContextManager[object] | None = field(default=None, repr=False)
    _releases: dict[int, Callable[[], None]] = field(default_factory=dict, repr=False)

    def tokens(self, kind: str) -> TokenCount:
        """The usage counter of model kind ``kind`` (created at zero)."""
        count = self.usage.get(kind)
        if count is None:
            count = self.usage[kind] = TokenCount()
        return count

    def child(self, request_id: str) -> RequestContext:
        """A sub-request's context: shares deadline, wait budget and usage; the parent's release frees it too."""
        child = RequestContext(
            request_id=request_id,
            deadline=self.deadline,
            wait_timeout=self.wait_timeout,
            usage=self.usage,
            guard=self.guard,
        )
        unregister = self.add_release(child.release_now)
        child.add_release(unregister)  # a child released on its own stops being the parent's concern
        return child

    def cancel(self) -> None:
        """Stop the request: release its slots now, cancel its stages; the consumer gets RequestCancelled."""
        self.cancelled = True
        self.release_now()
        if self.cancel_scope is not None:
            self.cancel_scope.cancel()

    def add_release(self, release: Callable[[], None]) -> Callable[[], None]:
        """Register a synchronous, idempotent release (a scheduler slot); returns its unregister function."""
        key = next(_release_keys)
        self._releases[key] = release

        def unregister() -> None:
            self._releases.pop(key, None)

        return unregister

    def release_now(self) -> None:
        """Run every registered release at once, without awaiting (stages notice at their next await)."""
        with self.guard if self.guard is not None else nullcontext():
            releases, self._releases = list(self._releases.values()), {}
            for release in releases:
                release()

    @classmethod
    def with_timeout(
        cls,
        timeout: float | None,
        *,
        request_id: str | None = None,
        wait_timeout: float | None = 120.0,
        guard: AbstractContextManager[object] | None = None,
    ) -> RequestContext:
        """A context whose deadline is ``timeout`` seconds from now (None: no deadline); ``request_id`` None: a new
        one; the other fields as the constructor's."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if request_id is None:
            return cls(deadline=deadline, wait_timeout=wait_timeout, guard=guard)
        return cls(request_id=request_id, deadline=deadline, wait_timeout=wait_timeout, guard=guard)

    def remaining(self) -> float:
        """Seconds until the request's deadline (``inf`` when it has none); may be negative."""
        return math.inf if self.deadline is None else self.deadline - time.monotonic()

    def wait_budget(self) -> float:
        """Seconds the next single wait may take: the smaller of the deadline and ``wait_timeout``."""
        budget = self.remaining()
        if self.wait_timeout is not None:
            budget = min(budget, self.wait_timeout)
        return budget

    async def wait(self, future: asyncio.Future[T], what: str = "wait") -> T:
        """Await ``future`` for at most :meth:`wait_budget` seconds, else fail it with :class:`DeadlineExceeded`.

        Cheaper than :meth:`fail_after` (one timer, no cancel scope): the hot path for worker results.
        """
        budget = self.wait_budget()
        if budget == math.inf:
            return await future
        if budget <= 0:
            future.cancel()
            raise DeadlineExceeded(f"request {self.request_id}: deadline passed before {what}")
        timer = future.get_loop().call_later(budget, _expire, future, self.request_id, what, budget)
        try:
            return await future
        finally:
            timer.cancel()

    @contextmanager
    def fail_after(self, what: str = "wait") -> Iterator[None]:
        """Bound the awaits inside by :meth:`wait_budget`; raise :class:`DeadlineExceeded` past it.

        Never spans a ``yield`` of an async generator: wrap single awaits only.
        """
        budget = self.wait_budget()
        if budget == math.inf:
            yield
            return
        if budget <= 0:
            raise DeadlineExceeded(f"request {self.request_id}: deadline passed before {what}")
        with anyio.move_on_after(budget) as scope:
            yield
        if scope.cancelled_caught:
            raise DeadlineExceeded(f"request {self.request_id}: {what} took longer than {budget:.3f} s")
