"""Pipelines: a request's stages run in one task group, joined by bounded channels.

A stage is an async generator function ``stage(ctx, upstream) -> AsyncIterator[Out]`` (typed ``Stage[In, Out]``; a
stage that ignores its upstream is a ``Stage[object, Out]``). A :class:`Chain` is stages one after another typed at
its ends (``Chain(talker).then(codec)``: a ``Chain[object, Audio]``): what a family hands out when its requests run
several stages, each next one checked to read what the one before yields. The first stage's upstream is the
pipeline's source (an empty iterator when there is none). :meth:`Pipeline.run` returns a :class:`PipelineStream`:
iterate it for the last stage's chunks; ``aclose()`` (or leaving ``async with``, or cancelling the consumer) cancels
every stage and waits until their ``finally`` blocks have run. A pipeline's own list holds stages of different types,
so its stream's items are typed where the stages were: :meth:`Chain.run` streams ``Out``, the engine's streams what
each request type's pipelines yield.

Outputs of several stages. With ``emit`` the consumer gets :class:`~omni_stream.chunks.StageOutput` items instead:
every chunk of every emitting stage (the last stage always emits), tagged with its stage and whether it is that
stage's last (the chunk's own ``final`` flag, so nothing waits for a next chunk). An emitting stage that is not the
last hands each chunk to its consumer first, then downstream; both hand-overs are bounded, so a consumer that stops
reading stops every emitting stage.

The task group lives in a host task of its own, never across the consumer's ``yield``: a task group held
open by an async generator would deliver its cancellation into whatever the consumer awaits meanwhile.

Errors: an exception raised by a stage reaches the consumer as the same object (a note names the stage and
the request; ``exc.stage`` holds the stage name), after the other stages have been cancelled.
``ctx.cancel()`` stops the stages and the consumer gets RequestCancelled; past the request's deadline it
gets DeadlineExceeded.

Deadlines. Every wait is bounded: a stage waits on the device worker through ``ctx.wait`` /
``ctx.fail_after`` (the request's ``wait_timeout`` and deadline), on its upstream (bounded by the
upstream's own waits), or on its downstream, which is the consumer's pace: a request whose reader
stalls stays paused until the reader resumes, leaves, or the request's deadline (the host's cancel scope)
passes. Closing waits for the cancelled stages at most :data:`JOIN_TIMEOUT` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from enum import StrEnum
from typing import Any, Generic, Never, NoReturn, TypeAlias, TypeVar, overload

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from omni_stream.chunks import StageOutput, is_final
from omni_stream.context import RequestContext
from omni_stream.errors import DeadlineExceeded, RequestCancelled

In = TypeVar("In")
Out = TypeVar("Out")
Next = TypeVar("Next")

Stage: TypeAlias = Callable[[RequestContext, AsyncIterator[In]], AsyncIterator[Out]]
"""``Stage[In, Out]``: consumes an async iterator of ``In`` chunks, yields ``Out`` chunks."""

AnyStage: TypeAlias = Callable[[RequestContext, AsyncIterator[Any]], AsyncIterator[Any]]
"""A stage of a pipeline's own list, whose neighbours differ in type (checked where the list was made: a
:class:`Chain`, a plan's builder)."""


class Chain(Sequence[AnyStage], Generic[In, Out]):
    """Stages run one after another, typed at the ends: the first reads ``In`` chunks, each next one reads what the
    one before it yields, the last yields ``Out`` chunks. ``Chain(first).then(second)`` checks each join; the chain
    is the sequence of its stages (what :class:`Pipeline` runs)."""

    __slots__ = ("_stages",)

    def __init__(self, first: Stage[In, Out]) -> None:
        self._stages: tuple[AnyStage, ...] = (first,)

    def then(self, stage: Stage[Out, Next]) -> Chain[In, Next]:
        """This chain with ``stage`` after its last stage."""
        chain: Chain[In, Next] = Chain(self._stages[0])
        chain._stages = (*self._stages, stage)
        return chain

    def run(
        self, ctx: RequestContext | None = None, source: AsyncIterator[In] | None = None, *, channel_size: int = 4
    ) -> PipelineStream[Out]:
        """Run the chain as one pipeline (:meth:`Pipeline.run`): its stream yields the last stage's ``Out`` chunks."""
        stream: PipelineStream[Out] = Pipeline(self, channel_size=channel_size).run(ctx, source)
        return stream

    @overload
    def __getitem__(self, index: int) -> AnyStage: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[AnyStage, ...]: ...

    def __getitem__(self, index: int | slice) -> AnyStage | tuple[AnyStage, ...]:
        return self._stages[index]

    def __len__(self) -> int:
        return len(self._stages)


