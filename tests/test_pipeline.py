"""Pipeline: stages in one task group, bounded channels, teardown on every kind of exit, errors by type."""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import AsyncIterator

import anyio
import pytest

from omni_stream.context import RequestContext
from omni_stream.errors import DeadlineExceeded, RequestCancelled
from omni_stream.pipeline import Pipeline, StreamState


class Probe:
    """Records stage lifecycle events so tests can assert teardown."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.produced = 0

    def source(self, n: int | None = None):
        async def source(ctx: RequestContext, upstream: AsyncIterator[int]) -> AsyncIterator[int]:
            self.events.append("source:start")
            try:
                i = 0
                while n is None or i < n:
                    self.produced += 1
                    yield i
                    i += 1
            finally:
                self.events.append("source:finally")

        return source

    def double(self, fail_at: int | None = None):
        async def double(ctx: RequestContext, upstream: AsyncIterator[int]) -> AsyncIterator[int]:
            try:
                async for x in upstream:
                    if x == fail_at:
                        raise KeyError(f"bad item {x}")
                    yield 2 * x
            finally:
                self.events.append("double:finally")

        return double

    def plus_one(self):
        async def plus_one(ctx: RequestContext, upstream: AsyncIterator[int]) -> AsyncIterator[int]:
            try:
                async for x in upstream:
                    yield x + 1
            finally:
                self.events.append("plus_one:finally")

        return plus_one

    def finals(self) -> set[str]:
        return {e for e in self.events if e.endswith(":finally")}


ALL_FINALS = {"source:finally", "double:finally", "plus_one:finally"}


async def test_chunks_flow_through_every_stage_in_order():
    probe = Probe()
    pipeline = Pipeline([probe.source(5), probe.double(), probe.plus_one()])
    out = [x async for x in pipeline.run()]
    assert out == [1, 3, 5, 7, 9]
    assert probe.finals() == ALL_FINALS


async def test_source_iterator_feeds_the_first_stage():
    async def numbers():
        for i in range(3):
            yield i

    probe = Probe()
    stream = Pipeline([probe.double(), probe.plus_one()]).run(source=numbers())
    assert [x async for x in stream] == [1, 3, 5]
    assert stream.state is StreamState.DONE


async def test_channels_are_bounded_when_the_consumer_stops_reading():
    probe = Probe()
    pipeline = Pipeline([probe.source(), probe.double(), probe.plus_one()], channel_size=2)
    async with pipeline.run() as stream:
        assert await stream.__anext__() == 1
        await anyio.wait_all_tasks_blocked()
        # 3 channels of 2, one item held by each of the 3 stages while blocked on send, one consumed.
        assert probe.produced <= 3 * 2 + 3 + 1
        before = probe.produced
        await anyio.wait_all_tasks_blocked()
        assert probe.produced == before  # nothing moves while nobody reads
    assert probe.finals() == ALL_FINALS


async def test_aclose_runs_every_stage_finally_before_returning():
    probe = Probe()
    stream = Pipeline([probe.source(), probe.double(), probe.plus_one()]).run()
    assert await stream.__anext__() == 1
    await stream.aclose()
    assert probe.finals() == ALL_FINALS
    assert stream.state is StreamState.CLOSED
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()


async def test_break_inside_async_with_tears_down():
    probe = Probe()
    async with Pipeline([probe.source(), probe.double()]).run() as stream:
        async for x in stream:
            if x == 4:
                break
    assert probe.finals() == {"source:finally", "double:finally"}


async def test_consumer_exception_inside_async_with_tears_down():
    probe = Probe()
    with pytest.raises(ZeroDivisionError):
        async with Pipeline([probe.source(), probe.double()]).run() as stream:
            async for x in stream:
                if x == 2:
                    _ = 1 / 0
    assert probe.finals() == {"source:finally", "double:finally"}


async def test_cancelling_the_consumer_tears_down_the_stages():
    probe = Probe()
    done = anyio.Event()

    async def never(ctx: RequestContext, upstream: AsyncIterator[int]) -> AsyncIterator[int]:
        try:
            await anyio.sleep_forever()
            yield 0
        finally:
            probe.events.append("never:finally")
            done.set()

    stream = Pipeline([never]).run()

    async def consume() -> None:
        async for _ in stream:
            pass

    task = asyncio.get_running_loop().create_task(consume())
    await anyio.wait_all_tasks_blocked()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with anyio.fail_after(5):
        await done.wait()
    assert probe.events == ["never:finally"]


async def test_stage_error_reaches_consumer_as_the_same_exception():
    probe = Probe()
    stream = Pipeline([probe.source(), probe.double(fail_at=3), probe.plus_one()]).run(RequestContext(request_id="r1"))
    got = []
    with pytest.raises(KeyError) as info:
        async for x in stream:
            got.append(x)
    assert got == [1, 3, 5][: len(got)]  # what came before the failure, in order
    assert info.value.stage == "double"
    assert any("double" in note and "r1" in note for note in info.value.__notes__)
    assert probe.finals() == ALL_FINALS
    assert stream.state is StreamState.FAILED


async def test_error_in_last_stage_is_not_hidden_by_upstream_end():
    async def one(ctx, upstream):
        yield 1

    async def fail_at_end(ctx, upstream):
        async for x in upstream:
            yield x
        raise ValueError("flush failed")

    with pytest.raises(ValueError, match="flush failed"):
        async for _ in Pipeline([one, fail_at_end]).run():
            pass


async def test_a_stage_that_is_not_an_async_generator_is_named_in_a_clear_error():
    """A plain function returning a list (or a coroutine) is refused with what a stage must be, not an
    AttributeError from deep inside the pipeline."""

    async def one(ctx, upstream):
        yield 1

    def doubled(ctx, upstream):
        return [2, 4]

    with pytest.raises(TypeError, match=r"stage 'doubled' returned list: a stage is an async generator function"):
        async with Pipeline([one, doubled]).run() as stream:
            async for _ in stream:
                pass

    async def awaited(ctx, upstream):  # async def without yield: a coroutine, closed unawaited without a warning
        return [2]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(TypeError, match=r"stage 'awaited' returned coroutine") as refused:
            async with Pipeline([one, awaited]).run() as stream:
                async for _ in stream:
                    pass
        del refused, stream  # their tracebacks hold the stage's frame, and the coroutine with it
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)], [str(w.message) for w in caught]


async def test_a_failing_request_leaves_concurrent_requests_alone():
    ok_probe, bad_probe = Probe(), Probe()
    good = Pipeline([ok_probe.source(50), ok_probe.double()], channel_size=1)
    bad = Pipeline([bad_probe.source(50), bad_probe.double(fail_at=5)], channel_size=1)
    results: dict[str, object] = {}

    async def run(name: str, pipeline: Pipeline) -> None:
        try:
            results[name] = [x async for x in pipeline.run()]
        except Exception as exc:
            results[name] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, "good", good)
        tg.start_soon(run, "bad", bad)
    assert results["good"] == [2 * i for i in range(50)]
    assert isinstance(results["bad"], KeyError)


async def test_deadline_raises_deadline_exceeded():
    async def slow(ctx, upstream):
        yield 1
        await anyio.sleep_forever()
        yield 2

    stream = Pipeline([slow]).run(RequestContext.with_timeout(0.05))
    assert await stream.__anext__() == 1
    with pytest.raises(DeadlineExceeded):
        await stream.__anext__()


async def test_first_stage_without_source_sees_an_empty_upstream():
    async def count(ctx, upstream):
        n = 0
        async for _ in upstream:
            n += 1
        yield n

    assert [x async for x in Pipeline([count]).run()] == [0]


async def test_stage_finally_runs_when_downstream_returns_early():
    probe = Probe()

    async def first_only(ctx, upstream):
        async for x in upstream:
            yield x
            return

    out = [x async for x in Pipeline([probe.source(), first_only]).run()]
    assert out == [0]
    assert "source:finally" in probe.events


async def test_pipeline_rejects_bad_configuration():
    with pytest.raises(ValueError):
        Pipeline([])
    with pytest.raises(ValueError):
        Pipeline([Probe().double()], channel_size=-1)


async def test_ctx_cancel_stops_the_stages_and_raises_request_cancelled():
    probe = Probe()
    ctx = RequestContext()
    stream = Pipeline([probe.source(), probe.double()]).run(ctx)
    assert await stream.__anext__() == 0
    ctx.cancel()
    with pytest.raises(RequestCancelled):
        async for _ in stream:
            pass
    assert probe.finals() == {"source:finally", "double:finally"}


async def test_a_stage_raising_a_channel_error_of_its_own_is_not_mistaken_for_a_gone_consumer():
    async def broken(ctx, upstream):
        yield 1
        raise anyio.BrokenResourceError

    with pytest.raises(anyio.BrokenResourceError):
        async for _ in Pipeline([broken]).run():
            pass


async def test_a_dropped_stream_cancels_its_stages():
    probe = Probe()
    done = anyio.Event()

    async def notify(ctx, upstream):
        try:
            async for x in upstream:
                yield x
        finally:
            done.set()

    stream = Pipeline([probe.source(), notify]).run()
    assert await stream.__anext__() == 0
    del stream  # a consumer that forgot to close: nothing else holds the stream
    with anyio.fail_after(5):
        await done.wait()
    assert "source:finally" in probe.events


async def test_close_stops_waiting_for_a_stage_that_shields_a_long_await_in_finally(monkeypatch, caplog):
    """_join is bounded: a misbehaving stage cannot hang aclose(); it is reported instead."""
    import omni_stream.pipeline as pipeline_module

    monkeypatch.setattr(pipeline_module, "JOIN_TIMEOUT", 0.01)
    finished = anyio.Event()

    async def stubborn(ctx, upstream):
        try:
            yield 1
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await finished.wait()  # never set until after aclose() returned

    stream = Pipeline([stubborn]).run()
    assert await stream.__anext__() == 1
    with anyio.fail_after(10):  # a hang guard, not a timing assertion
        await stream.aclose()
    assert not finished.is_set()
    assert "stages still running" in caplog.text
    finished.set()
    await asyncio.wait({stream._host})


async def test_channel_size_zero_buffers_nothing_on_the_edges():
    """What speech pipelines run with: each stage holds at most the one chunk it is handing over."""
    probe = Probe()
    async with Pipeline([probe.source(), probe.double(), probe.plus_one()], channel_size=0).run() as stream:
        assert await stream.__anext__() == 1
        await anyio.wait_all_tasks_blocked()
        assert probe.produced == 3 + 1  # one in each stage's hands, one consumed
        assert [await stream.__anext__() for _ in range(3)] == [3, 5, 7]
    assert probe.finals() == ALL_FINALS
