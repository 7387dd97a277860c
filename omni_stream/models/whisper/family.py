"""The Whisper family (``model_type: whisper``): batched transcription of whole utterances on the scheduler.

Loading (off the event loop): ``config.json``, ``generation_config.json`` (special ids, languages), the
tokenizer, the log-mel feature extractor, then the model (``transformers``' ``WhisperForConditionalGeneration``
from ``model.safetensors``; ``load_format="dummy"``: random weights at the config's sizes, no weight file read).
A request is checked at once (language, ``max_tokens``, length of whole-utterance audio: 400s naming the
field); in its stage the audio is collected (streamed input until its end), resampled to 16 kHz and turned into
features in a thread (over the audio alone, :mod:`~omni_stream.models.whisper.features`; in the smallest encoder
window that holds it where ``transcription_window_ms`` sets shorter windows:
:func:`~omni_stream.models.whisper.shapes.encoder_windows`), then decoded greedily by
:class:`~omni_stream.models.whisper.runner.WhisperRunner` on the scheduler, batched with every other request.
Usage: ``ctx.tokens("transcription")`` counts the prompt's text tokens plus 50 audio tokens per second of audio in
(Whisper's encoder frames, 20 ms each) and every generated token out. Utterances longer than the model's 30 s
window are refused (long-form chunking is not done here).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import torch

from omni_stream.chunks import Audio, TextDelta
from omni_stream.context import RequestContext
from omni_stream.errors import ConfigError, InvalidRequestError
from omni_stream.family import LoadContext, ModelKind
from omni_stream.models.whisper.checkpoint import build_model, randomize
from omni_stream.models.whisper.features import HOP, SAMPLES_PER_FRAME, window_features
from omni_stream.models.whisper.prompt import WhisperTokens
from omni_stream.models.whisper.runner import WhisperInput, WhisperRunner
from omni_stream.models.whisper.shapes import FRAMES_PER_SECOND, encoder_windows, window_for
from omni_stream.pipeline import Stage
from omni_stream.runtime.cache import EMBEDDED_MARKER
from omni_stream.runtime.intra_op import one_intra_op_thread
from omni_stream.runtime.settings import Tuning
from omni_stream.runtime.weights import parse_dtype
from omni_stream.scheduler import Scheduler
from omni_stream.speech.admission import DEFAULT_HOLD_S
from omni_stream.transcription.spec import Task, TranscriptionInfo, TranscriptionRequest
from omni_stream.transcription.stage import batched_transcription_stage, check_samples

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
AUDIO_TOKENS_PER_SECOND = 50  # encoder frames: 1500 for the 30 s window


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path.parent} is not a Whisper checkpoint: {path.name} is missing")
    return json.loads(path.read_text(encoding="utf-8"))


class WhisperFamily:
    """A loaded Whisper checkpoint. ``runner``, ``scheduler``, ``tokenizer`` are public for tests."""

    def __init__(self, load: LoadContext) -> None:
        from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperTokenizer

        opts, ckpt = load.options, load.checkpoint
        if opts.load_format not in ("auto", "safetensors", "dummy"):
            raise ConfigError(f"load_format: must be auto, safetensors or dummy, got {opts.load_format!r}")
        device, dtype = opts.device, parse_dtype(opts.dtype, opts.device)
        self.embedded = (ckpt / EMBEDDED_MARKER).exists()
        with opts.progress_bar(total=3, desc=f"loading {ckpt.name}", unit="part") as bar:
            config = dict(load.config)
            gen = _read_json(ckpt / "generation_config.json")
            self.tokens = WhisperTokens.from_generation_config(gen, int(config.get("max_target_positions", 448)))
            self.tokenizer = WhisperTokenizer.from_pretrained(str(ckpt))
            self.features = WhisperFeatureExtractor.from_pretrained(str(ckpt))
            if self.features.sampling_rate != SAMPLE_RATE:
                raise ConfigError(f"preprocessor_config.json: sampling_rate must be {SAMPLE_RATE}")
            full = int(config.get("max_source_positions", 1500))
            if self.features.hop_length != HOP or self.features.n_samples != full * SAMPLES_PER_FRAME:
                raise ConfigError(
                    f"preprocessor_config.json: hop_length must be {HOP} and n_samples {full * SAMPLES_PER_FRAME} "
                    f"(the encoder's {full} frames), got {self.features.hop_length} and {self.features.n_samples}"
                )
            # Its first call sets up what later ones reuse (28 ms against 15 on a 2-core CPU): here, not in the first
            # request's transcript (a voice agent's first turn after start)
            self.features(np.zeros(SAMPLE_RATE, np.float32), sampling_rate=SAMPLE_RATE, return_tensors="pt")
            bar.update(1)
            if opts.load_format == "dummy":
                model = build_model(config, device=device, dtype=dtype)
                randomize(model, seed=0)
            else:
                model = WhisperForConditionalGeneration.from_pretrained(str(ckpt), dtype=dtype)
                model = model.to(device)  # type: ignore[arg-type]
                model = model.eval().requires_grad_(False)
            bar.update(1)
            self.runner = WhisperRunner(
                model, self.tokens, self.tokenizer, opts.max_batch_size, windows=windows(opts.tuning, full)
            )
            # On CUDA the encoder (per batch bucket) and the decoder step (per shape) replay graphs; capturing them
            # here keeps capture out of requests.
            self.capture_seconds = self.runner.capture_graphs()
            # A transcript never pauses at the engine's watermark: it is at most the decoder's positions of tokens,
            # holding them costs nothing, and a paused row would keep its batch slot and finish only after its
            # reader (a voice agent's session, on a busy event loop) caught up.
            self.scheduler = Scheduler(
                self.runner,
                load.worker,
                high_watermark=max(opts.max_buffered_frames, self.runner.positions + 1),
                metrics=load.metrics.scheduler("transcription"),
                name="transcription",
                hold=transcription_hold(opts.tuning, self.runner.device),  # a burst's pauses, one encoder pass
                bulk_slots=bulk_slots(opts.max_batch_size),  # recordings leave room for conversations' turns
            )
            bar.update(1)
        self.max_seconds = self.features.n_samples / SAMPLE_RATE  # the encoder's window (30 s)
        self.info = TranscriptionInfo(
            model_name=ckpt.name,
            model_type="whisper",
            kind=ModelKind.TRANSCRIPTION,
            sample_rate=SAMPLE_RATE,
            languages=tuple(self.tokens.languages) if self.tokens.multilingual else ("en",),
            max_seconds=self.max_seconds,
        )
        if self.embedded:
            log.warning("serving the embedded tiny Whisper %s: random weights, it transcribes noise", ckpt)

    # --- requests -------------------------------------------------------------------------------------------

    def count_text_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False).input_ids)

    def check_language(self, language: str | None) -> None:
        self.tokens.language_id(language)

    def transcription_stage(self, request: TranscriptionRequest, ctx: RequestContext) -> Stage[Audio, TextDelta]:
        language = self.tokens.language_id(request.language)
        if request.task is Task.TRANSLATE and self.tokens.translate is None:
            raise InvalidRequestError(f"{self.info.model_name} does not translate (an English-only model)", "model")
        check_samples(request, self.max_seconds)
        room = self.tokens.max_length - self.tokens.prompt(language).length
        if request.max_tokens is not None and request.max_tokens > room:
            raise InvalidRequestError(f"max_tokens must be at most {room} for this model", "max_tokens")

        async def prepare(ctx: RequestContext, samples: np.ndarray) -> WhisperInput:
            payload = await anyio.to_thread.run_sync(self._prepare, samples, request, language)
            seconds = samples.size / SAMPLE_RATE
            n_prompt = payload.prompt.length - self.tokens.prompt(language).length
            count = ctx.tokens(ModelKind.TRANSCRIPTION)
            count.input_audio_tokens = math.ceil(seconds * AUDIO_TOKENS_PER_SECOND)
            count.input_tokens = count.input_audio_tokens + n_prompt
            return payload

        return batched_transcription_stage(
            self.scheduler, request, prepare, sample_rate=SAMPLE_RATE, max_seconds=self.max_seconds
        )

    def _prepare(self, samples: np.ndarray, request: TranscriptionRequest, language: int | None) -> WhisperInput:
        """Log-mel features and the prompt (blocking: runs in a thread)."""
        window = window_for(samples.size / SAMPLE_RATE, self.runner.windows)
        with one_intra_op_thread():  # many utterances at once when many sessions pause together
            features = window_features(self.features, samples, window)  # the audio's frames, then silence
        context: tuple[int, ...] = ()
        if request.prompt and request.prompt.strip() and self.tokens.max_context:
            ids = self.tokenizer(" " + request.prompt.strip(), add_special_tokens=False).input_ids
            context = tuple(int(i) for i in ids if i < self.tokens.eot)[-self.tokens.max_context :]
        prompt = self.tokens.prompt(language, context, translate=request.task is Task.TRANSLATE)
        budget = self.tokens.max_length - prompt.length
        return WhisperInput(features, prompt, min(request.max_tokens or budget, budget), window)

    async def aclose(self) -> None:
        """Nothing to free beyond the scheduler, which the engine's worker shuts down."""


