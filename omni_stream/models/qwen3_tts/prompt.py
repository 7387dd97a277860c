"""Talker prompts: the symbolic dual-track layout of a request, and its embedding.

:func:`build_prompt` is pure CPU work (tokenization included) that runs off the event loop, on a request the
engine has resolved (:mod:`omni_stream.validation.speech`: its task, voice and language are the checkpoint's); what
only this family knows (a cloning prompt's codec codes) it checks itself, naming the field. It yields a
:class:`TalkerPrompt` holding ids only; :func:`prompt_rows` lays it out as ids per position (QWEN3_TTS.md
section 1.3: text and codec tracks are summed position by position) and :func:`embed_prompts` turns the prompts
of a step into prefill and trailing-text embeddings on the device thread, all of them together.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from omni_stream.errors import InvalidRequestError
from omni_stream.models.qwen3_tts.codec_stream import FirstWindow
from omni_stream.models.qwen3_tts.config import CODEBOOK_SIZE, NUM_CODE_GROUPS, GenerationDefaults, Qwen3TTSConfig
from omni_stream.models.qwen3_tts.options import options_of
from omni_stream.models.qwen3_tts.tokenizer import TextTokenizer
from omni_stream.requests import SamplingParams, SpeechRequest, TaskType, VoicePrompt
from omni_stream.speech.limits import resolved_max_new_tokens

TASK_OF_MODEL = {"custom_voice": TaskType.CUSTOM_VOICE, "voice_design": TaskType.VOICE_DESIGN, "base": TaskType.BASE}
# Text layout the reference wrapper uses per task: all text in the prefill (True) or one token per step.
NON_STREAMING_TEXT = {TaskType.CUSTOM_VOICE: True, TaskType.VOICE_DESIGN: True, TaskType.BASE: False}


@dataclass(slots=True, frozen=True, eq=False)
class TalkerPrompt:
    """Ids of one prompt; embedded later by :func:`embed_prompts`."""

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
    # The request's first audio window, decided by the runner at its first frame (None: it is not told).
    first_window: FirstWindow | None = None


def task_of(request: SpeechRequest, cfg: Qwen3TTSConfig) -> TaskType:
    """The request's task (the engine set it); the checkpoint's own task when unset."""
    return TaskType(request.task_type) if request.task_type is not None else TASK_OF_MODEL[cfg.tts_model_type]


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
    assert vp is not None, "the engine gives a Base request a reference (resolve_speech)"
    xv = np.asarray(vp.x_vector, dtype=np.float32).reshape(-1)  # its size: the engine checked it
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
    task = task_of(request, cfg)
    lang = (request.language or "auto").strip().lower()  # the engine's spelling of one of cfg.languages
    ns = NON_STREAMING_TEXT[task] if non_streaming is None else non_streaming
    speaker_name = None
    speaker_id = None
    x_vector = None
    ref_codes = None
    ref_text_ids = None
    instructions = (request.instructions or "").strip() or None
    if task is TaskType.CUSTOM_VOICE:
        speaker_name = (request.voice or cfg.speakers[0]).strip().lower()  # the engine checked it is a speaker
        speaker_id = cfg.talker.spk_id[speaker_name]
        if not cfg.supports_instructions:
            instructions = None  # the 0.6B CustomVoice model was not trained with instructions
    elif task is not TaskType.VOICE_DESIGN:
        instructions = None
        x_vector, ref_codes, ref_text = _voice_prompt(request, cfg, voice_prompt)
        if ref_codes is not None:
            assert ref_text, "the engine refuses in-context cloning without a transcript (resolve_speech)"
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
    (the checkpoint's ``generation_config.json``; None: the reference defaults), and so does the ceiling of the
    default frame budget (its ``max_new_tokens``: a request that names none generates at most the smaller of that
    and :func:`~omni_stream.speech.limits.frame_budget` of its text; one that names it gets it). The request's
    :class:`~.options.Qwen3TTSOptions` give the code predictor's sampling and the prompt layout (``non_streaming``
    overrides it)."""
    if not isinstance(request.text, str):
        raise TypeError("streamed text is split into units before a prompt is built")
    options = options_of(request.options)
    layout = options.non_streaming_mode if non_streaming is None else non_streaming
    prompt = build_prompt(request, cfg, tokenizer, voice_prompt=voice_prompt, non_streaming=layout)
    gen = defaults or GenerationDefaults()
    frames = resolved_max_new_tokens(request.text, request.max_new_tokens)
    if request.max_new_tokens is None:
        frames = min(frames, gen.max_new_tokens)
    return TalkerRequest(
        prompt=prompt,
        max_new_tokens=frames,
        sampling=request.sampling or gen.talker_sampling(),
        subtalker_sampling=options.subtalker_sampling or gen.subtalker_sampling(),
        seed=request.seed,
        ignore_eos=request.ignore_eos,
        request_id=request.request_id,
    )


