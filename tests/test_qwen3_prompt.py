"""Prompt building: requests checked against a checkpoint (typed errors naming the field), per-task text layouts,
prompt lengths, the tokenizer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from reference_qwen import tiny_checkpoint

from omni_stream.errors import InvalidRequestError, UnknownVoiceError, UnsupportedTaskError
from omni_stream.models.qwen3_tts.checkpoint import load_lm
from omni_stream.models.qwen3_tts.config import load_config
from omni_stream.models.qwen3_tts.family import speech_info
from omni_stream.models.qwen3_tts.prompt import build_prompt, embed_prompt
from omni_stream.models.qwen3_tts.tokenizer import TextTokenizer
from omni_stream.requests import SpeechRequest, TaskType, VoicePrompt
from omni_stream.validation.speech import resolve_speech


def _load(tmp_path_factory, kind, size="0.6b"):
    path = tiny_checkpoint(tmp_path_factory, kind, size)
    cfg = load_config(path)
    return cfg, TextTokenizer(path, cfg.talker.text_vocab_size), path


@pytest.fixture(scope="module")
def cv(tmp_path_factory):
    return _load(tmp_path_factory, "custom_voice")


@pytest.fixture(scope="module")
def vd(tmp_path_factory):
    return _load(tmp_path_factory, "voice_design", "1.7b")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return _load(tmp_path_factory, "base")


def _prompt(model, **kw):
    """The prompt of a request as the engine hands it to the family: resolved against the checkpoint first."""
    cfg, tok, path = model
    request = resolve_speech(speech_info(cfg, path.name, 24000, 4096), None, SpeechRequest(**kw))
    return build_prompt(request, cfg, tok)


def _err(model, exc_type, **kw):
    with pytest.raises(exc_type) as info:
        _prompt(model, **kw)
    return info.value


def test_tokenizer_has_real_special_ids(cv) -> None:
    _, tok, _ = cv
    ids = tok.encode("<|im_start|>assistant\nHello world.<|im_end|>\n<|im_start|>user\n")
    assert ids[:3] == [151644, 77091, 198] and ids[-3:] == [151644, 872, 198]
    assert 151645 in ids
    assert tok.encode("<|tts_pad|><|tts_bos|><|tts_eos|><|endoftext|>") == [151671, 151672, 151673, 151643]
    assert max(tok.encode("Ordinary text, 你好, émoji 🎵!")) < 151643


def test_wrong_task_for_checkpoint(cv, vd) -> None:
    e = _err(cv, UnsupportedTaskError, text="hi", voice="ryan", task_type=TaskType.VOICE_DESIGN)
    assert e.param == "task_type" and "CustomVoice" in e.message
    e = _err(vd, UnsupportedTaskError, text="hi", instructions="x", task_type=TaskType.BASE)
    assert e.param == "task_type"


def test_an_unknown_voice_lists_the_valid_ones_and_no_voice_is_the_first(cv) -> None:
    e = _err(cv, UnknownVoiceError, text="hi", voice="alloy")
    assert e.param == "voice" and e.message.startswith("Invalid voice 'alloy'. Supported: ")
    assert "ryan" in e.message and "vivian" in e.message
    assert _prompt(cv, text="hi").speaker_id == _prompt(cv, text="hi", voice=cv[0].speakers[0]).speaker_id


def test_unknown_language_lists_languages(cv) -> None:
    e = _err(cv, InvalidRequestError, text="hi", voice="ryan", language="Klingon")
    assert e.param == "language" and "English" in e.message and "Auto" in e.message
    assert "dialect" not in e.message.lower()  # dialects are selected through speakers, not requested
    _err(cv, InvalidRequestError, text="hi", voice="ryan", language="beijing_dialect")


def test_voice_design_needs_instructions(vd) -> None:
    for instructions in (None, "   "):
        e = _err(vd, InvalidRequestError, text="hi", instructions=instructions)
        assert e.param == "instructions"


def test_base_needs_a_reference(base) -> None:
    cfg = base[0]
    e = _err(base, InvalidRequestError, text="hi")
    assert e.param == "ref_audio"
    xv = np.zeros(cfg.talker.decoder.hidden_size, np.float32)
    codes = np.zeros((5, 16), np.int64)
    e = _err(base, InvalidRequestError, text="hi", voice_prompt=VoicePrompt(x_vector=xv, ref_codes=codes))
    assert e.param == "ref_text"
    e = _err(base, InvalidRequestError, text="hi", voice_prompt=VoicePrompt(x_vector=np.zeros(3, np.float32)))
    assert e.param == "speaker_embedding" and f"has {cfg.talker.decoder.hidden_size}" in e.message
    bad_codes = VoicePrompt(x_vector=xv, ref_codes=np.full((5, 16), 4096), ref_text="hi")
    assert _err(base, InvalidRequestError, text="hi", voice_prompt=bad_codes).param == "voice_prompt"
    bad_shape = VoicePrompt(x_vector=xv, ref_codes=np.zeros((5, 8), np.int64), ref_text="hi")
    assert _err(base, InvalidRequestError, text="hi", voice_prompt=bad_shape).param == "voice_prompt"
    # x-vector-only mode needs neither codes nor transcript
    p = _prompt(base, text="hi", voice_prompt=VoicePrompt(x_vector=xv), x_vector_only_mode=True)
    assert not p.icl and p.x_vector is not None


def test_layouts_follow_the_reference_wrapper_defaults(cv, vd, base, tmp_path_factory) -> None:
    p = build_prompt(SpeechRequest(text="Hello.", voice="RYAN", language="english"), *cv[:2])
    assert p.non_streaming and p.speaker_id == 3061 and p.codec_tags == (2154, 2156, 2050, 2157)
    assert p.instruct_ids == ()  # no instructions given
    p = build_prompt(SpeechRequest(text="Hello.", voice="ryan", instructions="calm"), *cv[:2])
    assert p.instruct_ids == () and p.codec_tags == (2155, 2156, 2157)  # 0.6B drops instructions; auto: nothink
    p = build_prompt(SpeechRequest(text="Hello.", voice="dylan"), *cv[:2])
    assert p.codec_tags == (2154, 2156, 2074, 2157)  # auto + dialect speaker -> beijing_dialect
    p = build_prompt(SpeechRequest(text="Hello.", instructions="calm"), *vd[:2])
    assert p.non_streaming and p.instruct_ids[:3] == (151644, 872, 198) and p.speaker_id is None
    xv = np.zeros(base[0].talker.decoder.hidden_size, np.float32)
    p = build_prompt(SpeechRequest(text="Hello.", voice_prompt=VoicePrompt(x_vector=xv)), *base[:2])
    assert not p.non_streaming


def test_prompt_lengths_match_the_embedding(cv, base) -> None:
    lm = load_lm(cv[2], dtype=torch.float32)
    p = build_prompt(SpeechRequest(text="Hello world, this is a test.", voice="ryan", language="English"), *cv[:2],
                     non_streaming=False)  # fmt: skip
    prefill, trailing = embed_prompt(lm.talker, cv[0], p)
    assert p.prefill_len == prefill.shape[0] == 3 + 6 + 1  # the example in QWEN3_TTS.md section 1.3
    assert p.trailing_len == trailing.shape[0] == len(p.text_ids)
    lm = load_lm(base[2], dtype=torch.float32)
    xv = np.ones(base[0].talker.decoder.hidden_size, np.float32)
    for n_ref in (2, 40):
        vp = VoicePrompt(x_vector=xv, ref_codes=np.zeros((n_ref, 16), np.int64), ref_text="Good.")
        for ns in (False, True):
            p = build_prompt(SpeechRequest(text="This is a test.", voice_prompt=vp), *base[:2], non_streaming=ns)
            prefill, trailing = embed_prompt(lm.talker, base[0], p)
            assert (p.prefill_len, p.trailing_len) == (prefill.shape[0], trailing.shape[0]), (n_ref, ns)


def test_unset_sampling_takes_the_checkpoint_defaults(cv) -> None:
    from omni_stream.models.qwen3_tts.config import load_generation_defaults
    from omni_stream.models.qwen3_tts.prompt import prepare_request
    from omni_stream.requests import SamplingParams

    cfg, tok, path = cv
    gen = load_generation_defaults(path)
    r = prepare_request(SpeechRequest(text="Hello.", voice="ryan"), cfg, tok, defaults=gen)
    assert r.sampling == SamplingParams(do_sample=True, temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05)
    assert r.subtalker_sampling == SamplingParams(do_sample=True, temperature=0.9, top_k=50, top_p=1.0)
    mine = SamplingParams(do_sample=False, top_k=0)
    assert prepare_request(SpeechRequest(text="Hello.", voice="ryan", sampling=mine), cfg, tok).sampling == mine


def test_the_checkpoint_bounds_the_default_frame_budget_and_a_request_its_own(cv) -> None:
    """``generation_config.json``'s ``max_new_tokens`` caps what a request that names no bound generates (as the
    reference's generate() defaults to it); a request's own ``max_new_tokens`` is kept as asked."""
    from omni_stream.models.qwen3_tts.config import GenerationDefaults
    from omni_stream.models.qwen3_tts.prompt import prepare_request
    from omni_stream.speech.limits import frame_budget

    cfg, tok, _ = cv
    text = "Hello there, a sentence of some length."
    assert prepare_request(SpeechRequest(text=text), cfg, tok).max_new_tokens == frame_budget(text)
    capped = GenerationDefaults(max_new_tokens=7)
    assert prepare_request(SpeechRequest(text=text), cfg, tok, defaults=capped).max_new_tokens == 7
    asked = SpeechRequest(text=text, max_new_tokens=30)
    assert prepare_request(asked, cfg, tok, defaults=capped).max_new_tokens == 30
    roomy = GenerationDefaults(max_new_tokens=8192)
    assert prepare_request(SpeechRequest(text=text), cfg, tok, defaults=roomy).max_new_tokens == frame_budget(text)


def _prompts_of_every_layout(cv, base) -> list[tuple[tuple, list]]:
    """CustomVoice prompts (speaker ids, a dialect, instructions) and Base ones (x-vector alone, in-context with
    short and long references), each streaming and not."""
    cfg, tok, _ = cv
    spoken = [
        SpeechRequest(text="Hello world, this is a test.", voice="ryan", language="English"),
        SpeechRequest(text="Short.", voice="dylan"),
        SpeechRequest(text="Calm now.", voice="ryan", instructions="calm"),
    ]
    out = [(cv, [build_prompt(r, cfg, tok, non_streaming=ns) for r in spoken for ns in (False, True)])]
    cfg, tok, _ = base
    xv = np.linspace(-1, 1, cfg.talker.decoder.hidden_size, dtype=np.float32)
    voices = [VoicePrompt(x_vector=xv)] + [
        VoicePrompt(x_vector=xv, ref_codes=np.arange(n * 16).reshape(n, 16) % 50, ref_text="Good.") for n in (2, 40)
    ]
    cloned = [SpeechRequest(text="A cloned voice.", voice_prompt=vp) for vp in voices]
    out.append((base, [build_prompt(r, cfg, tok, non_streaming=ns) for r in cloned for ns in (False, True)]))
    return out


def test_prompts_embedded_together_equal_each_embedded_alone(cv, base) -> None:
    from omni_stream.models.qwen3_tts.prompt import embed_prompts, prompt_rows

    for (cfg, _, path), prompts in _prompts_of_every_layout(cv, base):
        lm = load_lm(path, dtype=torch.float32)
        hidden = cfg.talker.decoder.hidden_size
        together = embed_prompts(lm.talker, cfg, prompts)
        for p, (x, t) in zip(prompts, together, strict=True):
            alone_x, alone_t = embed_prompt(lm.talker, cfg, p)
            rows = prompt_rows(cfg, p)
            assert x.shape == alone_x.shape == (p.prefill_len, hidden) == (len(rows.text), hidden)
            assert t.shape == alone_t.shape == (p.trailing_len, hidden) == (len(rows.trailing), hidden)
            # the text projection over more rows at once may round differently, never by more than that
            assert torch.allclose(x, alone_x, rtol=0, atol=1e-5) and torch.allclose(t, alone_t, rtol=0, atol=1e-5)
            # every position sums at most two embeddings (x + 0 == x keeps those sums exact)
            assert all(sum(v >= 0 for v in col) <= 2 for col in zip(rows.text, rows.codec, rows.extra, strict=True))


def test_prompts_embedded_together_cost_the_same_operations_however_many(cv) -> None:
    """One gather per table for every prompt's rows: the device operations of a step's embedding do not grow
    with its newcomers (speaker prompts: no per-prompt extra block)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from omni_stream.models.qwen3_tts.prompt import embed_prompts

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    cfg, tok, path = cv
    lm = load_lm(path, dtype=torch.float32)
    texts = ["Hello world, this is a test.", "Short.", "Another one.", "And more text here.", "Five.", "Six."]
    prompts = [build_prompt(SpeechRequest(text=t, voice="ryan"), cfg, tok) for t in texts]
    counts = []
    for k in (1, 2, len(prompts)):
        with Count() as mode:
            embed_prompts(lm.talker, cfg, prompts[:k])
        counts.append(sorted(op for op in mode.ops if "split" not in op))
    assert counts[0] == counts[1] == counts[2]
    assert sum("index.Tensor" in op for op in counts[0]) == 3  # text, codec and extra rows