log = logging.getLogger(__name__)

JOIN_TIMEOUT = 30.0  # seconds a close waits for cancelled stages to finish (they take microseconds)


def stage_name(stage: AnyStage) -> str:
    """A readable name for a stage callable (``name`` attribute, function name, or class name)."""
    name = getattr(stage, "name", None)
    if isinstance(name, str):
        return name
    if isinstance(stage, functools.partial):
        return stage_name(stage.func)
    return getattr(stage, "__name__", type(stage).__name__)


async def empty_source() -> AsyncIterator[Never]:
    """An upstream with no chunks (what the first stage gets when the pipeline has no source)."""
    return
    yield  # pragma: no cover


class StreamState(StrEnum):
    IDLE = "idle"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CLOSED = "closed"


class Pipeline:
    """Stages of one request; ``channel_size`` chunks may wait on each edge (default 4).

    ``emit``: one flag per stage; when given, the stream yields StageOutput items of every flagged stage (and the
    last), else the last stage's chunks themselves.
    """

    def __init__(
        self,
        stages: Sequence[AnyStage],
        *,
        channel_size: int = 4,
        names: Sequence[str] | None = None,
        emit: Sequence[bool] | None = None,
    ) -> None:
        if not stages:
            raise ValueError("a pipeline needs at least one stage")
        if channel_size < 0:
            raise ValueError(f"channel_size must be >= 0, got {channel_size}")
        self.stages = tuple(stages)
        self.names = tuple(names) if names is not None else tuple(stage_name(s) for s in self.stages)
        if len(self.names) != len(self.stages):
            raise ValueError("names must match stages one to one")
        self.channel_size = channel_size
        self.tagged = emit is not None
        flags = tuple(emit) if emit is not None else (False,) * len(self.stages)
        if len(flags) != len(self.stages):
            raise ValueError("emit must match stages one to one")
        self.emit = (*flags[:-1], True)

    def run(
        self, ctx: RequestContext | None = None, source: AsyncIterator[object] | None = None
    ) -> PipelineStream[Any]:
        """Start lazily (on first iteration or ``async with``) and stream the last stage's chunks (StageOutput items
        when tagged); typed where the stages were (:class:`Chain`, the engine's streams)."""
        return PipelineStream(self, ctx if ctx is not None else RequestContext(), source)


class _Inbox:
    """A stage's view of its upstream channel: takes a ready chunk without a trip through the event loop."""

    __slots__ = ("stream",)

    def __init__(self, stream: MemoryObjectReceiveStream[Any]) -> None:
        self.stream = stream

    def __aiter__(self) -> _Inbox:
        return self

    async def __anext__(self) -> Any:
        try:
            try:
                return self.stream.receive_nowait()
            except anyio.WouldBlock:
                return await self.stream.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None


async def _send(send: MemoryObjectSendStream[Any], chunk: Any) -> bool:
    """Pass ``chunk`` downstream; False when nobody reads any more (the next stage or the consumer left)."""
    try:
        try:
            send.send_nowait(chunk)  # room on the edge: no need to suspend
        except anyio.WouldBlock:
            await send.send(chunk)
    except anyio.BrokenResourceError:
        return False
    return True


class _Run:
    """State shared by the host task and the consumer; holds no reference to the consumer-facing stream."""

    __slots__ = ("ctx", "error", "failed_stage", "scope")

    def __init__(self, ctx: RequestContext) -> None:
        self.ctx = ctx
        self.error: BaseException | None = None
        self.failed_stage: str | None = None
        self.scope: anyio.CancelScope | None = None

    def fail(self, exc: BaseException, stage: str | None) -> None:
        """Record the first error and cancel every stage. Synchronous, so no later close can hide it."""
        if self.error is None and self.ctx.cancelled and not isinstance(exc, RequestCancelled):
            # A stage that trips over its own released slot after ctx.cancel() reports the cancel, not the trip.
            exc, stage = RequestCancelled(f"request {self.ctx.request_id} was cancelled"), None
        if self.error is None:
            self.error = exc
            self.failed_stage = stage
            if stage is not None:
                exc.add_note(f"raised in pipeline stage {stage!r} of request {self.ctx.request_id}")
                with contextlib.suppress(AttributeError):
                    exc.stage = stage  # type: ignore[attr-defined]
        if self.scope is not None:
            self.scope.cancel()


