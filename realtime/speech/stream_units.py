"""Units of a speech WebSocket session: one engine request each, synthesized ahead and sent in order.

A :class:`UnitJob` pumps its engine stream into a bounded channel (so a slow socket pauses the request
through the engine's backpressure); the sender streams jobs in order while the next one is already
synthesizing. Cancelling a job releases its batch slot at once.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np
from anyio.abc import TaskGroup

from omni_stream.engine import AsyncEngine, SpeechStream
from omni_stream.realtime.common.audio_out import encode_whole, first_chunk_and_output, with_first
from omni_stream.realtime.common.streams import close_stream
from omni_stream.realtime.speech.stream_protocol import UnitSpec
from omni_stream.requests import next_request_id

log = logging.getLogger("omni_stream.realtime.ws")

CHANNEL_CHUNKS = 8  # encoded chunks a job may hold ahead of the socket


@dataclass(slots=True, frozen=True)
class Failure:
    """What a job's channel carries when generation failed."""

    error: BaseException


@dataclass(slots=True, eq=False)
class UnitJob:
    """A unit in flight: the pump task feeds ``receive`` with bytes, then ends (or carries a Failure)."""

    spec: UnitSpec
    sample_rate: int
    cancelled: bool = False
    started: bool = False
    seconds: float = 0.0  # playing time of a whole-file unit, known once its file is encoded
    refusal: BaseException | None = None  # why it may not run (its voice deleted since the config): it fails at once
    _scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    _send: Any = None
    receive: Any = None

    def __post_init__(self) -> None:
        self._send, self.receive = anyio.create_memory_object_stream[bytes | Failure](CHANNEL_CHUNKS)

    def start(self, tg: TaskGroup, engine: AsyncEngine) -> None:
        tg.start_soon(self._pump, engine)

    def cancel(self) -> None:
        """Stop the job now (safe from any task): its stream is released and its channel ends."""
        self.cancelled = True
        self._scope.cancel()

    async def _pump(self, engine: AsyncEngine) -> None:
        spec = self.spec
        request = dataclasses.replace(spec.template, text=spec.text, request_id=next_request_id("ws"))
        stream = None
        async with self._send:
            with self._scope:
                try:
                    if self.refusal is not None:
                        raise self.refusal
                    stream = engine.speech(request)
                    if spec.opts.stream_audio:
                        await self._stream_pcm(stream)
                    else:
                        await self._whole_file(stream)
                except Exception as exc:
                    log.warning("unit %d/%d failed: %s", spec.utterance, spec.sentence, exc)
                    await self._send.send(Failure(exc))
                finally:
                    await close_stream(stream)

    async def _stream_pcm(self, stream: SpeechStream) -> None:
        chunks = aiter(stream)
        first, out = await first_chunk_and_output(chunks, "pcm", self.sample_rate, self.spec.opts.sample_rate)
        try:
            async for audio in with_first(first, chunks):
                data = await out.encode(audio.samples)
                if data:
                    await self._send.send(data)
            tail = await out.finish()
            if tail:
                await self._send.send(tail)
        finally:
            out.close()

    async def _whole_file(self, stream: SpeechStream) -> None:
        pieces = [audio.samples async for audio in stream]
        samples = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        opts = self.spec.opts
        data, _ = await anyio.to_thread.run_sync(
            encode_whole, opts.response_format, samples, self.sample_rate, opts.sample_rate, opts.speed
        )
        self.seconds = samples.size / self.sample_rate / opts.speed
        await self._send.send(data)
