"""The Qwen3-TTS family: load a hub-layout checkpoint and stream speech through talker and codec stages.

Loading (off the event loop, with a progress bar): config, text tokenizer, talker + code predictor, the
12 Hz speech tokenizer (decoder; encoder too for Base), the speaker encoder (Base). Requests arrive resolved and
checked by the engine (:mod:`omni_stream.validation.speech`, against :attr:`Qwen3TTSFamily.info`); tokenization,
voice-prompt extraction and model work run off the loop in the stages, where the tokenized prompt is fitted to the
talker's context.

A Base request's reference audio (speaker encoder and speech-tokenizer encoder) is extracted on a thread of its own
beside the device worker, one extraction at a time, on CUDA on a stream of its own: a departure from "every model
step on the worker" (ARCHITECTURE section 3), made because an extraction is one eager call of ~16 ms (c = 1 on the
H200) that the worker ran between talker steps, so every running stream waited for each newcomer's reference:
``tts_load`` run 46 (HTTP, references sent with each request) fell behind at 20 requests/s (85 % of streams
underran, TTFA p50 1.2 s) where the same requests with uploaded voices stayed continuous, and 64 such requests
at once queued 1.5 s. The worker's talker and codec steps go on meanwhile (their own streams), the reference's
kernels fill the device beside them.

``embedded_default_checkpoint()`` builds the tiny random-weight checkpoint the server uses when no model
is given: it speaks noise, and the loader says so.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import replace
from pathlib import Path
from typing import Literal

import anyio
import numpy as np
import torch

from omni_stream.chunks import Audio
from omni_stream.context import RequestContext
from omni_stream.errors import ConfigError
from omni_stream.family import LoadContext, ModelKind, SpeechInfo
from omni_stream.models.qwen3_tts.checkpoint import load_lm, write_tiny_checkpoint
from omni_stream.models.qwen3_tts.codec import load_speech_tokenizer
from omni_stream.models.qwen3_tts.codec_graphs import CodecWindows
from omni_stream.models.qwen3_tts.codec_stage import LiveCount, ReferenceCodes, codec_stage
from omni_stream.models.qwen3_tts.codec_stream import FirstWindow
from omni_stream.models.qwen3_tts.config import Qwen3TTSConfig, load_config, load_generation_defaults
from omni_stream.models.qwen3_tts.options import Qwen3TTSOptions, options_of
from omni_stream.models.qwen3_tts.prompt import TASK_OF_MODEL, TalkerRequest, prepare_request
from omni_stream.models.qwen3_tts.runner import Qwen3TTSRunner
from omni_stream.models.qwen3_tts.speaker_encoder import load_speaker_encoder
from omni_stream.models.qwen3_tts.tokenizer import TextTokenizer
from omni_stream.models.qwen3_tts.voice_cache import VoiceCache, voice_key
from omni_stream.pipeline import Chain
from omni_stream.requests import SpeechRequest, TaskType, VoicePrompt
from omni_stream.runtime.cache import EMBEDDED_MARKER, embedded_checkpoint_dir
from omni_stream.runtime.decoder_kernels import default_kernels
from omni_stream.runtime.gil import shorten_switch_interval
from omni_stream.runtime.gpu_completions import Completions
from omni_stream.runtime.offload import run_prepare
from omni_stream.runtime.settings import Tuning
from omni_stream.runtime.weights import parse_dtype
from omni_stream.runtime.worker_streams import REALTIME_PRIORITY
from omni_stream.scheduler import Scheduler
from omni_stream.speech.admission import PlaybackAdmission
from omni_stream.speech.limits import fit_context, max_input_chars
from omni_stream.speech.stages import talker_stage

log = logging.getLogger(__name__)

SAMPLE_RATE = 24000
# Streaming windows: the first audio chunk after a load-dependent number of frames (80 ms each; 1 when the
# engine is idle, codec_stream.first_window_frames), doubling up to the steady size.
STEADY_FRAMES = 25
EMBEDDED_NAME = "qwen3-tts-tiny-custom-voice-v1"


class Qwen3TTSFamily:
    """A loaded Qwen3-TTS checkpoint. ``runner``, ``scheduler`` and ``speech_tokenizer`` are public for tests."""

    def __init__(self, load: LoadContext) -> None:
        opts = load.options
        ckpt = load.checkpoint
        self.worker = load.worker
        device = opts.device
        dtype = parse_dtype(opts.dtype, device)
        if opts.load_format not in ("auto", "safetensors", "dummy"):
            raise ConfigError(f"load_format: must be auto, safetensors or dummy, got {opts.load_format!r}")
        load_format: Literal["auto", "dummy"] = "dummy" if opts.load_format == "dummy" else "auto"
        self.embedded = (ckpt / EMBEDDED_MARKER).exists()
        steps = 5
        with opts.progress_bar(total=steps, desc=f"loading {ckpt.name}", unit="part") as bar:
            self.config = cfg = load_config(ckpt)
            self.defaults = load_generation_defaults(ckpt)
            self.task = TASK_OF_MODEL[cfg.tts_model_type]
            bar.update(1)
            self.tokenizer = TextTokenizer(ckpt, cfg.talker.text_vocab_size)
            bar.update(1)
            lm = load_lm(ckpt, device=device, dtype=dtype, load_format=load_format)
            bar.update(1)
            self.speech_tokenizer = load_speech_tokenizer(
                ckpt, device, dtype, load_format, with_encoder=self.task is TaskType.BASE, tuning=opts.tuning
            ).eval()
            self.speaker_encoder = None
            self._extracting = threading.Lock()  # one extraction at a time: its modules and stream are shared
            cuda = torch.device(device).type == "cuda"
            # a newcomer's first audio waits for its extraction: with tuning.realtime_priority, at the realtime
            # work's priority (above image and video steps)
            extract_priority = REALTIME_PRIORITY if opts.tuning.realtime_priority else 0
            base = cuda and self.task is TaskType.BASE
            self._extract_stream = torch.cuda.Stream(device, priority=extract_priority) if base else None
            if self.task is TaskType.BASE:
                if cfg.speaker_encoder is None:
                    raise ConfigError("config field speaker_encoder_config: is required for base checkpoints")
                self.speaker_encoder = load_speaker_encoder(
                    ckpt, cfg.speaker_encoder, device, dtype, load_format
                ).eval()
                if self._extract_stream is not None:  # the weights' copies come first on the extraction stream
                    self._extract_stream.wait_stream(torch.cuda.current_stream(device))
            bar.update(1)
            tuning = opts.tuning
            kernels = default_kernels(torch.device(device), tuning)
            self.runner = Qwen3TTSRunner(
                lm,
                max_batch_size=opts.max_batch_size,
                fused=kernels or False,
                ahead=tuning.step_ahead,
                prefill_budget=tuning.prefill_budget,
            )
            # On CUDA the decode step replays per-bucket graphs; capturing them here keeps it out of requests.
            self.capture_seconds = self.runner.capture_graphs(progress=opts.progress_bar)
            # Streaming codec states in one slot-indexed pool, decoded by per-window-bucket graphs (CUDA only),
            # on a side stream of high priority unless tuning.codec_stream says otherwise (off: the talker's).
            self.codec_windows: CodecWindows | None = None
            self.completions: Completions | None = None
            if torch.device(device).type == "cuda":
                priority = codec_stream_priority(tuning.codec_stream)
                stream = None if priority is None else torch.cuda.Stream(device, priority=priority)
                self.codec_windows = CodecWindows(
                    self.speech_tokenizer.decoder, 2 * opts.max_batch_size, max_batch=opts.max_batch_size, stream=stream
                )
                self.capture_seconds += self.codec_windows.capture_graphs(progress=opts.progress_bar)
                # Hot loops on the worker and a busy event loop share the GIL: hand it over in 0.5 ms, not 5.
                shorten_switch_interval(tuning.switch_interval_ms)
            if self.capture_seconds:
                log.info("captured CUDA graphs in %.2f s", self.capture_seconds)
            self.live = LiveCount()
            self.runner.load = lambda: self.live.value  # the load a request's first audio window follows
            self.scheduler = Scheduler(
                self.runner,
                load.worker,
                high_watermark=opts.max_buffered_frames,
                metrics=load.metrics.scheduler("talker"),
                name="talker",
                admission=PlaybackAdmission() if tuning.admission else None,
                hold=tuning.burst_hold_ms / 1000,
                settle=tuning.admit_after_collect,
                due_wait=tuning.first_window_wait_ms / 1000,
            )
            if self.codec_windows is not None and self.codec_windows.stream is not None:
                # Codec jobs launched on their stream are collected by the worker itself: after every talker
                # step (the runner's hook), and when nothing else is runnable (a step source attached after
                # the scheduler, so a step's own codec jobs are collected in the same worker round).
                self.completions = Completions(self.worker, busy=self.scheduler.has_work)
                self.runner.after_step = self.completions.deliver_ready
            bar.update(1)
        self.sampling, self.subtalker_sampling = self.defaults.talker_sampling(), self.defaults.subtalker_sampling()
        self.info = speech_info(cfg, ckpt.name, self.speech_tokenizer.sample_rate, self.runner.max_len)
        self.voice_cache = VoiceCache(opts.tuning.voice_cache) if opts.tuning.voice_cache else None
        if self.embedded:
            log.warning(
                "loaded the embedded tiny checkpoint %s: random weights, it speaks noise "
                "(a real Qwen3-TTS checkpoint: omni-stream serve --model DIR, or AsyncEngine.from_pretrained(DIR))",
                ckpt,
            )

    # --- requests -------------------------------------------------------------------------------------------

    def count_text_tokens(self, text: str) -> int:
        """Tokens of ``text`` under the checkpoint's tokenizer (blocking: call it off the loop for long text)."""
        return self.tokenizer.count(text)

    @property
    def max_input_chars(self) -> int:
        """The longest ``input`` the talker's context holds with its default frame budget (characters)."""
        return max_input_chars(self.runner.max_len)

    def speech_stages(self, request: SpeechRequest, ctx: RequestContext) -> Chain[object, Audio]:
        task = TaskType(request.task_type or self.task)
        explicit = request.max_new_tokens is not None
        assert isinstance(request.text, str), "streamed text is split into units before it reaches a family"
        reference = ReferenceCodes()  # the talker stage's prompt hands the ICL reference codes to the codec stage
        first = FirstWindow(request.initial_codec_chunk_frames)  # decided by the runner at the first frame
        options = options_of(request.options)
        options = replace(options, subtalker_sampling=options.subtalker_sampling or self.subtalker_sampling)
        request = replace(request, sampling=request.sampling or self.sampling, options=options)
        context = self.runner.max_len

        async def prepare(ctx: RequestContext) -> TalkerRequest:
            voice_prompt = request.voice_prompt
            if task is TaskType.BASE and voice_prompt is None:
                assert request.ref_audio is not None
                ref_text = None if request.x_vector_only_mode else request.ref_text
                with ctx.fail_after("voice prompt extraction"):
                    voice_prompt = await self.create_voice_prompt(request.ref_audio, request.ref_sample_rate, ref_text)
            talker_request = await run_prepare(
                lambda: prepare_request(
                    request, self.config, self.tokenizer, voice_prompt=voice_prompt, defaults=self.defaults
                )
            )
            prompt = talker_request.prompt
            frames = fit_context(prompt.prefill_len, talker_request.max_new_tokens, context, explicit=explicit)
            talker_request = replace(talker_request, max_new_tokens=frames, first_window=first)
            usage = ctx.tokens(ModelKind.SPEECH)
            usage.input_audio_tokens = len(prompt.ref_codes) if prompt.ref_codes is not None else 0
            text_tokens = len(prompt.text_ids) + len(prompt.instruct_ids) + len(prompt.ref_text_ids or ())
            usage.input_tokens = text_tokens + usage.input_audio_tokens
            reference.codes = prompt.ref_codes
            return talker_request

        return Chain(talker_stage(self.scheduler, prepare)).then(
            codec_stage(
                self.speech_tokenizer.decoder,
                self.worker,
                sample_rate=self.speech_tokenizer.sample_rate,
                samples_per_frame=self.speech_tokenizer.samples_per_frame,
                initial_frames=request.initial_codec_chunk_frames,
                steady_frames=STEADY_FRAMES,
                pool=self.codec_windows,
                reference=reference,
                completions=self.completions,
                live=self.live,
                decided=first,
            )
        )

    # --- voices ---------------------------------------------------------------------------------------------

    def _extract_voice(self, audio: np.ndarray, ref_text: str | None) -> VoicePrompt:
        """The voice prompt of ``audio`` (blocking: on an extraction thread, see the module docstring)."""
        assert self.speaker_encoder is not None
        device = next(self.speaker_encoder.parameters()).device
        side = self._extract_stream
        with self._extracting, torch.inference_mode(), torch.cuda.stream(side) if side else contextlib.nullcontext():
            wav = torch.from_numpy(audio).to(device)
            x_vector = self.speaker_encoder.embed(wav).float().cpu().numpy()
            ref_codes = None
            if ref_text:
                ref_codes = self.speech_tokenizer.encode(wav).cpu().numpy().astype(np.int64)
        return VoicePrompt(x_vector=x_vector, ref_codes=ref_codes, ref_text=ref_text)

    async def create_voice_prompt(
        self, audio: np.ndarray, sample_rate: int, ref_text: str | None = None
    ) -> VoicePrompt:
        """Speaker x-vector (and, with ``ref_text``, the reference codes) of ``audio`` for Base cloning (float32
        mono samples the engine checked: :func:`omni_stream.validation.speech.check_reference`)."""
        assert self.task is TaskType.BASE, "the engine asks only a Base checkpoint for a cloning prompt"
        text = (ref_text or "").strip() or None
        key = None
        if self.voice_cache is not None:  # tuning.voice_cache: a reference sent again is not extracted again
            key = await anyio.to_thread.run_sync(voice_key, audio, sample_rate, text)
            if (kept := self.voice_cache.get(key)) is not None:
                return kept
        if sample_rate != SAMPLE_RATE:
            from omni_stream.codecs import resample

            audio = await anyio.to_thread.run_sync(resample, audio, sample_rate, SAMPLE_RATE)
        # A request cancelled or past its deadline leaves at once; the thread finishes the extraction, which holds
        # nothing of the request's, and its prompt is dropped.
        prompt = await anyio.to_thread.run_sync(
            self._extract_voice, np.ascontiguousarray(audio, dtype=np.float32), text, abandon_on_cancel=True
        )
        if key is not None and self.voice_cache is not None:
            self.voice_cache.put(key, prompt)
        return prompt

    def retune(self, tuning: Tuning) -> None:
        """Apply ``tuning``'s talker fields (``step_ahead``, ``admit_after_collect``, ``first_window_wait_ms``,
        ``prefill_budget``, ``voice_cache``) to this loaded family, so one engine measures them A/B
        (``benchmarks/tts_load.py --retune``). Only while no request is in the talker: a RuntimeError otherwise."""
        if self.runner.num_active or self.scheduler.waiting:
            raise RuntimeError("retune needs an idle talker: requests are running or waiting")
        self.runner.ahead = self.runner.device.type == "cuda" if tuning.step_ahead is None else tuning.step_ahead
        self.runner.prefill_budget = tuning.prefill_budget
        self.scheduler.pipelining(tuning.admit_after_collect, tuning.first_window_wait_ms / 1000)
        if (self.voice_cache.size if self.voice_cache is not None else 0) != tuning.voice_cache:
            self.voice_cache = VoiceCache(tuning.voice_cache) if tuning.voice_cache else None

    async def aclose(self) -> None:
        """Nothing to stop: models are freed with the family, the worker releases sequences and device jobs."""