async def _drive(
    run: _Run,
    stage: AnyStage,
    name: str,
    upstream: AsyncIterator[Any],
    send: MemoryObjectSendStream[Any],
    tap: MemoryObjectSendStream[Any] | None = None,
    tag: bool = False,
) -> None:
    """Run one stage: each chunk goes to ``tap`` (the consumer, as a StageOutput) if any, then to ``send``."""
    try:
        async with send:
            produced = stage(run.ctx, upstream)
            if not (hasattr(produced, "__anext__") and hasattr(produced, "aclose")):
                if inspect.iscoroutine(produced):
                    produced.close()  # an async def without yield: never awaited, closed so it does not warn
                raise TypeError(
                    f"stage {name!r} returned {type(produced).__name__}: a stage is an async generator function "
                    "(async def with yield) of (ctx, upstream) that yields its chunks"
                )
            async with contextlib.aclosing(produced) as chunks:  # type: ignore[type-var]  # checked above
                async for chunk in chunks:
                    if tap is not None and not await _send(tap, StageOutput(name, chunk, is_final(chunk))):
                        break  # the consumer is gone
                    item = StageOutput(name, chunk, is_final(chunk)) if tag else chunk
                    if not await _send(send, item):
                        break  # the rest of the pipeline is gone: stop this stage quietly
    except anyio.get_cancelled_exc_class():
        raise
    except Exception as exc:
        run.fail(exc, name)
    finally:
        if tap is not None:
            tap.close()
        if isinstance(upstream, _Inbox):
            upstream.stream.close()  # tell the previous stage nobody reads any more


async def _host(
    run: _Run, pipeline: Pipeline, source: AsyncIterator[object] | None, out: MemoryObjectSendStream[Any]
) -> None:
    streams: list[Any] = [out]
    try:
        scope_deadline = anyio.current_time() + run.ctx.remaining()  # inf without a deadline
        with anyio.CancelScope(deadline=scope_deadline) as scope:
            run.scope = run.ctx.cancel_scope = scope
            if run.ctx.cancelled:
                scope.cancel()
            async with anyio.create_task_group() as tg:
                upstream: AsyncIterator[object] = source if source is not None else empty_source()
                last = len(pipeline.stages) - 1
                for i, (stage, name) in enumerate(zip(pipeline.stages, pipeline.names, strict=True)):
                    tap = None
                    if i == last:
                        send, receive = out, None
                    else:
                        send, receive = anyio.create_memory_object_stream[Any](pipeline.channel_size)
                        streams += [send, receive]
                        if pipeline.emit[i]:
                            tap = out.clone()
                            streams.append(tap)
                    tg.start_soon(
                        _drive,
                        run,
                        stage,
                        name,
                        upstream,
                        send,
                        tap,
                        pipeline.tagged and i == last,
                        name=f"{run.ctx.request_id}:{name}",
                    )
                    if receive is not None:
                        upstream = _Inbox(receive)
        if scope.cancelled_caught and run.error is None:
            if run.ctx.cancelled:
                run.fail(RequestCancelled(f"request {run.ctx.request_id} was cancelled"), None)
            else:  # nothing else cancels this scope but its deadline
                run.fail(DeadlineExceeded(f"request {run.ctx.request_id} ran past its deadline"), None)
    finally:
        for stream in streams:
            stream.close()


