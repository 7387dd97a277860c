"""What :class:`~omni_stream.engine.AsyncEngine` hands back for a running request: its stream of outputs (outcome,
metrics, abort and close around a :class:`~omni_stream.pipeline.PipelineStream`) and its usage by model."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Generic, TypeVar

import anyio

from omni_stream.chunks import Audio, StageOutput, TextDelta
from omni_stream.context import RequestContext, TokenCount
from omni_stream.errors import EngineClosed, RequestCancelled
from omni_stream.family import ModelKind
from omni_stream.metrics import EngineMetrics
from omni_stream.pipeline import PipelineStream
from omni_stream.requests import SpeechRequest, Timings

T_co = TypeVar("T_co", covariant=True)
C_co = TypeVar("C_co", covariant=True)


@dataclass(slots=True, frozen=True)
class Usage:
    """One model's usage in a request: tokens in (``input_audio_tokens`` of them audio, e.g. a cloning reference's
    codec frames), tokens (text) or codec frames (speech) out, so far."""

    input_tokens: int = 0
    output_tokens: int = 0
    input_audio_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def input_text_tokens(self) -> int:
        return self.input_tokens - self.input_audio_tokens

    @classmethod
    def of(cls, count: TokenCount | None) -> Usage:
        if count is None:
            return cls()
        return cls(count.input_tokens, count.output_tokens, min(count.input_audio_tokens, count.input_tokens))


class EngineStream(Generic[T_co]):
    """One running request: outcome, metrics, abort and close around a :class:`PipelineStream` of ``T_co`` items
    (the base of :class:`RequestStream` and :class:`SpeechStream`)."""

    def __init__(self, request_id: str, stream: PipelineStream[T_co], metrics: EngineMetrics | None) -> None:
        self._request_id = request_id
        self._stream = stream
        self._metrics = metrics
        self._outcome: str | None = None

    @property
    def request_id(self) -> str:
        return self._request_id

    @property
    def ctx(self) -> RequestContext:
        return self._stream.ctx

    @property
    def timings(self) -> Timings:
        return self.ctx.timings

    @property
    def outcome(self) -> str | None:
        """``ok``, ``error``, ``cancelled`` or ``deadline`` once the request has ended; None while it runs."""
        return self._outcome

    @property
    def live(self) -> bool:
        """Whether the request may still run (not started yet, or running)."""
        return self._outcome is None and self._stream.live

    async def _next(self) -> T_co:
        try:
            return await self._stream.__anext__()
        except StopAsyncIteration:
            self._finish("ok")
            raise
        except (anyio.get_cancelled_exc_class(), RequestCancelled, EngineClosed):  # aborted, or the engine closed
            self._finish("cancelled")
            raise
        except TimeoutError:
            self._finish("deadline")
            raise
        except BaseException:
            self._finish("error")
            raise

    def _finish(self, outcome: str) -> None:
        if self._outcome is not None:
            return
        self._outcome = outcome
        self.timings.finished = self.timings.finished or time.perf_counter()
        if self._metrics is not None:
            self._metrics.observe_request(self.timings, outcome)

    def start(self) -> None:
        """Start the request's stages now (otherwise the first iteration does), so requests read one after another
        can run together. Must run on the event loop."""
        self._stream.start()

    def abort(self, exc: BaseException | None = None) -> None:
        """Stop generating now, without waiting; with ``exc``, the next ``__anext__`` raises it."""
        self._stream.cancel(exc)

    async def aclose(self) -> None:
        """Stop generating and free the request's batch slots before the next model step."""
        await self._stream.aclose()
        self._finish("cancelled")


class RequestStream(EngineStream[StageOutput[C_co]]):
    """The outputs of every emitting stage of one request, in arrival order (their chunks are ``C_co``: the
    overloads of :meth:`AsyncEngine.generate`); ``usage`` by model kind."""

    def __init__(self, stream: PipelineStream[StageOutput[C_co]], metrics: EngineMetrics | None, pipeline: str) -> None:
        super().__init__(stream.ctx.request_id, stream, metrics)
        self.pipeline = pipeline

    @property
    def usage(self) -> dict[str, Usage]:
        """Tokens in and out so far by model kind (``"text"``, ``"speech"``, ...)."""
        return {str(kind): Usage.of(count) for kind, count in self.ctx.usage.items()}

    def __aiter__(self) -> RequestStream[C_co]:
        return self

    async def __anext__(self) -> StageOutput[C_co]:
        out = await self._next()
        if isinstance(out.chunk, Audio):
            self.timings.record_chunk(out.chunk.duration)
        if self.timings.first_output is None:
            self.timings.first_output = time.perf_counter()
        return out

    async def __aenter__(self) -> RequestStream[C_co]:
        await self._stream.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class SpeechStream(EngineStream[Audio | TextDelta]):
    """Audio chunks of one speech request (streamed text's unit transcripts between them are left out); ``usage``
    and ``timings`` fill in as it streams."""

    def __init__(
        self, request: SpeechRequest, stream: PipelineStream[Audio | TextDelta], metrics: EngineMetrics | None = None
    ) -> None:
        super().__init__(request.request_id, stream, metrics)
        self.request = request

    @property
    def usage(self) -> Usage:
        """Text tokens in, codec frames out (so far)."""
        return Usage.of(self.ctx.usage.get(ModelKind.SPEECH))

    def __aiter__(self) -> SpeechStream:
        return self

    async def __anext__(self) -> Audio:
        while True:
            chunk = await self._next()
            if isinstance(chunk, Audio):
                self.timings.record_chunk(chunk.duration)
                return chunk
            # streamed text: the unit transcripts between the audio are not part of a speech stream

    async def __aenter__(self) -> SpeechStream:
        await self._stream.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