def speech_info(cfg: Qwen3TTSConfig, model_name: str, sample_rate: int, context: int) -> SpeechInfo:
    """What a checkpoint of config ``cfg`` offers and how requests are checked against it (``context``: talker
    positions a request may take)."""
    task = TASK_OF_MODEL[cfg.tts_model_type]
    return SpeechInfo(
        model_name=model_name,
        model_type="qwen3_tts",
        kind=ModelKind.SPEECH,
        default_voice=cfg.speakers[0] if cfg.speakers else None,
        task_types=(task,),
        voices=cfg.speakers,
        languages=tuple(lang.capitalize() for lang in cfg.languages if lang != "auto"),
        sample_rate=sample_rate,
        default_task=task,
        max_input_chars=max_input_chars(context),
        speaker_embedding_dim=cfg.talker.decoder.hidden_size,
        options=Qwen3TTSOptions,
    )


def codec_stream_priority(mode: str) -> int | None:
    """The CUDA stream priority of the codec's windows for ``Tuning.codec_stream``: ``high`` (default) -100,
    ``normal`` 0, ``off`` None (no stream of their own: each window runs on the talker's stream, launched and waited
    for by the worker between talker steps). On a stream of their own the worker launches them and collects them
    after its next talker step.

    Measured on the H200 over the server (``benchmarks/results/tts_bench.md``, run 24, with the codec's run-24
    settings): in one call, c = 128 508 / 524x (HTTP / WebSocket) against 479 / 452x on the talker's stream and c =
    32 263 / 297x against 259 / 276x; c = 1 the same in every call (15.5-16.2x). Across machines the same setting
    spans 435-539x at c = 128, so the gain is the same-call comparison's. Runs 10-16 measured a loss when a window
    cost 1.5x as much.
    """
    return {"high": -100, "normal": 0, "off": None}[mode]


def load_family(load: LoadContext) -> Qwen3TTSFamily:
    """Family loader for ``model_type: qwen3_tts`` (runs off the event loop)."""
    return Qwen3TTSFamily(load)


def embedded_default_checkpoint(cache_dir: str | Path | None = None) -> Path:
    """The tiny CustomVoice checkpoint served when no model is given; built on first use (atomically)."""
    return embedded_checkpoint_dir(
        EMBEDDED_NAME,
        lambda out: write_tiny_checkpoint(out, "custom_voice", "0.6b", seed=0),
        "random weights: it speaks noise",
        cache_dir,
    )
