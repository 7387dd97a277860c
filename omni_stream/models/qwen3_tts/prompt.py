"""Talker prompts: request validation, the symbolic dual-track layout, and its embedding.

:func:`build_prompt` is pure CPU work (tokenization included) that runs off the event loop and raises
typed errors naming the offending request field. It yields a :class:`TalkerPrompt` holding ids only;
:func:`embed_prompt` turns that into prefill and trailing-text embeddings on the device thread
(QWEN3_TTS.md section 1.3: text and codec tracks are summed position by position).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from omni_stream.errors import InvalidRequestError, UnknownVoiceError, UnsupportedTaskError
from omni_stream.models.qwen3_tts.config import CODEBOOK_SIZE, NUM_CODE_GROUPS, GenerationDefaults, Qwen3TTSConfig
from omni_stream.models.qwen3_tts.tokenizer import TextTokenizer
from omni_stream.requests import SamplingParams, SpeechRequest, TaskType, VoicePrompt
from omni_stream.speech_limits import resolved_max_new_tokens

TASK_OF_MODEL = {"custom_voice": TaskType.CUSTOM_VOICE, "voice_design": TaskType.VOICE_DESIGN, "base": TaskType.BASE}
# Text layout the reference wrapper uses per task: all text in the prefill (True) or one token per step.
NON_STREAMING_TEXT = {TaskType.CUSTOM_VOICE: True, TaskType.VOICE_DESIGN: True, TaskType.BASE: False}


@dataclass(slots=True, frozen=True, eq=False)
class TalkerPrompt:
    """Ids of one prompt; embedded later by :func:`embed_prompt`."""

    instruct_ids: tuple[int, ...]  # whole "<|im_start|>user\n{instruct}<|im_end|>\n", or ()
    role_ids: tuple[int, ...]  # "<|im_start|>assistant\n"
    codec_tags: tuple[int, ...]  # think/nothink tags (with the language id when not auto)
    speaker_id: int | None  # CustomVoice speaker codec id
    x_vector: np.ndarray | None  # Base speaker embedding [hidden]
    text_ids: tuple[int, ...]
    ref_text_ids: tuple[int, ...] | None  # Base in-context only
    ref_codes: np.ndarray | None  # Base in-context only, [T_ref, 16]
    non_streaming: bool

    @property
    def icl(self) -> bool:
        return self.ref_codes is not None

    def _codec_len(self) -> int:
        return len(self.codec_tags) + int(self.speaker_id is not None or self.x_vector is not None) + 2

    def _icl_lens(self) -> tuple[int, int]:
        assert self.ref_text_ids is not None and self.ref_codes is not None
        return len(self.ref_text_ids) + len(self.text_ids) + 1, 1 + len(self.ref_codes)

    @property
    def prefill_len(self) -> int:
        """Positions in the talker prefill."""
        n = len(self.instruct_ids) + len(self.role_ids) + self._codec_len() - 1
        if self.icl:
            t1, t2 = self._icl_lens()
            return n + (t1 + t2 if self.non_streaming else t2)
        return n + (len(self.text_ids) + 2 if self.non_streaming else 1)

    @property
    def trailing_len(self) -> int:
        """Text embeddings fed one per decode step after the prefill (then ``tts_pad`` forever)."""
        if self.non_streaming:
            return 0
        if self.icl:
            t1, t2 = self._icl_lens()
            return max(t1 - t2, 0)
        return len(self.text_ids)


@dataclass(slots=True, frozen=True, eq=False)
class TalkerRequest:
    """What the talker runner needs for one sequence (the scheduler's ``Sequence.payload``)."""

    prompt: TalkerPrompt
    max_new_tokens: int
    sampling: SamplingParams
    subtalker_sampling: SamplingParams
    seed: int | None = None
    ignore_eos: bool = False
    request_id: str = ""


def resolve_task(request: SpeechRequest, cfg: Qwen3TTSConfig) -> TaskType:
    """The request's task; the checkpoint's own task when unset. Raises :class:`UnsupportedTaskError`."""
    own = TASK_OF_MODEL[cfg.tts_model_type]
    task = request.task_type
    if task is None:
        return own
    task = TaskType(task)
    if task != own:
        raise UnsupportedTaskError(
            f"task_type {task.value!r} is not supported by this {own.value} checkpoint (supported: {own.value!r})",
            "task_type",
        )
    return task


def _language(request: SpeechRequest, cfg: Qwen3TTSConfig) -> str:
    lang = (request.language or "auto").strip().lower()
    if lang not in cfg.languages:
        valid = ", ".join(x.capitalize() for x in cfg.languages)
        raise InvalidRequestError(f"unknown language {request.language!r}; valid languages: {valid}", "language")
    return lang


def _codec_tags(cfg: Qwen3TTSConfig, lang: str, speaker: str | None) -> tuple[int, ...]:
    t = cfg.talker
    lang_id = None if lang == "auto" else t.codec_language_id[lang]
    if speaker is not None and lang in ("chinese", "auto"):
        dialect = t.spk_is_dialect.get(speaker, False)
        if dialect is not False:
            lang_id = t.codec_language_id[str(dialect).lower()]
    if lang_id is None:
        return (t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id)
    return (t.codec_think_id, t.codec_think_bos_id, lang_id, t.codec_think_eos_id)


def _assistant_ids(tok: TextTokenizer, text: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    # Tokenize the whole template and slice by position, as the reference does, so BPE merges across the
    # template boundary come out the same.
    ids = tok.encode(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")
    text_ids = tuple(ids[3:-5])
    if not text_ids:
        raise InvalidRequestError("input text tokenizes to nothing", "input")
    return tuple(ids[:3]), text_ids


def _voice_prompt(
    request: SpeechRequest, cfg: Qwen3TTSConfig, voice_prompt: VoicePrompt | None
) -> tuple[np.ndarray, np.ndarray | None, str | None]:
    vp = voice_prompt or request.voice_prompt
    if vp is None:
        raise InvalidRequestError(
            "Base (voice cloning) models need a reference voice: give ref_audio or an uploaded voice", "ref_audio"
        )
    hidden = cfg.talker.decoder.hidden_size
    xv = np.asarray(vp.x_vector, dtype=np.float32).reshape(-1)
    if xv.shape != (hidden,) or not np.isfinite(xv).all():
        raise InvalidRequestError(
            f"voice_prompt.x_vector must be {hidden} finite floats, got shape {np.shape(vp.x_vector)}", "voice_prompt"
        )
    codes = None
    if not request.x_vector_only_mode and vp.ref_codes is not None:
        codes = np.asarray(vp.ref_codes)
        if codes.ndim != 2 or codes.shape[1] != NUM_CODE_GROUPS or codes.shape[0] < 1:
            raise InvalidRequestError(
                f"voice_prompt.ref_codes must be [frames, {NUM_CODE_GROUPS}], got shape {codes.shape}", "voice_prompt"
            )
        if not np.issubdtype(codes.dtype, np.integer) or codes.min() < 0 or codes.max() >= CODEBOOK_SIZE:
            raise InvalidRequestError(
                f"voice_prompt.ref_codes must be integers in [0, {CODEBOOK_SIZE})", "voice_prompt"
            )
        codes = codes.astype(np.int64)
    ref_text = request.ref_text if request.ref_text is not None else vp.ref_text
    return xv, codes, ref_text


def build_prompt(
    request: SpeechRequest,
    cfg: Qwen3TTSConfig,
    tokenizer: TextTokenizer,
    *,
    voice_prompt: VoicePrompt | None = None,
    non_streaming: bool | None = None,
) -> TalkerPrompt:
    """Validate ``request`` against the checkpoint and lay out its prompt (blocking; run off the loop).

    ``voice_prompt`` overrides ``request.voice_prompt`` (Base). ``non_streaming`` overrides the reference
    wrapper's per-task text layout (CustomVoice/VoiceDesign: all text in the prefill; Base: streamed text).
    """
    task = resolve_task(request, cfg)
    lang = _language(request, cfg)
    ns = NON_STREAMING_TEXT[task] if non_streaming is None else non_streaming
    speaker_name = None
    speaker_id = None
    x_vector = None
    ref_codes = None
    ref_text_ids = None
    instructions = (request.instructions or "").strip() or None
    if task is TaskType.CUSTOM_VOICE:
        valid = ", ".join(cfg.speakers)
        if not request.voice:
            raise InvalidRequestError(f"voice is required; valid voices: {valid}", "voice")
        speaker_name = request.voice.strip().lower()
        if speaker_name not in cfg.talker.spk_id:
            raise UnknownVoiceError(f"unknown voice {request.voice!r}; valid voices: {valid}", "voice")
        speaker_id = cfg.talker.spk_id[speaker_name]
        if not cfg.supports_instructions:
            instructions = None  # the 0.6B CustomVoice model was not trained with instructions
    elif task is TaskType.VOICE_DESIGN:
        if instructions is None:
            raise InvalidRequestError("VoiceDesign needs instructions describing the voice", "instructions")
    else:
        instructions = None
        x_vector, ref_codes, ref_text = _voice_prompt(request, cfg, voice_prompt)
        if ref_codes is not None:
            if not ref_text or not ref_text.strip():
                raise InvalidRequestError(
                    "in-context voice cloning needs ref_text (the transcript of the reference audio); "
                    "set x_vector_only_mode to clone from the speaker embedding alone",
                    "ref_text",
                )
            ref_ids = tokenizer.encode(f"<|im_start|>assistant\n{ref_text}<|im_end|>\n")
            ref_text_ids = tuple(ref_ids[3:-2])
    if not isinstance(request.text, str):
        raise TypeError("streamed text is split into units before a prompt is built")
    role_ids, text_ids = _assistant_ids(tokenizer, request.text)
    instruct_ids: tuple[int, ...] = ()
    if instructions is not None:
        instruct_ids = tuple(tokenizer.encode(f"<|im_start|>user\n{instructions}<|im_end|>\n"))
    return TalkerPrompt(
        instruct_ids=instruct_ids,
        role_ids=role_ids,
        codec_tags=_codec_tags(cfg, lang, speaker_name),
        speaker_id=speaker_id,
        x_vector=x_vector,
        text_ids=text_ids,
        ref_text_ids=ref_text_ids,
        ref_codes=ref_codes,
        non_streaming=ns,
    )


def prepare_request(
    request: SpeechRequest,
    cfg: Qwen3TTSConfig,
    tokenizer: TextTokenizer,
    *,
    voice_prompt: VoicePrompt | None = None,
    non_streaming: bool | None = None,
    defaults: GenerationDefaults | None = None,
) -> TalkerRequest:
    """:func:`build_prompt` plus the request's generation settings; unset sampling comes from ``defaults``
    (the checkpoint's ``generation_config.json``; None: the reference defaults)."""
    if not isinstance(request.text, str):
        raise TypeError("streamed text is split into units before a prompt is built")
    prompt = build_prompt(request, cfg, tokenizer, voice_prompt=voice_prompt, non_streaming=non_streaming)
    gen = defaults or GenerationDefaults()
    return TalkerRequest(
        prompt=prompt,
        max_new_tokens=resolved_max_new_tokens(request.text, request.max_new_tokens),
        sampling=request.sampling or gen.talker_sampling(),
        subtalker_sampling=request.subtalker_sampling or gen.subtalker_sampling(),
        seed=request.seed,
        ignore_eos=request.ignore_eos,
        request_id=request.request_id,
    )


@torch.no_grad()
def embed_prompt(talker, cfg: Qwen3TTSConfig, prompt: TalkerPrompt) -> tuple[torch.Tensor, torch.Tensor]:
    """(prefill ``[T, H]``, trailing text ``[N, H]``) for ``talker`` (a :class:`Talker`), on its device and dtype."""
    w = talker.codec_head.weight
    device, dtype = w.device, w.dtype

    def ids(x) -> torch.Tensor:
        return torch.tensor(list(x), dtype=torch.long, device=device)

    text = talker.embed_text
    codec = talker.embed_codec
    special = text(ids([cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id]))
    tts_bos, tts_eos, tts_pad = special[0:1], special[1:2], special[2:3]
    t = cfg.talker
    parts = [codec(ids(prompt.codec_tags))]
    if prompt.speaker_id is not None:
        parts.append(codec(ids([prompt.speaker_id])))
    elif prompt.x_vector is not None:
        parts.append(torch.as_tensor(prompt.x_vector).to(device=device, dtype=dtype)[None])
    parts.append(codec(ids([t.codec_pad_id, t.codec_bos_id])))
    codec_track = torch.cat(parts)
    n = codec_track.shape[0]
    out = [text(ids(prompt.instruct_ids))] if prompt.instruct_ids else []
    out.append(text(ids(prompt.role_ids)))
    out.append(torch.cat([tts_pad.expand(n - 2, -1), tts_bos]) + codec_track[:-1])
    empty = tts_pad[:0]
    if prompt.icl:
        assert prompt.ref_text_ids is not None and prompt.ref_codes is not None
        txt = torch.cat([text(ids(prompt.ref_text_ids + prompt.text_ids)), tts_eos])
        ref = talker.embed_frames(torch.as_tensor(prompt.ref_codes, device=device))
        cod = torch.cat([codec(ids([t.codec_bos_id])), ref])
        t1, t2 = txt.shape[0], cod.shape[0]
        if prompt.non_streaming:
            out += [txt + codec(ids([t.codec_pad_id] * t1)), cod + tts_pad]
            trailing = empty
        elif t1 > t2:
            out.append(txt[:t2] + cod)
            trailing = txt[t2:]
        else:
            out.append(torch.cat([txt, tts_pad.expand(t2 - t1, -1)]) + cod)
            trailing = empty
    elif prompt.non_streaming:
        n_text = len(prompt.text_ids)
        txt = torch.cat([text(ids(prompt.text_ids)), tts_eos])
        out += [txt + codec(ids([t.codec_pad_id] * (n_text + 1))), tts_pad + codec(ids([t.codec_bos_id]))]
        trailing = empty
    else:
        out.append(text(ids(prompt.text_ids[:1])) + codec_track[-1:])
        trailing = torch.cat([text(ids(prompt.text_ids[1:])), tts_eos])
    return torch.cat(out), trailing


@torch.no_grad()
def embed_tts_pad(talker, cfg: Qwen3TTSConfig) -> torch.Tensor:
    """``T(tts_pad)`` ``[H]``: the text track once a sequence's trailing text is used up."""
    w = talker.codec_head.weight
    return talker.embed_text(torch.tensor([cfg.tts_pad_token_id], device=w.device))[0]