@dataclass(slots=True, frozen=True)
class PromptRows:
    """Where each embedding row of one prompt comes from (host-side, pure): prefill row ``i`` is the sum of
    ``T(text[i])``, ``C(codec[i])`` and row ``extra[i]`` of the prompt's extra block (its x-vector, then its
    reference frames), each -1 where absent (at most two are present); ``trailing`` the text ids fed one a
    decode step after the prefill."""

    text: list[int]
    codec: list[int]
    extra: list[int]
    trailing: list[int]


def prompt_rows(cfg: Qwen3TTSConfig, prompt: TalkerPrompt) -> PromptRows:
    """The dual-track layout of QWEN3_TTS.md section 1.3 as ids per position."""
    t = cfg.talker
    pad, bos, eos = cfg.tts_pad_token_id, cfg.tts_bos_token_id, cfg.tts_eos_token_id
    text: list[int] = []
    codec: list[int] = []
    extra: list[int] = []

    def row(text_id: int = -1, codec_id: int = -1, extra_row: int = -1) -> None:
        text.append(text_id)
        codec.append(codec_id)
        extra.append(extra_row)

    # The codec track: tags, the speaker (a codec id, or the x-vector as extra row 0), pad, bos.
    track: list[tuple[int, int]] = [(c, -1) for c in prompt.codec_tags]
    x_vector = prompt.speaker_id is None and prompt.x_vector is not None
    if prompt.speaker_id is not None:
        track.append((prompt.speaker_id, -1))
    elif x_vector:
        track.append((-1, 0))
    track += [(t.codec_pad_id, -1), (t.codec_bos_id, -1)]
    n = len(track)
    for i in (*prompt.instruct_ids, *prompt.role_ids):
        row(i)
    for i, (c, e) in enumerate(track[:-1]):
        row(pad if i < n - 2 else bos, c, e)
    trailing: list[int] = []
    if prompt.icl:
        assert prompt.ref_text_ids is not None and prompt.ref_codes is not None
        txt = [*prompt.ref_text_ids, *prompt.text_ids, eos]
        first_ref = int(x_vector)  # the reference frames follow the x-vector in the extra block
        cod = [(t.codec_bos_id, -1)] + [(-1, first_ref + j) for j in range(len(prompt.ref_codes))]
        t1, t2 = len(txt), len(cod)
        if prompt.non_streaming:
            for i in txt:
                row(i, t.codec_pad_id)
            for c, e in cod:
                row(pad, c, e)
        else:
            for j, (c, e) in enumerate(cod):
                row(txt[j] if j < t1 else pad, c, e)
            trailing = txt[t2:]
    elif prompt.non_streaming:
        for i in (*prompt.text_ids, eos):
            row(i, t.codec_pad_id)
        row(pad, t.codec_bos_id)
    else:
        if prompt.text_ids:
            row(prompt.text_ids[0], track[-1][0], track[-1][1])
        trailing = [*prompt.text_ids[1:], eos]
    return PromptRows(text, codec, extra, trailing)