def transcription_hold(tuning: Tuning, device: torch.device) -> float:
    """Seconds newcomers wait for utterances still being prepared (``tuning.transcription_hold_ms``; unset: 50 ms
    on CUDA, none elsewhere: see the field's comment)."""
    ms = tuning.transcription_hold_ms
    if ms is None:
        ms = 1000 * DEFAULT_HOLD_S if device.type == "cuda" else 0.0
    return ms / 1000


def bulk_slots(max_batch_size: int) -> int:
    """Batch slots bulk transcripts (recordings sent to ``/v1/audio/transcriptions``) may hold at once: half, so a
    burst of uploaded files never keeps a voice agent's turns out of the encoder pass and decoder batch."""
    return max(1, max_batch_size // 2)


def windows(tuning: Tuning, full: int) -> tuple[int, ...]:
    """The encoder windows in frames (``tuning.transcription_window_ms``: the smallest; unset: the model's whole
    window alone, as Whisper was trained)."""
    ms = tuning.transcription_window_ms
    return encoder_windows(full, None if ms is None else math.ceil(ms * FRAMES_PER_SECOND / 1000))


def load_family(load: LoadContext) -> WhisperFamily:
    """Family loader for ``model_type: whisper`` (runs off the event loop)."""
    return WhisperFamily(load)