class PipelineStream(Generic[Out]):
    """One running request: an async iterator of the last stage's ``Out`` chunks and an async context manager."""

    def __init__(self, pipeline: Pipeline, ctx: RequestContext, source: AsyncIterator[object] | None) -> None:
        self.pipeline = pipeline
        self.ctx = ctx
        self.state = StreamState.IDLE
        self._source = source
        self._run = _Run(ctx)
        self._host: asyncio.Task[None] | None = None
        self._out: MemoryObjectReceiveStream[Out] | None = None

    @property
    def error(self) -> BaseException | None:
        return self._run.error

    @property
    def live(self) -> bool:
        """Whether its stages may still run: not started yet, or running, and neither aborted nor failed."""
        if self._run.error is not None or self.ctx.cancelled:
            return False
        running = self.state is StreamState.RUNNING and self._host is not None and not self._host.done()
        return self.state is StreamState.IDLE or running

    @property
    def failed_stage(self) -> str | None:
        return self._run.failed_stage

    def start(self) -> None:
        """Start the stages now (otherwise the first ``__anext__`` does). Must run on the event loop. A stream aborted
        with an error before it started never starts (its first ``__anext__`` raises the error)."""
        if self.state is not StreamState.IDLE or self._run.error is not None:
            return
        send, self._out = anyio.create_memory_object_stream[Out](self.pipeline.channel_size)
        loop = asyncio.get_running_loop()
        self._host = loop.create_task(_host(self._run, self.pipeline, self._source, send))
        self._source = None
        self.state = StreamState.RUNNING

    def cancel(self, exc: BaseException | None = None) -> None:
        """Cancel every stage now, without waiting (safe in ``finally`` of a cancelled task).

        With ``exc``, the consumer's next ``__anext__`` raises it (unless a stage failed first).
        """
        if exc is not None:
            self._run.fail(exc, None)
        if self._host is not None and not self._host.done():
            self.ctx.release_now()  # slots go back before the worker's next step, not when the stages next run
            self._host.cancel()
        if self.state in (StreamState.IDLE, StreamState.RUNNING) and exc is None:
            self.state = StreamState.CLOSED

    async def aclose(self) -> None:
        """Cancel every stage and wait until their ``finally`` blocks have run."""
        self.cancel()
        await self._join()
        if self.state is StreamState.RUNNING:
            self.state = StreamState.CLOSED

    async def _join(self) -> None:
        """Wait for the cancelled stages' ``finally`` blocks; shielded, so a cancelled caller still waits.

        Bounded in practice: the host task has been cancelled, so every await in a stage's ``finally`` is
        cancelled at once (anyio scopes are level-triggered) and what remains are synchronous releases. A
        stage that shields a long await of its own is a bug; past :data:`JOIN_TIMEOUT` the wait gives up
        with a warning rather than hang its caller (the host task still finishes on its own).
        """
        if self._host is None or self._host.done():
            return
        with anyio.CancelScope(shield=True):
            done, _ = await asyncio.wait({self._host}, timeout=JOIN_TIMEOUT)
        if not done:
            log.warning(
                "request %s: stages still running %.0f s after cancellation; not waiting for them",
                self.ctx.request_id,
                JOIN_TIMEOUT,
            )

    def __aiter__(self) -> PipelineStream[Out]:
        return self

    async def __anext__(self) -> Out:
        if self.state not in (StreamState.IDLE, StreamState.RUNNING):
            raise StopAsyncIteration
        if self._run.error is not None:  # failed, or aborted with an error before it started
            return await self._raise_error()
        if self.state is StreamState.IDLE:
            self.start()
        assert self._out is not None
        try:
            try:
                chunk = self._out.receive_nowait()
            except anyio.WouldBlock:
                chunk = await self._out.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            await self._join()
            if self._run.error is not None:
                return await self._raise_error()
            self.state = StreamState.DONE
            raise StopAsyncIteration from None
        except BaseException:
            self.cancel()  # the consumer was cancelled while waiting: stop the stages too
            raise
        if self._run.error is not None:
            return await self._raise_error()
        return chunk

    async def _raise_error(self) -> NoReturn:
        self.state = StreamState.FAILED
        self.cancel()
        await self._join()
        assert self._run.error is not None
        raise self._run.error

    async def __aenter__(self) -> PipelineStream[Out]:
        if self.state is StreamState.IDLE:
            self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.cancel()
        await self._join()

    def __del__(self) -> None:
        host = self._host
        if host is not None and not host.done():
            with contextlib.suppress(RuntimeError):  # the loop may be closed already
                host.get_loop().call_soon_threadsafe(host.cancel)