def _extra_block(talker, prompt: TalkerPrompt, device: torch.device, dtype: torch.dtype) -> list[torch.Tensor]:
    parts = []
    if prompt.speaker_id is None and prompt.x_vector is not None:
        parts.append(torch.as_tensor(prompt.x_vector).to(device=device, dtype=dtype)[None])
    if prompt.icl:
        parts.append(talker.embed_frames(torch.as_tensor(prompt.ref_codes, device=device)))
    return parts


def _table_index(ids: list[int], table: dict[int, int]) -> list[int]:
    """Rows of ``ids`` in a table whose row 0 is zeros (-1 -> 0); new ids are appended to ``table``."""
    return [0 if i < 0 else table.setdefault(i, len(table) + 1) for i in ids]


@torch.no_grad()
def embed_prompts(talker, cfg: Qwen3TTSConfig, prompts: list[TalkerPrompt]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(prefill ``[T, H]``, trailing text ``[N, H]``) of each prompt, for ``talker`` (a :class:`Talker`).

    The prompts of a step are embedded together: one copy of every prompt's ids to the device, one text
    projection and one codec lookup over the distinct ids, then one gather per table for every prompt's rows at
    once (the prompts' results are views of those rows). Embedded alone, each prompt cost about eight blocking
    copies and thirty launches (~1 ms a newcomer when a burst is admitted on the H200, run 22); gathered prompt
    by prompt, five launches a newcomer.
    """
    w = talker.codec_head.weight
    device, dtype = w.device, w.dtype
    layouts = [prompt_rows(cfg, p) for p in prompts]
    texts: dict[int, int] = {}
    codecs: dict[int, int] = {}
    blocks: list[torch.Tensor] = []
    text_rows: list[int] = []  # every prefill's rows of each table, prompt after prompt, then the trailing text
    codec_rows: list[int] = []
    extra_rows: list[int] = []
    base = 1  # row 0 of each table is zeros
    for prompt, rows in zip(prompts, layouts, strict=True):
        extras = _extra_block(talker, prompt, device, dtype)
        text_rows += _table_index(rows.text, texts)
        codec_rows += _table_index(rows.codec, codecs)
        extra_rows += [0 if e < 0 else base + e for e in rows.extra]
        base += sum(x.shape[0] for x in extras)
        blocks += extras
    for rows in layouts:
        text_rows += _table_index(rows.trailing, texts)
    host = torch.tensor([*texts, *codecs, *text_rows, *codec_rows, *extra_rows], dtype=torch.long)
    ids = (host.pin_memory() if device.type == "cuda" else host).to(device, non_blocking=True)
    n_text, n_codec, m = len(texts), len(codecs), len(codec_rows)
    zero = w.new_zeros(1, w.shape[1])
    text_table = torch.cat([zero, talker.embed_text(ids[:n_text])])
    codec_table = torch.cat([zero, talker.embed_codec(ids[n_text : n_text + n_codec])])
    extra_table = torch.cat([zero, *blocks])
    text_ids, codec_ids, extra_ids = ids[n_text + n_codec :].split([len(text_rows), m, m])
    texts_out = text_table[text_ids]
    prefill = (texts_out[:m] + codec_table[codec_ids]) + extra_table[extra_ids]  # x + 0 == x: a prompt's own sums
    out = prefill.split([len(rows.text) for rows in layouts])
    trailing = texts_out[m:].split([len(rows.trailing) for rows in layouts])
    return list(zip(out, trailing, strict=True))


def embed_prompt(talker, cfg: Qwen3TTSConfig, prompt: TalkerPrompt) -> tuple[torch.Tensor, torch.Tensor]:
    """(prefill ``[T, H]``, trailing text ``[N, H]``) of one prompt (:func:`embed_prompts` of one)."""
    return embed_prompts(talker, cfg, [prompt])[0]


@torch.no_grad()
def embed_tts_pad(talker, cfg: Qwen3TTSConfig) -> torch.Tensor:
    """``T(tts_pad)`` ``[H]``: the text track once a sequence's trailing text is used up."""
    w = talker.codec_head.weight
    return talker.embed_text(torch.tensor([cfg.tts_pad_token_id], device=w.device))[0]
