"""The synthetic TTS family: the shared talker stage on the batch scheduler, codec stage on batched worker jobs.

It runs the same code paths a real model does (scheduler sessions, watermarks, ``submit_batched`` codec
windows, voice prompts on the worker) with deterministic output: tests and CPU benchmarks only.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np

from omni_stream.chunks import Audio, CodecFrames
from omni_stream.context import RequestContext
from omni_stream.family import LoadContext, ModelKind, SpeechInfo
from omni_stream.metrics import EngineMetrics
from omni_stream.pipeline import Chain, Stage
from omni_stream.requests import SpeechRequest, TaskType, VoicePrompt
from omni_stream.scheduler import Scheduler
from omni_stream.speech.limits import MAX_INPUT_CHARS, resolved_max_new_tokens
from omni_stream.speech.stages import CodecWindow, WindowDecode, codec_stage, talker_stage
from omni_stream.worker import DeviceWorker
from synthetic.config import Faults, SyntheticConfig
from synthetic.model import (
    SyntheticCodec,
    SyntheticFault,
    SyntheticTalker,
    TalkerInput,
    parse_faults,
)

_X_VECTOR_DIM = 8


def _prompt_tone(prompt: VoicePrompt) -> int:
    return 32 + zlib.crc32(np.ascontiguousarray(prompt.x_vector, dtype=np.float32).tobytes()) % 16


class SyntheticFamily:
    """A loaded synthetic checkpoint. ``talker``, ``codec`` and ``scheduler`` are public for tests."""

    def __init__(
        self,
        config: SyntheticConfig,
        worker: DeviceWorker,
        *,
        max_batch_size: int = 32,
        max_buffered_frames: int = 25,
        metrics: EngineMetrics | None = None,
        record: bool = False,
    ) -> None:
        self.config = config
        self.worker = worker
        self.talker = SyntheticTalker(config, max_batch_size, record=record)
        self.codec = SyntheticCodec(config)
        self.scheduler = Scheduler(
            self.talker,
            worker,
            high_watermark=max_buffered_frames,
            metrics=metrics.scheduler("talker") if metrics is not None else None,
            name="talker",
        )
        self.info = SpeechInfo(
            model_name=config.model_name,
            model_type=config.model_type,
            kind=ModelKind.SPEECH,
            default_voice=config.voices[0] if config.voices else None,
            task_types=tuple(TaskType(t) for t in config.task_types),
            voices=config.voices,
            languages=config.languages,
            sample_rate=config.sample_rate,
            default_task=TaskType(config.default_task),
            max_input_chars=MAX_INPUT_CHARS,
            speaker_embedding_dim=_X_VECTOR_DIM,
        )

    # --- requests ---

    def count_text_tokens(self, text: str) -> int:
        """Byte-level tokens: one per UTF-8 byte."""
        return len(text.encode("utf-8"))

    def speech_stages(self, request: SpeechRequest, ctx: RequestContext) -> Chain[object, Audio]:
        task = TaskType(request.task_type or self.info.default_task)  # resolved by the engine
        assert isinstance(request.text, str), "streamed text is split into units before it reaches a family"
        text, faults = parse_faults(request.text) if self.config.fault_markers else (request.text, Faults())
        # The tone's own length (its end of speech), within the request's budget (max_new_tokens or the default).
        budget = resolved_max_new_tokens(text, request.max_new_tokens)
        if request.ignore_eos:
            n_frames = budget
        else:
            n_frames = min(budget, max(1, round(len(text.strip()) * self.config.frames_per_char)))
        ctx.tokens(ModelKind.SPEECH).input_tokens = self.count_text_tokens(request.text) + self.count_text_tokens(
            request.instructions or ""
        )
        ramp = self.config.codec_windows
        if request.initial_codec_chunk_frames is not None:
            ramp = (
                (request.initial_codec_chunk_frames, *ramp[1:])
                if len(ramp) > 1
                else (request.initial_codec_chunk_frames, ramp[0])
            )
        return Chain(self._talker_stage(request, task, n_frames, faults)).then(self._codec_stage(faults, ramp))

    async def _tone(self, request: SpeechRequest, task: TaskType, ctx: RequestContext) -> int:
        if task is TaskType.CUSTOM_VOICE:
            voices = [v.lower() for v in self.info.voices]
            return 1 + voices.index((request.voice or self.info.voices[0]).lower())
        if task is TaskType.VOICE_DESIGN:
            return 16 + zlib.crc32((request.instructions or "").encode("utf-8")) % 16
        prompt: VoicePrompt | None = request.voice_prompt
        if prompt is None:
            assert request.ref_audio is not None
            prompt = await ctx.wait(
                self.worker.submit(self._extract, request.ref_audio, request.ref_sample_rate, request.ref_text),
                "voice prompt extraction",
            )
        assert prompt is not None
        return _prompt_tone(prompt)

    def _talker_stage(
        self, request: SpeechRequest, task: TaskType, n_frames: int, faults: Faults
    ) -> Stage[object, CodecFrames]:
        async def prepare(ctx: RequestContext) -> TalkerInput:
            return TalkerInput(n_frames=n_frames, tone=await self._tone(request, task, ctx), faults=faults)

        return talker_stage(self.scheduler, prepare)

    def _codec_stage(self, faults: Faults, ramp: tuple[int, ...]) -> Stage[CodecFrames, Audio]:
        """The shared windowed codec stage over the synthetic codec (batched worker jobs per window size)."""
        worker, codec = self.worker, self.codec

        @asynccontextmanager
        async def open_decoder(ctx: RequestContext) -> AsyncIterator[WindowDecode]:
            async def decode(ctx: RequestContext, window: CodecWindow) -> np.ndarray:
                job = worker.submit_batched(("synthetic-codec", window.n_frames), window, codec.decode)
                samples = await ctx.wait(job, "codec decode")
                if faults.stage_at == window.index:
                    raise SyntheticFault(f"synthetic codec stage failure at chunk {window.index}")
                return samples

            yield decode  # no per-request codec state

        return codec_stage(
            open_decoder,
            sample_rate=self.config.sample_rate,
            samples_per_frame=self.config.samples_per_frame,
            windows=lambda index: ramp[min(index, len(ramp) - 1)],
        )

    # --- voices ---

    def _extract(self, audio: np.ndarray, sample_rate: int, ref_text: str | None) -> VoicePrompt:
        duration = audio.size / sample_rate
        signs = np.signbit(audio)
        stats = [
            float(np.sqrt(np.mean(audio.astype(np.float64) ** 2))),
            float(audio.mean()),
            float(np.abs(audio).max()),
            float(np.count_nonzero(signs[1:] != signs[:-1]) / max(duration, 1e-9)),
            duration,
        ]
        x_vector = np.zeros(_X_VECTOR_DIM, np.float32)
        x_vector[: len(stats)] = stats
        ref_codes = None
        if ref_text:
            n = max(1, math.ceil(duration / self.config.frame_seconds))
            ref_codes = np.zeros((n, self.config.n_codebooks), np.int64)
            ref_codes[:, 0] = np.arange(n) % self.config.codebook_size
            ref_codes[:, 1] = _prompt_tone(VoicePrompt(x_vector=x_vector))
        return VoicePrompt(x_vector=x_vector, ref_codes=ref_codes, ref_text=ref_text)

    async def create_voice_prompt(
        self, audio: np.ndarray, sample_rate: int, ref_text: str | None = None
    ) -> VoicePrompt:
        """The prompt of float32 mono ``audio`` the engine checked (check_reference)."""
        return await self.worker.submit(self._extract, audio, sample_rate, ref_text)

    async def aclose(self) -> None:
        """Nothing to free beyond the scheduler, which the engine's worker shuts down."""


def load_family(load: LoadContext) -> SyntheticFamily:
    """Family loader for ``model_type: synthetic_tts`` (runs off the event loop)."""
    with load.options.progress_bar(total=2, desc=f"loading {load.checkpoint.name}") as bar:
        config = SyntheticConfig.from_dict(load.config)
        bar.update(1)
        family = SyntheticFamily(
            config,
            load.worker,
            max_batch_size=load.options.max_batch_size,
            max_buffered_frames=load.options.max_buffered_frames,
            metrics=load.metrics,
        )
        bar.update(1)
    return family
