"""The ``Encoder`` base class: input validation, resampling to the codec's rate, state, non-streamed buffering."""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod

import numpy as np

from .errors import UnsupportedFormatError
from .formats import coding_rate, format_info
from .pcm import as_frames
from .resample import Resampler


class EncoderState(enum.Enum):
    """Life of an encoder: OPEN until ``flush()`` (FINISHED) or ``close()`` (CLOSED)."""

    OPEN = "open"
    FINISHED = "finished"  # flush() has returned the tail
    CLOSED = "closed"  # closed without (or after) flushing; resources released


class Encoder(ABC):
    """Synchronous streaming encoder: ``encode(chunk) -> bytes`` as data becomes ready, ``flush() -> bytes`` at the end.

    ``sample_rate`` is the rate of the encoded stream (input is resampled to it when the codec needs another rate);
    ``max_holdback`` bounds how many input samples may have been passed to ``encode`` without their audio being in
    the bytes it returned so far. With ``streaming=False`` every byte comes back from ``flush()`` and formats with a
    length field (wav, flac) write the exact lengths.
    """

    format: str = ""
    # Codec-side bound on held-back samples at the coding rate (frame size, look-ahead, container pages).
    CODEC_HOLDBACK = 0

    def __init__(self, sample_rate: int, channels: int = 1, *, streaming: bool = True) -> None:
        info = format_info(self.format)
        if not isinstance(sample_rate, int | np.integer) or not 1000 <= sample_rate <= 384_000:
            raise UnsupportedFormatError(f"sample_rate must be an integer in 1000..384000 Hz, got {sample_rate!r}")
        if not isinstance(channels, int | np.integer) or not 1 <= channels <= info.max_channels:
            raise UnsupportedFormatError(f"{self.format} supports 1..{info.max_channels} channels, got {channels!r}")
        self.input_rate = int(sample_rate)
        self.sample_rate = coding_rate(self.format, self.input_rate)
        self.channels = int(channels)
        self.streaming = streaming
        self.mime_type = info.mime_type
        self.extension = info.extension
        self.state = EncoderState.OPEN
        self._resampler = (
            Resampler(self.input_rate, self.sample_rate, self.channels) if self.sample_rate != self.input_rate else None
        )
        self._held: list[bytes] = []

    @property
    def max_holdback(self) -> int:
        """Upper bound on input samples fed to ``encode`` but not yet reflected in its output (streaming mode)."""
        bound = -(-self._codec_holdback() * self.input_rate // self.sample_rate)
        if self._resampler is not None:
            bound += self._resampler.lookahead + 1
        return bound

    def encode(self, pcm: np.ndarray) -> bytes:
        """Encode one chunk (float32 in [-1, 1] or int16, shape (n,) or (n, channels)); returns the bytes ready now."""
        if self.state is not EncoderState.OPEN:
            raise ValueError(f'Cannot call "encode" once the encoder is {self.state.value}.')
        x = as_frames(pcm, self.channels)
        if self._resampler is not None:
            x = self._resampler.process(x).reshape(-1, self.channels)
        return self._out(self._encode(x) if len(x) else b"")

    def flush(self) -> bytes:
        """Finish the stream and return its remaining bytes (the whole file when ``streaming=False``)."""
        if self.state is not EncoderState.OPEN:
            raise ValueError(f'Cannot call "flush" once the encoder is {self.state.value}.')
        tail = b""
        if self._resampler is not None:
            x = self._resampler.flush().reshape(-1, self.channels)
            tail = self._encode(x) if len(x) else b""
        tail += self._finish()
        self.state = EncoderState.FINISHED
        self._release()
        if self.streaming:
            return tail
        self._held.append(tail)
        whole = self._whole(b"".join(self._held))
        self._held.clear()
        return whole

    def close(self) -> None:
        """Release codec resources without finishing the stream; idempotent."""
        if self.state is EncoderState.OPEN:
            self.state = EncoderState.CLOSED
        self._held.clear()
        self._release()

    def __enter__(self) -> Encoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _out(self, data: bytes) -> bytes:
        if self.streaming:
            return data
        if data:
            self._held.append(data)
        return b""

    def _codec_holdback(self) -> int:
        """Hold-back of the codec itself, in samples at ``sample_rate``."""
        return self.CODEC_HOLDBACK

    @abstractmethod
    def _encode(self, x: np.ndarray) -> bytes:
        """Encode ``(n, channels)`` samples (float32 or int16) at ``sample_rate``."""

    def _finish(self) -> bytes:
        return b""

    def _whole(self, data: bytes) -> bytes:
        """Turn the concatenated stream into the non-streamed file (e.g. fix length fields)."""
        return data

    def _release(self) -> None:  # noqa: B027 (optional hook)
        """Free codec resources (called once the stream is finished or closed)."""
